"""The handbook's scale chapters: per-device batches and LR rules, accumulation under a kill, restart scope,
and the 10x questions, each answered by runs that only `trainwreck handbook --full` makes.

Built like report/chapters.py (which appends SCALE_CHAPTERS to its CHAPTERS): every sentence is
`ev.s(...)`, every number `ev.q` (a report field) or `ev.derive` (a formula over quoted numbers), every
verdict or comparison a presumption, so a sentence its runs contradict is not rendered. The runs are
declared in harness/suites/handbook.py (PLANS and CASES). This module must not import chapters.py.
"""
from __future__ import annotations

import math

from trainwreck.report.claims import fact, verdict
from trainwreck.report.handbook import Chapter, Evidence, Paragraph

LR_RUNS = ("lr-none", "lr-linear", "lr-sqrt", "lr-linear-rewarm")
EXTRAPOLATE_TO = 40
"""Ranks the 2- and 4-rank measurements are extrapolated to: ten times the larger run."""
SLOW_RUNS = ("straggler", "slow-network", "slow-model")
LOCAL_SPREAD = 1.5
"""A slowdown is localized when the busiest rank's own work (data, forward, optimizer) is this many times the
least busy rank's; systemic when every rank's is within it."""
NETWORK_RATIO = 3.0
"""A slow network: every rank's backward at least this many times its own work."""


# ----- item 1: a fixed per-device batch across a world-size change -------------------------------


def _batch(ev: Evidence, run: str, attempt: int) -> tuple[str, float]:
    """The attempt's global batch, derived from its measured per-rank batch and its world size."""
    rb, w = ev.get(run, "attempts", attempt, "rank_batch"), ev.get(run, "attempts", attempt, "world_size")
    return ev.derive(f"{run}_global_batch_attempt_{attempt}", rb * w, "rank_batch * world_size",
                     {"rank_batch": rb, "world_size": w}, " samples"), rb * w


def _rule_sentence(ev: Evidence, run: str) -> object:
    rule = ev.get(run, "spec", "lr_scaling")
    tuned = ev.get(run, "spec", "global_batch")
    after = ev.get(run, "attempts", 1, "rank_batch") * ev.get(run, "attempts", 1, "world_size")
    ratio = after / tuned
    scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]
    formula = {"none": "1", "linear": "batch_after / batch_tuned", "sqrt": "sqrt(batch_after / batch_tuned)"}[rule]
    gold = ("loss", "golden")
    return ev.s(
        f"<code>{run}</code>, rule {ev.q(run, 'spec', 'lr_scaling')}: LR multiplier "
        + ev.derive(f"{run}_lr_multiplier", scale, formula, {"batch_after": after, "batch_tuned": tuned}, "×")
        + " on the 2-rank updates"
        + (f", reached over {ev.q(run, 'spec', 'lr_rewarmup')} updates of re-warmup from the 4-rank one"
           if ev.get(run, "spec").get("lr_rewarmup") else "")
        + f"; final loss {ev.q(run, 'loss', 'final')} against the golden run's "
        f"{ev.q(run, *gold, 'final')} at update {ev.q(run, *gold, 'final_step')}, a relative gap of "
        f"{ev.q(run, *gold, 'final_gap')} (largest {ev.q(run, *gold, 'max_gap')}, at update "
        f"{ev.q(run, *gold, 'max_gap_step')}); coverage {ev.q(run, 'verdicts', 'coverage', 'valid')}, continuity "
        f"{ev.q(run, 'verdicts', 'continuity', 'valid')}.",
        verdict("coverage", True, run=run), verdict("continuity", True, run=run))


def batch_and_lr(ev: Evidence) -> list[Paragraph]:
    run, cont = "lr-none", ("verdicts", "continuity", "counts")
    before, b0 = _batch(ev, run, 0)
    after, b1 = _batch(ev, run, 1)
    gaps = {r: abs(float(ev.get(r, "loss", "golden", "final_gap"))) for r in LR_RUNS}
    best = min(gaps, key=lambda r: gaps[r])
    return [[
        ev.s(f"Each rank keeps {ev.q(run, 'attempts', 0, 'rank_batch')} samples per update (configured "
             f"<code>rank_batch</code>), so the {ev.q(run, 'attempts', 0, 'world_size')}-rank job trained on "
             f"{before} per update and, after losing a node, the {ev.q(run, 'attempts', 1, 'world_size')}-rank job "
             f"on {after}: every update after the change averages "
             + ev.derive("batch_ratio_after_change", b1 / b0, "global_batch_after / global_batch_before",
                         {"global_batch_after": b1, "global_batch_before": b0}, "×")
             + " as many per-sample gradients, so each is noisier and, at the same LR, a larger step relative to "
               "the signal in it.",
             fact("verdicts.continuity.counts.global_batch_after_change", "==", b1, run=run),
             fact("verdicts.continuity.counts.global_batch_golden", "==", b0, run=run)),
        ev.s(f"The judge shows where the run stops being the golden run: it compared "
             f"{ev.q(run, *cont, 'golden_steps_checked')} updates before the change with the uninterrupted "
             f"{ev.q(run, 'attempts', 0, 'world_size')}-rank run and stopped at update "
             f"{ev.q(run, *cont, 'global_batch_changed_at_step')}, where the global batch went from "
             f"{ev.q(run, *cont, 'global_batch_golden')} to {ev.q(run, *cont, 'global_batch_after_change')}: from "
             "there on update k is another update than the golden run's update k, so only the loss can be compared.",
             verdict("continuity", True, run=run)),
    ], [
        ev.s(f"The LR ({ev.q(run, 'spec', 'lr')}) was tuned for {ev.q(run, 'spec', 'global_batch')} samples, after "
             f"a warmup of {ev.q(run, 'spec', 'warmup_steps')} updates; four runs with the same kill differ only in "
             "how the LR follows the new batch (the first update after the resume still uses the LR its checkpoint "
             "holds; the rule sets every later one):"),
    ], [
        *(_rule_sentence(ev, r) for r in LR_RUNS),
    ], [
        ev.s(f"Closest to the golden run at the end: <code>{best}</code>, "
             + ev.derive("closest_abs_final_gap", gaps[best], f"abs(loss.golden.final_gap of {best})",
                         {"final_gap": float(ev.get(best, "loss", "golden", "final_gap"))})
             + " off; these are single runs of a tiny model, so a gap of a few hundredths is within the noise of "
               "batches of 8, and the order of the rules can change with the seed."),
        ev.s("What the runs show is the mechanism: the world size changed the optimizer's batch, the judge noticed "
             "the change and no longer expects the digests to match, and the LR rule decides the size of every "
             "update after it; resuming on the same topology avoids the question."),
    ]]


# ----- item 4: gradient accumulation under a kill -------------------------------------------------


def accumulation(ev: Evidence) -> list[Paragraph]:
    run, bad = "accum", "ckpt_mid_window"
    cov, cont = ("verdicts", "coverage", "counts"), ("verdicts", "continuity", "counts")
    rb, k = ev.get(run, "attempts", 0, "rank_batch"), ev.get(run, "spec", "grad_accum")
    return [[
        ev.s(f"A step is one optimizer update after accumulation: each rank split its "
             f"{ev.q(run, 'attempts', 0, 'rank_batch')} samples into {ev.q(run, 'spec', 'grad_accum')} micro-batches "
             "of " + ev.derive("micro_batch", rb // k, "rank_batch / grad_accum", {"rank_batch": rb, "grad_accum": k},
                               " samples")
             + ", ran forward and backward on each under DDP's no_sync, and reduced the gradients once, on the "
             f"last; the lineage has {ev.q(run, *cov, 'lineage_steps')} updates for "
             f"{ev.q(run, 'spec', 'total_steps')} configured steps."),
        ev.s(f"The kill: {ev.q(run, 'faults', 0, 'detail')}, when "
             + ev.derive("micro_batches_accumulated", k - 1, "grad_accum - 1", {"grad_accum": k})
             + " micro-batches' gradients were accumulated and no update applied; the resume restored "
             f"{ev.q(run, 'attempts', 1, 'restored', 'checkpoint')} and redid {ev.q(run, 'totals', 'redo_steps')} "
             "update(s), starting the window over from its first micro-batch.",
             fact("faults.0.kind", "==", "kill", run=run)),
        ev.s(f"Nothing double-counted or dropped: {ev.q(run, *cov, 'duplicated_ids')} (epoch, id) pair(s) used "
             f"twice, {ev.q(run, *cov, 'ids_not_covered')} id(s) left uncovered, "
             f"{ev.q(run, *cov, 'golden_mismatched_steps')} update(s) off the golden run's batches (coverage "
             f"{ev.q(run, 'verdicts', 'coverage', 'valid')}), and {ev.q(run, *cont, 'golden_steps_checked')} updates "
             f"equal to the golden digests with {ev.q(run, *cont, 'violations')} violation(s) (continuity "
             f"{ev.q(run, 'verdicts', 'continuity', 'valid')}).",
             verdict("coverage", True, run=run), verdict("continuity", True, run=run)),
    ], [
        ev.s(f"<code>{bad}</code> (CAUGHT by coverage) counts micro-batches toward its checkpoint, so its save "
             "records a sampler position one micro-batch into the next window, whose gradient was never saved: "
             f"{ev.q(bad, *cov, 'ids_not_covered')} id(s) never trained on in their epoch, and "
             f"{ev.q(bad, *cov, 'golden_mismatched_steps')} update(s) whose batch differs from the golden run's.",
             verdict("coverage", False, run=bad)),
        ev.s(f"Continuity agrees: {ev.q(bad, *cont, 'violations')} update(s) off the golden digests, the first at "
             f"update {ev.q(bad, *cont, 'diverged_step')}, right after the exact restore of step "
             f"{ev.q(bad, *cont, 'diverged_after_exact_restore_step')}: the model was restored exactly, the data "
             "position was not.", verdict("continuity", False, run=bad)),
    ]]


# ----- item 3: rank (group) restart against a whole-job restart ----------------------------------


def restart_scope(ev: Evidence) -> list[Paragraph]:
    run = "restart-scope"
    if "skipped" in ev.reports[run]:
        return [[ev.s(f"Not measured here: {ev.q(run, 'skipped')}.", fact("skipped", "!=", None, run=run))]]
    g, j = ("rows", "group", "figures"), ("rows", "job", "figures")
    rg, rj = float(ev.get(run, *g, "recovery_s")), float(ev.get(run, *j, "recovery_s"))
    return [[
        ev.s("The same torchft job (two replica groups of one rank), the same kill of group 1, two restart scopes: "
             "the group restarts alone and heals from the live group, or the whole job stops and resumes from its "
             "newest checkpoint."),
        ev.s(f"Lost work: the group restart redid {ev.q(run, *g, 'updates_redone')} update(s), the job restart "
             f"{ev.q(run, *j, 'updates_redone')} (the updates since its last checkpoint)."),
        ev.s(f"Time from the kill to the next new update: {ev.q(run, *g, 'recovery_s', unit=' s')} for the group "
             f"restart against {ev.q(run, *j, 'recovery_s', unit=' s')} for the job restart ("
             + ev.derive("job_over_group_recovery", rj / rg, "job recovery_s / group recovery_s",
                         {"job": rj, "group": rg}, "×") + "); the survivor trained "
             f"{ev.q(run, *g, 'steps_alone')} update(s) alone meanwhile, and the whole jobs took "
             f"{ev.q(run, *g, 'wall_s', unit=' s')} and {ev.q(run, *j, 'wall_s', unit=' s')}.",
             fact("rows.group.figures.recovery_s", ">", 0, run=run)),
        ev.s(f"Both are judged: group restart {ev.q(run, 'rows', 'group', 'valid')}, job restart "
             f"{ev.q(run, 'rows', 'job', 'valid')}; the job restart replayed {ev.q(run, *j, 'replayed')} id(s) (the "
             f"redone updates' samples, used twice), the group restart {ev.q(run, *g, 'replayed')}.",
             fact("rows.group.valid", "!=", None, run=run)),
        ev.s(f"The restarted group healed from its live peer {ev.q(run, *g, 'heals')} time(s) and "
             f"{ev.q(run, *g, 'never_seen')} id(s) were never seen by the job: it trains on without the lost replica's "
             "share of the data, the price of not stopping the survivor.",
             fact("rows.group.figures.never_seen", ">", 0, run=run)),
        ev.s("The group restart is cheaper when a live peer holds the state, which a communicator-wide failure does "
             "not leave: then only the whole-job restart from the checkpoint remains.",
             fact("rows.group.figures.updates_redone", "<", ev.get(run, *j, "updates_redone"), run=run)),
    ]]


# ----- item 11: at 10x scale, against one rank, and a throughput drop ------------------------------


def _extrapolate(ev: Evidence, label: str, v2: float, v4: float, unit: str) -> tuple[str, float]:
    """The line through the 2- and 4-rank values, at EXTRAPOLATE_TO ranks; a value that did not grow from 2 to
    4 ranks is kept at its 4-rank value (a falling line would extrapolate to a negative time)."""
    v = max(v4, v4 + (v4 - v2) / 2 * (EXTRAPOLATE_TO - 4))
    return ev.derive(f"{label}_at_{EXTRAPOLATE_TO}", v, f"max(v4, v4 + (v4 - v2) / 2 * ({EXTRAPOLATE_TO} - 4))",
                     {"v2": v2, "v4": v4}, unit), v


def _comm_share(ev: Evidence, run: str) -> float:
    totals = ev.get(run, "phases", "ranks", 0, "totals")
    return (totals.get("backward", 0.0) + totals.get("sync", 0.0)) / max(sum(totals.values()), 1e-12)


def _own_spread(ev: Evidence, run: str) -> tuple[str, float]:
    own = [float(r["own_s"]) for r in ev.get(run, "phases", "ranks")]
    spread = max(own) / max(min(own), 1e-12)
    return ev.derive(f"{run}_own_work_spread", spread, "max(own_s) / min(own_s) over ranks",
                     {f"rank{i}": v for i, v in enumerate(own)}, "×"), spread


def _rank_phases(ev: Evidence, run: str) -> str:
    return "; ".join(
        f"rank {ev.q(run, 'phases', 'ranks', i, 'rank')}: data {ev.q(run, 'phases', 'ranks', i, 'totals', 'data', unit=' s')}, "
        f"forward {ev.q(run, 'phases', 'ranks', i, 'totals', 'forward', unit=' s')}, backward "
        f"{ev.q(run, 'phases', 'ranks', i, 'totals', 'backward', unit=' s')}"
        for i in range(len(ev.get(run, "phases", "ranks"))))


def _network_sentence(ev: Evidence) -> object:
    """Systemic and outside own work: on every rank backward (where the gradient all-reduce runs) outweighs all
    of the rank's own work by NETWORK_RATIO. A spread of own work is no test here: own work stays a few tens of
    milliseconds, so its ratio between ranks is noise."""
    run, ranks = "slow-network", ev.get("slow-network", "phases", "ranks")
    ratios = [float(r["totals"]["backward"]) / max(float(r["own_s"]), 1e-12) for r in ranks]
    return ev.s(
        "A slow network is systemic and outside own work: on every rank backward, where the gradient all-reduce "
        "runs, outweighs all of the rank's own work at least "
        + ev.derive("network_backward_over_own_min", min(ratios), "min over ranks of backward / own_s",
                    {f"rank{i}": v for i, v in enumerate(ratios)}, "×")
        + f" (the spread of own work between ranks, {_own_spread(ev, run)[0]}, is a ratio of a few tens of "
          "milliseconds, so it tells nothing here).",
        *(fact(f"phases.ranks.{i}.totals.backward", ">", NETWORK_RATIO * float(r["own_s"]), run=run)
          for i, r in enumerate(ranks)))


def at_scale(ev: Evidence) -> list[Paragraph]:
    w2, w4 = "scale-w2", "scale-w4"
    step2, step4 = (float(ev.get(r, "phases", "median_step_s")) for r in (w2, w4))
    save2, save4 = (float(ev.get(r, "phases", "save_seconds", "mean")) for r in (w2, w4))
    share2, share4 = _comm_share(ev, w2), _comm_share(ev, w4)
    step_x, step_v = _extrapolate(ev, "median_step_s", step2, step4, " s")
    save_x, save_v = _extrapolate(ev, "save_s", save2, save4, " s")
    timeout = float(ev.get("hang-sigstop", "spec", "hang_timeout_s"))
    growth = {"step time": step_v / step4, "checkpoint save": save_v / save4}
    first = max(growth, key=lambda k: growth[k])
    b1 = ev.get("scale-w1", "attempts", 0, "rank_batch") * ev.get("scale-w1", "attempts", 0, "world_size")
    b4 = ev.get(w4, "attempts", 0, "rank_batch") * ev.get(w4, "attempts", 0, "world_size")
    ratio = b4 / b1
    return [[
        ev.s(f"Measured at 2 and 4 ranks of {ev.q(w2, 'attempts', 0, 'rank_batch')} samples each: the median update "
             f"took {ev.q(w2, 'phases', 'median_step_s', unit=' s')} and {ev.q(w4, 'phases', 'median_step_s', unit=' s')}, "
             f"a save {ev.q(w2, 'phases', 'save_seconds', 'mean', unit=' s')} and "
             f"{ev.q(w4, 'phases', 'save_seconds', 'mean', unit=' s')}, and rank 0 spent "
             + ev.derive("comm_share_w2_percent", 100 * share2, "100 * (backward + sync) / all phases, rank 0 (scale-w2)",
                         {}, " %") + " and "
             + ev.derive("comm_share_w4_percent", 100 * share4, "100 * (backward + sync) / all phases, rank 0 (scale-w4)",
                         {}, " %") + " of its time in backward and the loss sync, where every collective waits."),
        ev.s("The save did not grow from 2 to 4 ranks: with DDP rank 0 writes the same full state at any world size, "
             "so the extrapolation keeps it at its 4-rank value.",
             fact("phases.save_seconds.mean", "<=", save2, run=w4)),
        ev.s(f"Extrapolated linearly to {EXTRAPOLATE_TO} ranks: an update of {step_x} and a save of {save_x}; the "
             f"{first} grows fastest ("
             + ev.derive("fastest_growth", growth[first], "value at 40 / value at 4", {"growth": growth[first]}, "×")
             + " its 4-rank value)."),
        ev.s(f"Both world sizes share this machine's {ev.q(w4, 'spec', 'host', 'cpus')} cores, fewer than the 4 ranks, "
             "so the slope includes CPU contention a real cluster would not have: it is an upper bound, not a "
             "forecast.", fact("spec.host.cpus", "<", 4, run=w4)),
        ev.s(f"The 4 ranks had {ev.q(w4, 'spec', 'host', 'cpus')} cores, one each at least, so the slope is the "
             "job's own; on a cluster the network between nodes, absent here, adds to it.",
             fact("spec.host.cpus", ">=", 4, run=w4)),
        ev.s(f"The hang watchdog's timeout is fixed ({ev.q('hang-sigstop', 'spec', 'hang_timeout_s', unit=' s')}, "
             f"configured; it found the stopped rank after {ev.q('hang-sigstop', 'hangs', 0, 'detected_after_s', unit=' s')}): "
             "at the extrapolated update time it is "
             + ev.derive("timeout_in_steps_at_40", timeout / max(step_v, 1e-12), "hang_timeout_s / median_step_s at 40",
                         {"hang_timeout_s": timeout, "median_step_s": step_v})
             + " updates, so what breaks first is whichever reaches the timeout first: a save or an update that "
               "grows past it is flagged as a hang.", fact("hangs.0.detected_after_s", ">=", timeout, run="hang-sigstop")),
        ev.s("At that rate a healthy update would outlast the timeout: extrapolated to 40 ranks on this machine, the "
             "watchdog breaks first, and its timeout must scale with the measured step time.",
             fact("spec.hang_timeout_s", "<", step_v, run="hang-sigstop")),
    ], [
        ev.s(f"Against one rank at the same per-device batch and LR: after {ev.q('scale-w1', 'spec', 'total_steps')} "
             f"updates the 1-rank run ({ev.q('scale-w1', 'attempts', 0, 'rank_batch')} samples per update) ended at "
             f"loss {ev.q('scale-w1', 'loss', 'final')}, the 4-rank run ("
             + ev.derive("w4_global_batch", b4, "rank_batch * world_size (scale-w4)", {"global_batch": b4}, " samples")
             + f") at {ev.q(w4, 'loss', 'final')}, the 2-rank run at {ev.q(w2, 'loss', 'final')}."),
        ev.s("The 4-rank run is not worse per update: it averages "
             + ev.derive("w4_over_w1_samples", ratio, "global batch (scale-w4) / global batch (scale-w1)",
                         {"w4": b4, "w1": b1}, "×")
             + " the samples, so its gradient is less noisy; per sample seen it had "
             + ev.derive("w4_updates_per_sample_vs_w1", 1 / ratio, "1 / w4_over_w1_samples", {"ratio": ratio}, "×")
             + " the updates, which is why the same LR is not the same training when the world size changes "
               "(chapter batch).",
             fact("loss.final", "<=", float(ev.get("scale-w1", "loss", "final")), run=w4)),
        ev.s("Here the 4-rank run ended above the 1-rank run: at this LR more samples per update did not "
             "make up for the updates it trained per sample seen, which is how \"it converges worse than on one "
             "GPU\" looks when the per-device batch, not the global batch, is held fixed.",
             fact("loss.final", ">", float(ev.get("scale-w1", "loss", "final")), run=w4)),
    ], [
        ev.s("A 30 % throughput drop, three causes, the per-rank phases of each run:"),
    ], [
        *(ev.s(f"<code>{r}</code>: {_rank_phases(ev, r)}; own work (data, forward, optimizer) spread "
               f"{_own_spread(ev, r)[0]}, rank 0's mean update "
               f"{ev.q(r, 'phases', 'ranks', 0, 'mean_step_s', unit=' s')} against a median of "
               f"{ev.q(r, 'phases', 'median_step_s', unit=' s')}.") for r in SLOW_RUNS),
    ], [
        ev.s("A straggler is localized: one rank's own work grows, the others wait for it in backward; "
             f"<code>straggler</code>'s spread of own work is {_own_spread(ev, 'straggler')[0]}, over the "
             f"{LOCAL_SPREAD}× a localized slowdown shows.",
             fact("phases.slowest_rank", "!=", None, run="straggler")) if _own_spread(ev, "straggler")[1] > LOCAL_SPREAD
        else ev.s("The straggler's own-work spread stayed under the threshold here, so this run does not tell it "
                  "apart by phases.", fact("phases.slowest_rank", "==", None, run="straggler")),
        _network_sentence(ev),
        ev.s("A regression in the model is systemic and inside own work: every rank's forward grows alike (spread "
             f"{_own_spread(ev, 'slow-model')[0]}), while backward only pays the collective's usual wait.",
             fact("phases.ranks.0.totals.forward", ">", float(ev.get("slow-model", "phases", "ranks", 0, "totals",
                                                                      "backward")), run="slow-model"))
        if _own_spread(ev, "slow-model")[1] <= LOCAL_SPREAD else
        ev.s("The slowed model's own-work spread went over the threshold here.", fact("phases", "!=", None, run="slow-model")),
    ]]


STALE_RUN = "stale-gradients"


def stale_updates(ev: Evidence) -> list[Paragraph]:
    # Sentences are recorded in the order they are made, which must be the page's order.
    run, sync = STALE_RUN, float(ev.get(STALE_RUN, "final_loss_sync"))
    ks = [str(k) for k in ev.get(run, "staleness")]
    worst = max(ks, key=lambda k: float(ev.get(run, "stale", k, "final_gap")))
    intro = [
        ev.s("Making the training loop asynchronous means letting a worker apply a gradient computed on parameters "
             "its peers have since moved (a parameter server, Hogwild, local SGD): the collective no longer gates "
             "the step, and each gradient arrives k updates stale. Synchronous data parallelism (DDP, FSDP) pays an "
             "all-reduce per step to keep k = 0, and is why its replicas can be compared digest for digest."),
        ev.s(f"Measured by benchmarks/staleness.py on the tiny reference MLP in one process ({ev.q(run, 'steps')} "
             f"updates of {ev.q(run, 'global_batch')} samples, {ev.q(run, 'optimizer')}, lr {ev.q(run, 'lr')}, "
             "configured; the same samples in the same order, so staleness is the only difference): the synchronous "
             f"run ends at loss {ev.q(run, 'final_loss_sync')}."),
    ]
    rows = [ev.s(f"{k} update(s) stale: final loss {ev.q(run, 'stale', k, 'final_loss')}, "
                 + ev.derive(f"stale_{k}_final_gap_percent", 100 * float(ev.get(run, "stale", k, "final_gap")) / sync,
                             "100 * final_gap / final_loss_sync",
                             {"final_gap": float(ev.get(run, "stale", k, "final_gap")), "final_loss_sync": sync}, " %")
                 + f" above synchronous, and {ev.q(run, 'stale', k, 'max_gap')} above it at the worst update.")
            for k in ks]
    start = float(ev.get(run, "loss_sync", 0))
    stuck = float(ev.get(run, "stale", worst, "final_loss")) >= start
    return [intro, rows, [
        ev.s(f"Here the costliest delay was {worst} update(s) ("
             + ev.derive("stale_worst_final_gap", float(ev.get(run, "stale", worst, "final_gap")), "final_gap", {})
             + " of loss at the end)"
             + (f", which ended above the loss both runs started from ({ev.q(run, 'loss_sync', 0)}): at a learning "
                "rate that suits synchronous SGD that much delay kept training from converging at all"
                if stuck else ": training still converged, more slowly")
             + ". Asynchronous designs therefore lower the rate or bound the staleness, and the time saved on the "
               "collective is paid back in updates."),
    ]]


SCALE_CHAPTERS: tuple[Chapter, ...] = (
    Chapter("batch", "With a fixed per-device batch the world size changes the global batch: what happens to the "
            "optimizer, and which LR rule (none, linear, square root) keeps the run closest to the golden one?",
            LR_RUNS, batch_and_lr, tuple((r, "loss") for r in LR_RUNS), list_paragraphs=(2,), full=True),
    Chapter("accum", "What is a step under gradient accumulation, and does a kill mid-window double-count or drop "
            "micro-batches?", ("accum", "ckpt_mid_window"), accumulation,
            (("accum", "coverage"), ("ckpt_mid_window", "coverage")), full=True),
    Chapter("restart-scope", "What does a rank-level (elastic) restart save over a full-job restart?",
            ("restart-scope",), restart_scope, full=True),
    Chapter("scale", "What breaks first at 10x scale, does it converge worse than one rank, and is a 30 % "
            "throughput drop the network, a straggler or a regression?",
            ("scale-w1", "scale-w2", "scale-w4", "hang-sigstop", *SLOW_RUNS), at_scale,
            (("scale-w1", "loss"), ("scale-w4", "loss"), ("slow-network", "progress"), ("slow-model", "progress")),
            list_paragraphs=(3,), full=True),
    Chapter("stale", "Why not just make the training loop asynchronous: what do stale gradients cost?",
            (STALE_RUN,), stale_updates, list_paragraphs=(1,), full=True),
)
