"""Handbook chapters on operating a job: slowdowns with a period, and the monitoring baselines.

Each answer function follows report/chapters.py's rules: numbers only through `ev.q` (a
report field) or `ev.derive`, each sentence through `ev.s` with the verdicts and facts it presumes,
so a sentence the runs contradict is left off the page. The runs are declared in
harness/suites/handbook.py (CASES); the chapters are appended to CHAPTERS there.
"""
from __future__ import annotations

from trainwreck.report.claims import fact, verdict
from trainwreck.report.handbook import Evidence, Paragraph

PERIOD_QUESTION = "How do you debug a job that is slow only every 20 minutes: one rank or every rank?"
NEIGHBOUR, STORAGE, WRITER = "noisy-neighbour", "slow-storage", "disk-contention"


def _series(ev: Evidence, run: str, where: str) -> int:
    """The index of the run's slowdown series whose extra time went to `where` (0 if none did: the
    sentences that quote it then presume what it lacks and are left out)."""
    series = ev.get(run, "slowdowns", "series")
    return next((i for i, s in enumerate(series) if s["where"] == where), 0)


def _per_rank(ev: Evidence, run: str, i: int, *groups: str) -> str:
    rows = ev.get(run, "slowdowns", "series", i, "per_rank")
    names = {"own": "own work", "wait": "waiting in backward and sync", "checkpoint": "checkpoint"}
    return "; ".join(f"rank {ev.q(run, 'slowdowns', 'series', i, 'per_rank', j, 'rank')}: "
                     + ", ".join(f"{names[g]} +{ev.q(run, 'slowdowns', 'series', i, 'per_rank', j, g, unit=' s')}"
                                 for g in groups)
                     for j in range(len(rows)))


def _period(ev: Evidence, run: str, i: int) -> str:
    path = ("slowdowns", "series", i)
    return (f"{ev.q(run, *path, 'episodes')} episodes of updates slower than "
            f"{ev.q(run, 'slowdowns', 'slow_factor')}× the updates around them started at updates "
            f"{ev.q(run, *path, 'first_steps')}: every {ev.q(run, *path, 'period_steps')} updates in "
            f"{ev.q(run, *path, 'regular_gaps')} of {ev.q(run, *path, 'gaps')} gaps, "
            f"{ev.q(run, *path, 'period_s', unit=' s')} apart")


def periodic_slowdowns(ev: Evidence) -> list[Paragraph]:
    n, s = _series(ev, NEIGHBOUR, "update"), _series(ev, STORAGE, "checkpoint")
    fault = ("plan", 0)
    slow_rank = ev.get(NEIGHBOUR, *fault, "rank")
    saves = [sv["step"] + 1 for sv in ev.get(STORAGE, "saves") if sv["step"] < ev.get(STORAGE, "spec", "total_steps")]
    localized = (fact(f"slowdowns.series.{n}.scope", "==", "localized", run=NEIGHBOUR),
                 fact(f"slowdowns.series.{n}.ranks", "==", [slow_rank], run=NEIGHBOUR))
    systemic = (fact(f"slowdowns.series.{s}.scope", "==", "systemic", run=STORAGE),
                fact(f"slowdowns.series.{s}.where", "==", "checkpoint", run=STORAGE))
    return [[
        ev.s("Line the slow updates up and look for a period, then compare each rank's phase timings at those "
             "updates: extra time in one rank's own work (data, forward, optimizer) points at that rank's host, "
             "extra time in every rank's checkpoint phase at what the ranks share."),
    ], [
        ev.s(f"In <code>{NEIGHBOUR}</code> a busy process took {ev.q(NEIGHBOUR, *fault, 'share')} of rank "
             f"{ev.q(NEIGHBOUR, *fault, 'rank')}'s core for {ev.q(NEIGHBOUR, *fault, 'steps')} update(s) every "
             f"{ev.q(NEIGHBOUR, *fault, 'every')} from update {ev.q(NEIGHBOUR, *fault, 'step')} (the plan).",
             fact("faults.0.kind", "==", "noisy_neighbour", run=NEIGHBOUR)),
        ev.s(f"From the step timings alone, {_period(ev, NEIGHBOUR, n)}: the period the plan set.",
             fact(f"slowdowns.series.{n}.where", "==", "update", run=NEIGHBOUR),
             fact(f"slowdowns.series.{n}.period_steps", "==", ev.get(NEIGHBOUR, *fault, "every"), run=NEIGHBOUR)),
        ev.s(f"Over those episodes {_per_rank(ev, NEIGHBOUR, n, 'own', 'wait')}: only rank "
             f"{ev.q(NEIGHBOUR, 'slowdowns', 'series', n, 'ranks')} did more of its own work, the others waited for "
             "it in the all-reduce, so the slowdown is localized: look at that rank's host (a neighbour, "
             "throttling), not at the network or the storage.", *localized),
        ev.s(f"Slow is not hung: the job finished in {ev.q(NEIGHBOUR, 'totals', 'attempts')} attempt(s), hang "
             f"verdict {ev.q(NEIGHBOUR, 'verdicts', 'hang', 'valid')}.", verdict("hang", True, run=NEIGHBOUR),
             fact("hangs", "==", [], run=NEIGHBOUR)),
    ], [
        ev.s(f"In <code>{STORAGE}</code> every checkpoint write stalled {ev.q(STORAGE, *fault, 'seconds', unit=' s')}."),
        ev.s(f"{_period(ev, STORAGE, s)}; that is the checkpoint interval, "
             f"{ev.q(STORAGE, 'spec', 'ckpt_interval')} updates (configured), and each slow update is the one "
             "after a save, whose step timing carries that save's checkpoint phase.",
             fact(f"slowdowns.series.{s}.period_steps", "==", ev.get(STORAGE, "spec", "ckpt_interval"), run=STORAGE),
             fact(f"slowdowns.series.{s}.first_steps", "==", saves, run=STORAGE)),
        ev.s(f"Over those episodes {_per_rank(ev, STORAGE, s, 'checkpoint', 'own')}: every rank's checkpoint time "
             "grew alike (rank 0 writes, the others wait at the save's barrier), so the slowdown is systemic: "
             "look at the storage and whatever else writes to it on that period.", *systemic),
    ], _contention(ev), [
        ev.s("The period says what repeats (a save every few updates, or a timer outside the job); the per-rank "
             "phases say where: one rank's own work is that host, every rank's checkpoint phase is shared storage.",
             *localized, *systemic),
    ]]


def _contention(ev: Evidence) -> Paragraph:
    """The run where something else writes to the checkpoints' disk: a period that is not the saves'."""
    w, fault = _series(ev, WRITER, "checkpoint"), ("plan", 0)
    interval = ev.get(WRITER, "spec", "ckpt_interval")
    every = ev.get(WRITER, *fault, "every")
    return [
        ev.s(f"In <code>{WRITER}</code> the job saved every {ev.q(WRITER, 'spec', 'ckpt_interval')} update(s) "
             f"(configured), and a background process rewrote {ev.q(WRITER, *fault, 'block_mb')} MB blocks "
             f"of a scratch file on the same disk, bypassing the page cache, for {ev.q(WRITER, *fault, 'steps')} "
             f"update(s) every {ev.q(WRITER, *fault, 'every')} from update {ev.q(WRITER, *fault, 'step')} (the plan), "
             "as an upload staging its copy or another job sharing the disk does.",
             fact("faults.0.kind", "==", "disk_contention", run=WRITER),
             fact("faults.0.detail", "contains", "(O_DIRECT)", run=WRITER)),
        ev.s(f"{_period(ev, WRITER, w)}: the writer's period, not the saves' (every {interval} update(s)), so what "
             "repeats is outside the job.",
             fact(f"slowdowns.series.{w}.where", "==", "checkpoint", run=WRITER),
             fact(f"slowdowns.series.{w}.period_steps", "==", every, run=WRITER),
             fact(f"slowdowns.series.{w}.period_steps", "!=", interval, run=WRITER)),
        ev.s(f"Over those episodes {_per_rank(ev, WRITER, w, 'checkpoint')}: every rank's checkpoint phase grew "
             "alike, so the slowdown is systemic; with the period matching no save interval, look for what else "
             "writes to that disk on that period.",
             fact(f"slowdowns.series.{w}.scope", "==", "systemic", run=WRITER),
             fact(f"slowdowns.series.{w}.where", "==", "checkpoint", run=WRITER)),
    ]


METRICS_QUESTION = "Which numbers do you export to monitoring, and what happens to their baselines when the world size changes?"
RESIZED = "shrink-world"


def monitoring(ev: Evidence) -> list[Paragraph]:
    m = ("metrics",)
    before, after = ev.get(RESIZED, *m, "attempts", 0), ev.get(RESIZED, *m, "attempts", 1)
    rate = ev.derive("rate_ratio", after["samples_per_s"] / before["samples_per_s"], "samples_per_s[1] / samples_per_s[0]",
                     {"samples_per_s[1]": after["samples_per_s"], "samples_per_s[0]": before["samples_per_s"]}, "×")
    per_rank = ev.derive("rank_rate_ratio", after["samples_per_s_per_rank"] / before["samples_per_s_per_rank"],
                         "samples_per_s_per_rank[1] / samples_per_s_per_rank[0]",
                         {"samples_per_s_per_rank[1]": after["samples_per_s_per_rank"],
                          "samples_per_s_per_rank[0]": before["samples_per_s_per_rank"]}, "×")

    def attempt(i: int) -> str:
        a = (*m, "attempts", i)
        return (f"attempt {ev.q(RESIZED, *a, 'attempt')} on {ev.q(RESIZED, *a, 'world_size')} ranks trained "
                f"{ev.q(RESIZED, *a, 'samples_per_s')} samples/s ({ev.q(RESIZED, *a, 'samples_per_s_per_rank')} per "
                f"rank, {ev.q(RESIZED, *a, 'step_s', unit=' s')} per update over {ev.q(RESIZED, *a, 'updates')} updates)")

    return [[
        ev.s("Three numbers, one per question an operator asks: forward progress (samples/s: is it training?), the "
             "age of the newest committed checkpoint (how much work would a failure cost?) and the restart count "
             "(is it recovering or looping?). <code>trainwreck report RUN_DIR --metrics</code> writes them to "
             "<code>report/metrics.prom</code> as OpenMetrics text with prometheus_client, progress labelled by "
             "attempt and world size."),
    ], [
        ev.s(f"In <code>{RESIZED}</code> {attempt(0)}; after losing a node, {attempt(1)}.",
             fact("metrics.attempts.0.world_size", "!=", after["world_size"], run=RESIZED)),
        ev.s(f"The global batch stayed {ev.q(RESIZED, 'spec', 'global_batch')} samples (configured), so each rank's "
             f"share of an update grew from {ev.q(RESIZED, 'attempts', 0, 'rank_batch')} to "
             f"{ev.q(RESIZED, 'attempts', 1, 'rank_batch')} samples: the job's samples/s moved by {rate} and each "
             f"rank's by {per_rank}.", fact("spec.world_sizes.0", "!=", ev.get(RESIZED, "spec", "world_sizes", -1),
                                            run=RESIZED)),
        ev.s(f"Attempt 0 ran {ev.q(RESIZED, *m, 'attempts', 0, 'world_size')} ranks on this machine's "
             f"{ev.q(RESIZED, 'spec', 'host', 'cpus')} cores: more ranks than cores, so its rates measure how the "
             "ranks shared the cores, not what the job does with a core per rank, and part of the change after the "
             "resize is the contention ending, not the job.",
             fact("spec.host.cpus", "<", before["world_size"], run=RESIZED)),
        ev.s("A throughput baseline learned at one world size does not hold at another: key it by the world_size "
             "label and learn it again after a resize, or the resize itself reads as a change in the job's health.",
             fact("metrics.attempts.1.world_size", "!=", before["world_size"], run=RESIZED)),
    ], [
        ev.s(f"Its restart counter reads {ev.q(RESIZED, *m, 'restarts')}, and the checkpoint age peaked at "
             f"{ev.q(RESIZED, *m, 'checkpoint_age_max_s', unit=' s')} (at the run's end "
             f"{ev.q(RESIZED, *m, 'checkpoint_age_end_s', unit=' s')}): the failure cost the work since the newest "
             "commit, and the counter moved once.", fact("metrics.restarts", "==", 1, run=RESIZED),
             fact("totals.attempts", "==", 2, run=RESIZED)),
    ]]


LOADER_QUESTION = ("A DataLoader with worker processes and prefetch is killed mid-epoch: which samples in flight "
                   "are lost or replayed?")
LOADER = "loader-kill"


def data_loader(ev: Evidence) -> list[Paragraph]:
    get = lambda *p: ev.get(LOADER, *p)  # noqa: E731 - a local shorthand
    workers, prefetch, batch = get("workers"), get("prefetch_factor"), get("batch")
    ahead = ev.derive("workers_x_prefetch", workers * prefetch, "workers * prefetch_factor",
                      {"workers": workers, "prefetch_factor": prefetch})
    skipped = ev.derive("in_flight_samples", get("in_flight_batches") * batch, "in_flight_batches * batch",
                        {"in_flight_batches": get("in_flight_batches"), "batch": batch})
    pos = ("positions",)

    def outcome(name: str) -> str:
        return (f"lost {ev.q(LOADER, *pos, name, 'lost')} and replayed {ev.q(LOADER, *pos, name, 'replayed')} "
                "samples")

    out = [[
        ev.s(f"A torch DataLoader with {ev.q(LOADER, 'workers')} worker processes, each asked for "
             f"{ev.q(LOADER, 'prefetch_factor')} batches ahead, was SIGKILLed after its loop had consumed "
             f"{ev.q(LOADER, 'consumed_at_kill')} batches of {ev.q(LOADER, 'batch')} samples; by then its batch "
             f"sampler had handed {ev.q(LOADER, 'dispatched_at_kill')} to the workers: "
             f"{ev.q(LOADER, 'in_flight_batches')} batches ({ahead} = workers × prefetch) were in flight.",
             fact("in_flight_batches", "==", workers * prefetch, run=LOADER)),
    ], [
        ev.s(f"Resumed at batch {ev.q(LOADER, *pos, 'consumed', 'resumed_at_batch')}, the count the loop consumed, "
             f"the epoch {outcome('consumed')}: what was in flight died with the workers and was fetched again.",
             fact("positions.consumed.lost", "==", 0, run=LOADER),
             fact("positions.consumed.replayed", "==", 0, run=LOADER)),
        ev.s(f"Resumed at batch {ev.q(LOADER, *pos, 'dispatched', 'resumed_at_batch')}, the sampler's own position, "
             f"it {outcome('dispatched')}: the {skipped} samples in flight, skipped without an error, the omission "
             "the coverage invariant exists to catch.",
             fact("positions.dispatched.lost", "==", get("in_flight_batches") * batch, run=LOADER)),
    ]]
    if "stateful" in get("positions"):
        out.append([
            ev.s(f"torchdata's StatefulDataLoader ({ev.q(LOADER, 'torchdata')}) counts the batches it yielded, not "
                 f"the ones it dispatched: resumed from its state_dict it {outcome('stateful')}.",
                 fact("positions.stateful.lost", "==", 0, run=LOADER),
                 fact("positions.stateful.replayed", "==", 0, run=LOADER)),
        ])
    out.append([
        ev.s("So checkpoint the position the loop consumed, or a loader that tracks it, never the sampler object "
             "the workers pull ahead of.",
             fact("positions.consumed.lost", "==", 0, run=LOADER),
             fact("positions.dispatched.lost", ">", 0, run=LOADER)),
    ])
    return out
