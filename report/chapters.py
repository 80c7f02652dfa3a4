"""The handbook's chapters: each an interview question, its answer made of claims over the runs' reports.

A chapter is one `Chapter(...)` line in CHAPTERS plus an answer function that returns
paragraphs of sentences made with `ev.s(template, *presumes)`; numbers enter a template only
through `ev.q` (a report field) or `ev.derive` (a formula over quoted numbers). A sentence that
states a verdict or a fact presumes it (`verdict("coverage", False, run="sampler_not_saved")`),
so the page cannot say what its runs contradict. The runs themselves (case keys) are declared
in harness/suites/handbook.py.
"""
from __future__ import annotations

from html import escape
from typing import Any

from trainwreck.report.angles import GLOO_DEFAULT_TIMEOUT_S, MTBF_ASSUMED_S, daly_interval, young_interval
from trainwreck.report.chapters_parallel import PARALLEL_CHAPTERS
from trainwreck.report.chapters_pipeline import PIPELINE_CHAPTERS, bubble_sentence
from trainwreck.report.chapters_precision import PRECISION_CHAPTERS
from trainwreck.report.chapters_ops import (LOADER_QUESTION, METRICS_QUESTION, PERIOD_QUESTION, data_loader,
                                                   monitoring, periodic_slowdowns)
from trainwreck.report.chapters_scale import SCALE_CHAPTERS
from trainwreck.report.claims import Claim, fact, verdict
from trainwreck.report.handbook import Chapter, Evidence, Paragraph, fmt
from trainwreck.invariants.continuity import DEFAULT_LOSS_TOLERANCE, losses_match
from trainwreck.trainer.progress import TIMED_PHASES

PAGE_CKPT_AGE_INTERVALS = 3
"""Page when the newest checkpoint is older than this many checkpoint intervals' worth of updates."""
PAGE_SLOW_UPDATES = 8
"""Page when a slowdown of whole updates lasts longer than this many updates (two checkpoint
intervals here; minutes in production): a straggler that recovers sooner is a ticket."""
PAGE_ATTEMPTS = 3
"""Page when a job needs more attempts than this: it is restarting, not training."""
ASYNC_QUESTION = "Why not make the training loop asynchronous, and when do you move from DDP to FSDP?"
PHASES = TIMED_PHASES
EIGHTY_GB = 80e9


def _phase_row(ev: Evidence, run: str, i: int) -> str:
    parts = ", ".join(f"{p} {ev.q(run, 'phases', 'ranks', i, 'totals', p, unit=' s')}" for p in PHASES)
    return f"rank {ev.q(run, 'phases', 'ranks', i, 'rank')} over {ev.q(run, 'phases', 'ranks', i, 'steps')} " \
           f"updates: {parts}"


def one_step(ev: Evidence) -> list[Paragraph]:
    ranks = len(ev.reports["straggler"]["phases"]["ranks"])
    return [[
        ev.s("One step is one optimizer update: load a batch (data), forward, backward, an explicit sync, the "
             "optimizer step, and every few updates a checkpoint."),
        ev.s("In backward DDP hands the gradients to a communication hook bucket by bucket; the reference trainer's "
             "hook (<code>trainer/gradsync.py</code>) lays them out in the module's parameter order, as one flat "
             "all-reduce when the whole model fits in DDP's first bucket (its own does) and one all-reduce per "
             "parameter when it does not, so no element's place in the tensor reduced, and so the order of its sum, "
             "depends on DDP's bucket layout, and digests can match bit for bit."),
        ev.s(f"The reference trainer, killed mid-epoch and resumed, spent: {_phase_row(ev, 'resume', 0)}."),
        ev.s(f"Its median update took {ev.q('resume', 'phases', 'median_step_s', unit=' s')}."),
    ], [
        ev.s("The synchronization boundary is the gradient all-reduce: no rank can start its optimizer step until "
             "every rank has contributed."),
        ev.s("The straggler run shows it by moving the time: "
             + "; ".join(_phase_row(ev, "straggler", i) for i in range(ranks)) + "."),
        ev.s("The slow rank's delay shows up in its own phase (data), the others pay it as waiting in backward; "
             f"that is why the report names rank {ev.q('straggler', 'phases', 'slowest_rank')} from the phases a "
             "collective cannot stretch (data, forward, optimizer).",
             fact("phases.slowest_rank", "!=", None, run="straggler")),
    ]]


def partition(ev: Evidence) -> list[Paragraph]:
    cov = ("verdicts", "coverage", "counts")
    back = ("facts", "coverage", "went_back")
    return [[
        ev.s("The elastic sampler deals each epoch's shuffled ids to ranks by position and checkpoints its "
             "position, so a resume continues the same permutation."),
        ev.s("Proof is a count, not an argument: over "
             f"{ev.q('resume', *cov, 'lineage_steps')} lineage steps and {ev.q('resume', *cov, 'epochs')} epochs "
             f"the resumed reference run used {ev.q('resume', *cov, 'duplicated_ids')} (epoch, id) pair(s) twice, "
             f"left {ev.q('resume', *cov, 'ids_not_covered')} id(s) uncovered, and "
             f"{ev.q('resume', *cov, 'golden_mismatched_steps')} step(s) used a batch other than the uninterrupted "
             f"golden run's (coverage {ev.q('resume', 'verdicts', 'coverage', 'valid')}).",
             verdict("coverage", True, run="resume")),
    ], [
        ev.s("With the sampler's position left out of the checkpoint (CAUGHT): "
             f"{ev.q('sampler_not_saved', *cov, 'duplicated_ids')} (epoch, id) pair(s) used twice "
             f"({ev.q('sampler_not_saved', 'facts', 'coverage', 'twice_split')}; an id counts once per epoch it "
             f"repeats in) and {ev.q('sampler_not_saved', *cov, 'golden_mismatched_steps')} step(s) whose batch "
             "differs from the golden run.", verdict("coverage", False, run="sampler_not_saved")),
        ev.s(f"At update {ev.q('sampler_not_saved', *back, 'step')} the resumed job's sampler went back from epoch "
             f"{ev.q('sampler_not_saved', *back, 'from_epoch')} to epoch "
             f"{ev.q('sampler_not_saved', *back, 'to_epoch')}: it replayed samples the run had already trained on.",
             fact("facts.coverage.went_back", "!=", None, run="sampler_not_saved")),
        ev.s("In the pictures below each column is one update; red cells are ids seen a second time."),
    ]]


def restart_state(ev: Evidence) -> list[Paragraph]:
    cont = ("verdicts", "continuity", "counts")
    out = [
        ev.s("Everything that decides the next update: model weights, optimizer moments, the LR schedule's "
             "position, every RNG stream, and the sampler's position."),
        ev.s(f"The reference run's {ev.q('resume', *cont, 'restores_checked')} restore(s) (one per rank that "
             f"resumed) each loaded a state whose digest equals what its save recorded, and it matched the golden run at "
             f"{ev.q('resume', *cont, 'golden_steps_checked')} steps with {ev.q('resume', *cont, 'violations')} "
             "violation(s).", verdict("continuity", True, run="resume")),
        ev.s("Drop one piece each:"),
    ]
    for run in ("optimizer_not_saved", "scheduler_not_saved", "rng_not_restored"):
        out.append(ev.s(f"<code>{run}</code> (CAUGHT by continuity): {ev.q(run, *cont, 'violations')} "
                        f"discontinuities; first: {ev.q(run, 'verdicts', 'continuity', 'evidence', 0)}.",
                        verdict("continuity", False, run=run)))
    out.append(ev.s("The optimizer's moments are part of the state digest, so a restore without them is caught at "
                    "the restore itself: its digest differs from the one its save recorded.",
                    fact("facts.continuity.first_kind", "==", "restore_digest", run="optimizer_not_saved")))
    out.append(ev.s("A forgotten optimizer state leaves the restore digest equal to its save's here, so only the "
                    "steps after the restore, compared with the golden run, show it.",
                    fact("facts.continuity.first_kind", "in", ["golden_digest", "golden_loss"],
                         run="optimizer_not_saved")))
    out.append(ev.s("A forgotten schedule or RNG stream is outside the digest: the restore matches its save, and the "
                    "golden comparison of the steps after it is what catches them (the loss plots mark where).",
                    fact("facts.continuity.first_kind", "in", ["golden_digest", "golden_loss"],
                         run="scheduler_not_saved"),
                    fact("facts.continuity.first_kind", "in", ["golden_digest", "golden_loss"],
                         run="rng_not_restored")))
    out.append(ev.s("<code>sampler_not_saved</code> is CAUGHT by coverage: "
                    f"{ev.q('sampler_not_saved', 'verdicts', 'coverage', 'counts', 'duplicated_ids')} (epoch, id) "
                    "pairs used twice, while all "
                    f"{ev.q('sampler_not_saved', 'facts', 'restores', 'matched')} of its restore digests equal their "
                    "saves: the model was restored exactly, the data position was not.",
                    verdict("coverage", False, run="sampler_not_saved"),
                    fact("facts.restores.mismatched", "==", 0, run="sampler_not_saved")))
    return [out]


def health_metric(ev: Evidence) -> list[Paragraph]:
    hang = ("hangs", 0)
    return [[
        ev.s("Forward progress: the newest update every rank has applied, over time. A stale last loss, a "
             "heartbeat thread and, under NCCL, GPU utilisation (a waiting rank spins in the collective's kernel) "
             "can all look healthy while a peer is stopped (general behaviour, not measured by these CPU runs); "
             "progress cannot."),
        ev.s(f"With rank 1 SIGSTOPped (<code>hang-sigstop</code>), no rank completed update "
             f"{ev.q('hang-sigstop', *hang, 'last_step')}; after {ev.q('hang-sigstop', *hang, 'detected_after_s', unit=' s')} "
             f"without progress (configured timeout {ev.q('hang-sigstop', 'spec', 'hang_timeout_s', unit=' s')}) the "
             f"watchdog named rank(s) {ev.q('hang-sigstop', *hang, 'ranks')} as suspects, rank(s) "
             f"{ev.q('hang-sigstop', *hang, 'waiting')} as waiting behind them, and restarted."),
    ], [
        ev.s(f"The straggler is slow, not broken: it finished at step {ev.q('straggler', 'totals', 'final_step')} "
             f"in {ev.q('straggler', 'totals', 'attempts')} attempt(s), its hang verdict "
             f"{ev.q('straggler', 'verdicts', 'hang', 'valid')}: its line bends but never goes flat for a timeout.",
             verdict("hang", True, run="straggler"), fact("hangs", "==", [], run="straggler")),
    ]]


def resumed_correct(ev: Evidence) -> list[Paragraph]:
    seg = ev.reports["resume"]["lineage"]["segments"]
    cont = ("verdicts", "continuity", "counts")
    return [[
        ev.s("Compare it with a run that never failed. Every update emits a digest of the model and optimizer "
             "state."),
        ev.s(f"The resumed run restored {ev.q('resume', 'lineage', 'segments', len(seg) - 1, 'restored')} and its "
             f"{ev.q('resume', *cont, 'golden_steps_checked')} lineage steps were checked against the golden run's "
             f"digests (same world size: bit-identical, not merely close), with {ev.q('resume', *cont, 'violations')} "
             f"violation(s); continuity {ev.q('resume', 'verdicts', 'continuity', 'valid')}.",
             verdict("continuity", True, run="resume")),
        ev.s(f"The {ev.q('resume', 'totals', 'redo_steps')} update(s) attempt 0 applied after its last checkpoint, "
             "lost with the kill, are outside the lineage and not compared; their redo after the restore is in the "
             "lineage and is compared."),
        ev.s("The loss plot below lies on the golden curve.", verdict("continuity", True, run="resume"),
             fact("loss.golden.max_gap", "==", 0.0, run="resume")),
    ]]


def world_size(ev: Evidence) -> list[Paragraph]:
    cov = ("verdicts", "coverage", "counts")
    fss = "fsdp-shrink-world"
    return [[
        ev.s(f"DDP {ev.q('shrink-world', 'attempts', 0, 'world_size')} → "
             f"{ev.q('shrink-world', 'attempts', 1, 'world_size')}: the effective batch must stay "
             f"{ev.q('shrink-world', 'spec', 'global_batch')} samples (configured), so each rank's share went from "
             f"{ev.q('shrink-world', 'attempts', 0, 'rank_batch')} to "
             f"{ev.q('shrink-world', 'attempts', 1, 'rank_batch')}; the sampler repartitions the rest of the epoch "
             "by global position, not per-rank position."),
        ev.s(f"Coverage {ev.q('shrink-world', 'verdicts', 'coverage', 'valid')} with "
             f"{ev.q('shrink-world', *cov, 'duplicated_ids')} duplicated (epoch, id) pair(s).",
             verdict("coverage", True, run="shrink-world")),
    ], [
        ev.s("<code>world_size_reslices</code> (CAUGHT) keeps per-rank positions and re-slices: "
             f"{ev.q('world_size_reslices', *cov, 'duplicated_ids')} (epoch, id) pair(s) used twice and "
             f"{ev.q('world_size_reslices', *cov, 'golden_mismatched_steps')} step(s) off the golden batches.",
             verdict("coverage", False, run="world_size_reslices")),
    ], [
        ev.s("Sharded state: with FSDP every rank holds and saves only its shard, so a checkpoint written by "
             f"{ev.q(fss, 'attempts', 0, 'world_size')} ranks must be re-sliced to load on "
             f"{ev.q(fss, 'attempts', 1, 'world_size')}."),
        ev.s(f"In <code>{fss}</code> attempt 1 restored {ev.q(fss, 'attempts', 1, 'restored', 'checkpoint')}, "
             "written as shards by the 4-rank attempt, and torch.distributed.checkpoint re-sliced it on load; its "
             f"{ev.q(fss, 'verdicts', 'continuity', 'counts', 'golden_steps_checked')} lineage steps match the "
             "4-rank golden run (losses within tolerance, since the reduction order changed), coverage "
             f"{ev.q(fss, 'verdicts', 'coverage', 'valid')} with {ev.q(fss, *cov, 'duplicated_ids')} duplicated "
             "(epoch, id) pair(s).", verdict("continuity", True, run=fss), verdict("coverage", True, run=fss)),
        ev.s(f"Its newest checkpoint, saved on {ev.q(fss, 'state', 'world_size')} ranks, holds "
             f"{ev.q(fss, 'state', 'rank_bytes')} bytes per rank: on this tiny model the checkpoint format's framing "
             "outweighs the tensors, so chapter 11 measures the sharding on a bigger one."),
    ]]


def periodic_stall(ev: Evidence) -> list[Paragraph]:
    saves = ev.reports["slow-disk"]["saves"]
    worst = max(range(len(saves)), key=lambda i: saves[i]["seconds"] or 0.0)
    ranks = len(ev.reports["slow-disk"]["phases"]["ranks"])
    per_rank = "; ".join(f"rank {ev.q('slow-disk', 'phases', 'ranks', i, 'rank')}: checkpoint "
                         f"{ev.q('slow-disk', 'phases', 'ranks', i, 'totals', 'checkpoint', unit=' s')}, forward "
                         f"{ev.q('slow-disk', 'phases', 'ranks', i, 'totals', 'forward', unit=' s')}"
                         for i in range(ranks))
    return [[
        ev.s("Find what repeats on the same period."),
        ev.s(f"Here the storage stalls during one save: the save of step {ev.q('slow-disk', 'saves', worst, 'step')} "
             f"took {ev.q('slow-disk', 'saves', worst, 'seconds', unit=' s')} against a mean of "
             f"{ev.q('slow-disk', 'phases', 'save_seconds', 'mean', unit=' s')} over "
             f"{ev.q('slow-disk', 'phases', 'save_seconds', 'count')} saves (that one included)."),
        ev.s(f"The per-rank phase breakdown puts the time in checkpoint side work on every rank ({per_rank}), not in "
             "compute: every rank waits at the save's barrier for the writer."),
        ev.s("The progress line goes flat at the save and the checkpoint age keeps rising until the save commits."),
    ]]


def silent_duplication(ev: Evidence) -> list[Paragraph]:
    run = "pad_uneven_shards"
    gold = ("loss", "golden")
    return [[
        ev.s("Silent duplication: padding uneven shards by repeating ids trains on some samples twice per epoch."),
        ev.s("Nothing crashes, and the loss still falls, by "
             + ev.derive("pad_loss_drop_percent", 100 * (1 - ev.get(run, "loss", "final") / ev.get(run, "loss", "values", 0)),
                         "100 * (1 - loss.final / loss.values[0])",
                         {"first": ev.get(run, "loss", "values", 0), "final": ev.get(run, "loss", "final")}, " %")
             + " from the first update to the last (the plot), so no alarm on the loss curve would fire.",
             fact("loss.final", "<", ev.get(run, "loss", "values", 0), run=run)),
        ev.s("Beside the golden run the per-update losses differ, by up to "
             + ev.derive("pad_loss_gap_percent", 100 * ev.get(run, *gold, "max_gap"), "100 * loss.golden.max_gap",
                         {"max_gap": ev.get(run, *gold, "max_gap")}, " %")
             + f" at update {ev.q(run, *gold, 'max_gap_step')}: that update's batch held other samples, and one "
             "batch's loss moves with its samples.", fact("loss.golden.max_gap", "!=", 0.0, run=run)),
        ev.s(f"The curves end together (a final gap of {ev.q(run, *gold, 'final_gap')}): even a golden run's loss "
             "curve does not show the duplication.", fact("loss.golden.final_gap", "<", DEFAULT_LOSS_TOLERANCE, run=run)),
        ev.s(f"They end {ev.q(run, *gold, 'final_gap')} apart: only a golden run shows that, and production has none.",
             fact("loss.golden.final_gap", ">=", DEFAULT_LOSS_TOLERANCE, run=run)),
        ev.s("Only counting ids shows the cause: <code>pad_uneven_shards</code> (CAUGHT) used "
             f"{ev.q(run, 'verdicts', 'coverage', 'counts', 'duplicated_ids')} (epoch, id) pair(s) twice within an "
             f"epoch over {ev.q(run, 'verdicts', 'coverage', 'counts', 'epochs')} epochs (continuity "
             f"{ev.q(run, 'verdicts', 'continuity', 'valid')} against the golden run).",
             verdict("coverage", False, run=run)),
        ev.s("In production there is no golden run: the coverage count is the check you can keep."),
    ]]


DALY_EXAMPLE_SAVE_SHARE = 0.1
"""A save costing this share of the MTBF (configured): where Young's and Daly's optima part visibly."""


def ckpt_interval(ev: Evidence) -> list[Paragraph]:
    cost = float(ev.get("resume", "phases", "save_seconds", "interval_mean"))
    step = float(ev.get("resume", "phases", "median_step_s"))
    every = int(ev.get("resume", "spec", "ckpt_interval"))
    interval = young_interval(cost, MTBF_ASSUMED_S)
    daly = daly_interval(cost, MTBF_ASSUMED_S)
    steps = ev.derive("young_daly_interval_steps", interval / step, "young_daly_interval_s / step_s",
                      {"young_daly_interval_s": interval, "step_s": step}, " updates")
    big = DALY_EXAMPLE_SAVE_SHARE * MTBF_ASSUMED_S
    return [[
        ev.s("Young's first-order optimum: interval = √(2 · save cost · MTBF). Daly's refinement keeps the "
             "higher-order terms: √(2δM) · (1 + ⅓√(δ/2M) + (δ/2M)/9) − δ for a save cost δ below 2M (else M), "
             "and counts the interval as compute between saves."),
        ev.s("Measured here, a periodic save costs "
             f"{ev.q('resume', 'phases', 'save_seconds', 'interval_mean', unit=' s')} (mean of "
             f"{ev.q('resume', 'phases', 'save_seconds', 'interval_count')} saves; the end-of-run save, which also "
             "flushes the run's end, is left out) and an update "
             f"{ev.q('resume', 'phases', 'median_step_s', unit=' s')} (median)."),
        ev.s(f"Assuming one failure an hour for the whole job (MTBF {fmt(MTBF_ASSUMED_S)} s, an assumption, not a "
             "measurement, the same one every report's frequency answer makes), Young's interval is "
             + ev.derive("young_daly_interval_s", interval, "sqrt(2 * save_cost_s * mtbf_s)",
                         {"save_cost_s": cost, "mtbf_s": MTBF_ASSUMED_S}, " s") + f", about {steps}, and Daly's "
             + ev.derive("daly_interval_s", daly, "daly(save_cost_s, mtbf_s)",
                         {"save_cost_s": cost, "mtbf_s": MTBF_ASSUMED_S}, " s")
             + (": with a save this cheap against the MTBF the two agree to within the save cost."
                if abs(interval - daly) <= cost else ": they differ by more than one save cost.")),
        ev.s(f"They part once a save is no longer small against the MTBF: at a save cost of {fmt(big)} s "
             f"({fmt(100 * DALY_EXAMPLE_SAVE_SHARE)} % of the MTBF, configured, not measured) Young gives "
             + ev.derive("young_interval_example_s", young_interval(big), "sqrt(2 * save_cost_s * mtbf_s)",
                         {"save_cost_s": big, "mtbf_s": MTBF_ASSUMED_S}, " s") + " and Daly "
             + ev.derive("daly_interval_example_s", daly_interval(big), "daly(save_cost_s, mtbf_s)",
                         {"save_cost_s": big, "mtbf_s": MTBF_ASSUMED_S}, " s")
             + ", Young's "
             + ev.derive("young_over_daly_example", young_interval(big) / daly_interval(big),
                         "young_interval_example_s / daly_interval_example_s",
                         {"young_interval_example_s": young_interval(big),
                          "daly_interval_example_s": daly_interval(big)}, "×")
             + " as long."),
        ev.s(f"The run checkpoints every {ev.q('resume', 'spec', 'ckpt_interval')} updates (configured), about "
             + ev.derive("saves_more_often_than_optimum", interval / step / every,
                         "young_daly_interval_steps / ckpt_interval",
                         {"young_daly_interval_steps": interval / step, "ckpt_interval": every}, "×")
             + " more often than Young's optimum: right for a handbook that must show a restore within 16 updates, "
               "wasteful for a real job."),
        ev.s(f"So each failure cost little: {ev.q('resume', 'recovery', 0, 'steps_redone')} update(s) "
             f"({ev.q('resume', 'recovery', 0, 'samples_redone')} samples) redone, the checkpoint "
             f"{ev.q('resume', 'recovery', 0, 'checkpoint_age_s', unit=' s')} old at the failure."),
        ev.s("For a real model, measure the save cost with <code>python -m trainwreck.benchmarks.checkpoint</code> "
             "and redo this sum."),
    ]]


def _suspect_index(ev: Evidence, run: str) -> int | None:
    """The first suspect's stack among the hang's dumps, if one was dumped with a frame."""
    hang = ev.reports[run]["hangs"][0]
    return next((i for i, st in enumerate(hang["stacks"]) if st.get("rank") in hang["ranks"] and st.get("frame")),
                None)


def _suspect_stack(ev: Evidence, run: str) -> str:
    """Where the first suspect stood, from its stack dump; a rank that never ran Python again may leave none."""
    i = _suspect_index(ev, run)
    if i is None:
        return "no stack of a suspect could be dumped"
    where = (f"rank {ev.q(run, 'hangs', 0, 'stacks', i, 'rank')}'s stack at "
             f"{ev.q(run, 'hangs', 0, 'stacks', i, 'frame')}")
    if ev.reports[run]["hangs"][0]["stacks"][i].get("in_injector"):
        where += " (inside the fault injector: where the planned fault holds it, not a bug in training)"
    return where


def _captured_without_the_gil(ev: Evidence, run: str) -> list[Claim]:
    """What wrote the GIL-holding rank's stack: faulthandler's C handler, when its dump says so."""
    i = _suspect_index(ev, run)
    if i is None:
        return []
    st = ("hangs", 0, "stacks", i)
    return [ev.s("That stack was still captured: faulthandler's handler for the watchdog's SIGUSR1 is C code run "
                 "from the signal, which needs no GIL, and it wrote "
                 f"{ev.q(run, *st, 'threads')} thread block(s) of rank {ev.q(run, *st, 'rank')}; what no thread of "
                 "the rank can run is Python, so a watchdog written as a Python thread inside the rank would never "
                 "have fired.", fact(f"hangs.0.stacks.{i}.faulthandler", "==", True, run=run))]


def _monitored_barrier(ev: Evidence) -> list[Claim]:
    """What torch's monitored_barrier named, run for real with one rank held back (benchmarks/barrier.py)."""
    run = "monitored-barrier"
    stalled, first = ev.get(run, "stalled_rank"), ev.reports[run]["ranks"][0]
    lead = (f"torch's <code>monitored_barrier</code> (gloo only) was run here with rank "
            f"{ev.q(run, 'stalled_rank')} of {ev.q(run, 'world_size')} gloo ranks held back (benchmarks/barrier.py): "
            f"rank 0's call raised after {ev.q(run, 'ranks', 0, 'raised_after_s', unit=' s')} against its "
            f"{ev.q(run, 'timeout_s', unit=' s')} timeout (configured) and its error named rank(s) "
            f"{ev.q(run, 'ranks', 0, 'names')}")
    out = [ev.s(lead + ", the one held back: unlike a plain collective, it names the rank that never came.",
                fact("ranks.0.names", "==", [stalled], run=run)) if first["names"] == [stalled] else
           ev.s(lead + f", not rank {stalled}, the one held back.", fact("ranks.0.names", "!=", [stalled], run=run))]
    for k in range(1, len(ev.reports[run]["ranks"])):
        out.append(ev.s(f"Rank {ev.q(run, 'ranks', k, 'rank')}, which did arrive, raised too, naming rank(s) "
                        f"{ev.q(run, 'ranks', k, 'names')}: it says where to look, rank 0's log, not who is missing.",
                        fact(f"ranks.{k}.names", "==", [0], run=run)))
    out.append(ev.s("It is a barrier the job must call itself and every rank blocks in it on the host: torch documents "
                    "it for debugging, at a cost in speed, not for every step."))
    return out


NCCL_ASYNC_ERROR_HANDLING = 3
"""TORCH_NCCL_ASYNC_ERROR_HANDLING's default in torch 2.13 (ProcessGroupNCCL.hpp: 3, SkipCleanUp, tears the
process down without cleaning up the communicators)."""
NCCL_TIMEOUT_MIN = 10
"""ProcessGroupNCCL's default collective timeout in torch 2.13 (kProcessGroupNCCLDefaultTimeout), minutes."""
FLIGHT_RECORDER_ENTRIES = 2000
"""The flight recorder's default ring size in torch 2.13 (FlightRecorder.hpp, TORCH_FR_BUFFER_SIZE)."""


def on_gpus(ev: Evidence) -> list[Claim]:
    """What torch documents for NCCL: stated as documented, since this CPU machine measured none of it."""
    return [
        ev.s("On GPUs, NCCL has what gloo lacks (documented by torch, not run here: this machine has no GPU). "
             "ProcessGroupNCCL's own watchdog thread checks every collective against the process group's timeout "
             f"({NCCL_TIMEOUT_MIN} minutes by default for NCCL) and, under <code>TORCH_NCCL_ASYNC_ERROR_HANDLING</code> "
             f"({NCCL_ASYNC_ERROR_HANDLING} by default: tear the process down), ends a rank blocked past it instead of "
             "leaving it waiting."),
        ev.s("Its flight recorder keeps each rank's most recent collectives (<code>TORCH_NCCL_TRACE_BUFFER_SIZE</code> "
             f"entries, {FLIGHT_RECORDER_ENTRIES} by default) and, with <code>TORCH_NCCL_DUMP_ON_TIMEOUT</code> set, "
             "writes them out when the watchdog times out: the rank whose record stops a collective short of its "
             "peers' is the one that hangs."),
    ]


def which_rank_hangs(ev: Evidence) -> list[Paragraph]:
    return [[
        ev.s("gloo does not know a peer is stopped: its sockets stay open, so every other rank blocks inside the "
             f"all-reduce until the process group's timeout ({fmt(GLOO_DEFAULT_TIMEOUT_S)} s by default, a value "
             "torch configures, not one measured here), and then the error names the collective that timed out on "
             "the waiting rank, not the rank that stopped."),
        *_monitored_barrier(ev),
        ev.s("trainwreck's watchdog watches progress files from outside and names the rank furthest behind, after "
             "its own configured timeout: "
             f"{ev.q('hang-sigstop', 'spec', 'hang_timeout_s', unit=' s')} in these runs."),
    ], [
        ev.s(f"SIGSTOP on rank 1: rank(s) {ev.q('hang-sigstop', 'hangs', 0, 'ranks')} named after "
             f"{ev.q('hang-sigstop', 'hangs', 0, 'detected_after_s', unit=' s')} without progress (measured), "
             f"{_suspect_stack(ev, 'hang-sigstop')}."),
        ev.s("A hang that holds the GIL (no Python thread of the rank runs again): rank(s) "
             f"{ev.q('hang-holding-gil', 'hangs', 0, 'ranks')} named after "
             f"{ev.q('hang-holding-gil', 'hangs', 0, 'detected_after_s', unit=' s')} (measured), "
             f"{_suspect_stack(ev, 'hang-holding-gil')}."),
        *_captured_without_the_gil(ev, "hang-holding-gil"),
        ev.s("With the watchdog disabled (CAUGHT by the hang invariant): "
             f"{ev.q('watchdog_disabled', 'verdicts', 'hang', 'summary')}",
             verdict("hang", False, run="watchdog_disabled")),
    ], on_gpus(ev)]


def _ckpt_phase(ev: Evidence, run: str) -> str:
    """Rank 0's checkpoint-phase seconds, quoted, then derived per step that paid for a save (the save
    after the last update is in no step's phases)."""
    i = next(i for i, r in enumerate(ev.reports[run]["phases"]["ranks"]) if r["rank"] == 0)
    total = float(ev.get(run, "phases", "ranks", i, "totals", "checkpoint"))
    saves = ev.get(run, "phases", "ranks", i, "checkpoint_steps")
    return (f"{ev.q(run, 'phases', 'ranks', i, 'totals', 'checkpoint', unit=' s')} in the checkpoint phase of "
            f"the {ev.q(run, 'phases', 'ranks', i, 'checkpoint_steps')} steps that saved, "
            + ev.derive(f"{run}_stall_per_save_s", total / saves, "checkpoint_phase_s / saves",
                        {"checkpoint_phase_s": total, "saves": saves}, " s") + " per save")


def async_checkpoints(ev: Evidence) -> list[Paragraph]:
    akp = "async-kill-persist"
    return [[
        ev.s("An asynchronous training loop means asynchronous updates: each rank applies gradients computed on "
             "parameters its peers have since moved, k updates stale, instead of waiting for the all-reduce; chapter "
             "stale (under --full) measures what 1, 2 and 4 updates of staleness cost in loss. Synchronous training "
             "keeps k = 0: a step ends at the gradient all-reduce, every rank agrees on the update before the next "
             "one, which is what makes a replica's digest comparable at all."),
        ev.s("What can be made asynchronous without that cost is the checkpoint: once the state is copied, nothing "
             "in the next update needs "
             "it on disk."),
        ev.s(f"The same 2.1 M-parameter job ({ev.q('wide-sync', 'state', 'state_bytes')} bytes of model and AdamW "
             f"state per checkpoint), saved every {ev.q('wide-sync', 'spec', 'ckpt_interval')} updates: "
             f"synchronously, rank 0's steps spent {_ckpt_phase(ev, 'wide-sync')}; asynchronously "
             f"{_ckpt_phase(ev, 'wide-async')} (the copy into host memory), while the background thread took "
             f"{ev.q('wide-async', 'phases', 'save_seconds', 'mean', unit=' s')} per save to write and commit, "
             f"against {ev.q('wide-sync', 'phases', 'save_seconds', 'mean', unit=' s')} inside the step."),
        ev.s("The background write is not free: it competes with the ranks for the same cores "
             f"({ev.q('wide-async', 'spec', 'host', 'cpus')} here), so it can run slower than a synchronous one and stretch the steps beside it. A median update cannot show "
             f"either: only {ev.q('wide-sync', 'phases', 'ranks', 0, 'checkpoint_steps')} of rank 0's "
             f"{ev.q('wide-sync', 'phases', 'ranks', 0, 'steps')} updates paid for a save (the save after the last "
             f"update is in none), so the comparison is of the saves themselves: synchronous ones took {ev.q('wide-sync', 'phases', 'save_seconds', 'mean', unit=' s')} "
             f"on average and {ev.q('wide-sync', 'phases', 'save_seconds', 'max', unit=' s')} at most over "
             f"{ev.q('wide-sync', 'phases', 'save_seconds', 'count')} saves, asynchronous persists "
             f"{ev.q('wide-async', 'phases', 'save_seconds', 'mean', unit=' s')} and "
             f"{ev.q('wide-async', 'phases', 'save_seconds', 'max', unit=' s')} over "
             f"{ev.q('wide-async', 'phases', 'save_seconds', 'count')}, each figure from one run on a shared "
             "machine (run it again for the run-to-run spread)."),
        ev.s("The trajectory is the same (continuity "
             f"{ev.q('wide-async', 'verdicts', 'continuity', 'valid')} against its golden run).",
             verdict("continuity", True, run="wide-async")),
    ], [
        ev.s("What it can lose: <code>async-kill-persist</code> SIGKILLs rank 0 after the first file of the step-8 "
             "background persist, while training has moved on."),
        ev.s(f"The restart loaded {ev.q(akp, 'recovery', 0, 'restored', 'checkpoint')}, the newest committed "
             f"checkpoint ({ev.q(akp, 'recovery', 0, 'checkpoint')}), and redid "
             f"{ev.q(akp, 'recovery', 0, 'steps_redone')} update(s) ({ev.q(akp, 'recovery', 0, 'samples_redone')} "
             "samples): the save in flight is lost, nothing committed is (atomicity "
             f"{ev.q(akp, 'verdicts', 'atomicity', 'valid')}, coverage {ev.q(akp, 'verdicts', 'coverage', 'valid')}).",
             verdict("atomicity", True, run=akp), verdict("coverage", True, run=akp),
             fact("recovery.0.restored.checkpoint", "==", ev.get(akp, "recovery", 0, "checkpoint"), run=akp)),
        ev.s("'Saved' still means committed, never 'handed to a thread'; the price is one more interval of redo "
             "when the failure lands mid-persist, and a host copy of the state while it is written."),
    ]]


def ddp_to_fsdp(ev: Evidence) -> list[Paragraph]:
    per = ("bytes_per_param",)
    held = sum(float(ev.get("bytes-ddp", *per, k)) for k in ("params", "grads", "optimizer"))
    gap = _loss_gap(ev.reports["wide-fsdp"]["loss"], ev.reports["wide-sync"]["loss"])
    within = losses_match(gap["fsdp_loss"], gap["ddp_loss"], DEFAULT_LOSS_TOLERANCE)
    bench_ratio = float(ev.get("bytes-fsdp", "step_s")) / float(ev.get("bytes-ddp", "step_s"))
    runs_ratio = float(ev.get("wide-fsdp", "phases", "median_step_s")) / float(ev.get("wide-sync", "phases", "median_step_s"))
    # "Agree": FSDP on the same side of DDP in both, and within a factor of 1.5 of each other.
    agree = (bench_ratio > 1) == (runs_ratio > 1) and max(bench_ratio, runs_ratio) / min(bench_ratio, runs_ratio) <= 1.5
    return [[
        ev.s("Move to FSDP when the state no longer fits, not before."),
        ev.s(f"Measured by benchmarks/fsdp.py on the same model ({ev.q('bytes-ddp', 'numel')} parameters, "
             f"{ev.q('bytes-ddp', 'world_size')} ranks, after a real backward and AdamW step), rank 0 holds under "
             f"DDP {ev.q('bytes-ddp', *per, 'params')} bytes per parameter of parameters, "
             f"{ev.q('bytes-ddp', *per, 'grads')} of gradients and {ev.q('bytes-ddp', *per, 'optimizer')} of AdamW "
             f"moments; under FSDP {ev.q('bytes-fsdp', *per, 'params')}, {ev.q('bytes-fsdp', *per, 'grads')} and "
             f"{ev.q('bytes-fsdp', *per, 'optimizer')}."),
        ev.s("That is fp32 training: 4 + 8 = 12 bytes of parameters and moments (what a checkpoint holds), 16 with "
             "the gradients. Mixed precision also comes to 16 bytes before activations, split differently: 2 of "
             "bf16 weights, 2 of bf16 gradients, 12 of fp32 master weights and moments."),
        ev.s("An 80 GB device therefore holds at most "
             + ev.derive("ddp_max_params_80gb_billions", EIGHTY_GB / held / 1e9,
                         "80e9 / (params + grads + optimizer bytes per param) / 1e9", {"bytes_per_param": held},
                         " billion parameters")
             + " under DDP before a single activation; at steady state FSDP divides all three by the world size."),
        ev.s("Not at its peak: while a layer computes, FSDP has all-gathered that layer's parameters whole. In the "
             f"benchmark's last step rank 0 held at most {ev.q('bytes-fsdp', 'peak_gathered_bytes')} bytes of "
             f"parameters whole at once (its largest layer is {ev.q('bytes-fsdp', 'largest_layer_bytes')} bytes), "
             f"beside its {ev.q('bytes-fsdp', 'params')}-byte shard, against all "
             f"{ev.q('bytes-ddp', 'peak_gathered_bytes')} under DDP; the buffer of a layer all-gathered ahead "
             "(FSDP's backward prefetch) is not in that count, so the peak is higher still by up to a layer."),
        ev.s(f"The checkpoints agree: the FSDP run's newest one holds {ev.q('wide-fsdp', 'state', 'rank_bytes')} "
             f"bytes per rank against {ev.q('wide-sync', 'state', 'state_bytes')} bytes that every DDP rank holds."),
    ], [
        ev.s("The price is communication: every forward and backward all-gathers parameters and reduce-scatters "
             f"gradients. The benchmark's median step took {ev.q('bytes-ddp', 'step_s', unit=' s')} under DDP and "
             f"{ev.q('bytes-fsdp', 'step_s', unit=' s')} under FSDP; in the trainwreck runs the median update took "
             f"{ev.q('wide-sync', 'phases', 'median_step_s', unit=' s')} against "
             f"{ev.q('wide-fsdp', 'phases', 'median_step_s', unit=' s')}, and a save "
             f"{ev.q('wide-sync', 'phases', 'save_seconds', 'mean', unit=' s')} against "
             f"{ev.q('wide-fsdp', 'phases', 'save_seconds', 'mean', unit=' s')}."),
        ev.s("Each FSDP rank wrote only its shard, about half the bytes, and its save still took longer: a "
             "distributed checkpoint (torch.distributed.checkpoint) first agrees on a save plan across the ranks "
             "with collectives, then every rank writes its files at once, and a metadata file joins them, costs a "
             "DDP rank 0's one torch.save does not pay.",
             fact("phases.save_seconds.mean", ">", ev.get("wide-sync", "phases", "save_seconds", "mean"), run="wide-fsdp")),
        ev.s("Each FSDP rank wrote only its shard, about half the bytes, and its save was no slower.",
             fact("phases.save_seconds.mean", "<=", ev.get("wide-sync", "phases", "save_seconds", "mean"),
                  run="wide-fsdp")),
        ev.s("The two step-time pairs put FSDP at "
             + ev.derive("fsdp_over_ddp_step_benchmark", bench_ratio, "bytes-fsdp.step_s / bytes-ddp.step_s",
                         {"fsdp": float(ev.get("bytes-fsdp", "step_s")), "ddp": float(ev.get("bytes-ddp", "step_s"))},
                         "×")
             + " DDP's step in the benchmark and "
             + ev.derive("fsdp_over_ddp_step_runs", runs_ratio,
                         "wide-fsdp.median_step_s / wide-sync.median_step_s",
                         {"fsdp": float(ev.get("wide-fsdp", "phases", "median_step_s")),
                          "ddp": float(ev.get("wide-sync", "phases", "median_step_s"))}, "×")
             + " in the runs"
             + (": they agree." if agree else
                f": they disagree, because each is one measurement on {ev.q('wide-sync', 'spec', 'host', 'cpus')} "
                "cores shared with other jobs, where a step's "
                "time moves with the load; neither ratio is a property of FSDP here, and only repeated runs on an "
                "idle machine (benchmarks/fsdp.py, several times) would say which holds.")),
        ev.s(f"Final loss {ev.q('wide-sync', 'loss', 'final')} (DDP) and {ev.q('wide-fsdp', 'loss', 'final')} "
             f"(FSDP); the largest relative gap over all {len(ev.reports['wide-fsdp']['loss']['steps'])} updates is "
             + ev.derive("fsdp_vs_ddp_max_loss_gap", gap["gap"], "|fsdp_loss - ddp_loss| / max(1, |ddp_loss|), the "
                         "largest over the updates", gap, "")
             + (" (the losses are identical at every update)" if gap["gap"] == 0 else f" (at update {gap['step']})")
             + f": {'within' if within else 'OUTSIDE'} the tolerance of "
               f"{fmt(DEFAULT_LOSS_TOLERANCE)} that continuity allows across reduction orders"
             + (", the same training." if within else ".")),
    ]]


def _loss_gap(run: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """The largest relative loss difference between two runs' report.json `loss` (continuity's rule,
    invariants.continuity.losses_match), with its step and both losses there."""
    theirs = dict(zip(base["steps"], base["values"]))
    gaps = [{"gap": abs(v - theirs[s]) / max(1.0, abs(theirs[s])), "step": s, "fsdp_loss": v, "ddp_loss": theirs[s]}
            for s, v in zip(run["steps"], run["values"]) if s in theirs]
    if not gaps:
        raise KeyError("the two runs share no update with a loss")
    return max(gaps, key=lambda g: g["gap"])


def async_and_fsdp(ev: Evidence) -> list[Paragraph]:
    return async_checkpoints(ev) + ddp_to_fsdp(ev)


def _sizes(ev: Evidence, run: str) -> str:
    return "; ".join(f"{ev.q(run, 'sizes', i, 'bytes')} bytes took {ev.q(run, 'sizes', i, 'seconds', unit=' s')}"
                     for i in range(len(ev.reports[run]["sizes"])))


def communication(ev: Evidence) -> list[Paragraph]:
    run = "allreduce-cost"
    n, sizes = ev.get(run, "world_size"), ev.reports[run]["sizes"]
    big, small = len(sizes) - 1, 0
    d_big, t_big = float(sizes[big]["bytes"]), float(sizes[big]["seconds"])
    d_small, t_small = float(sizes[small]["bytes"]), float(sizes[small]["seconds"])
    factor = 2 * (n - 1) / n
    slope = (t_big - t_small) / (d_big - d_small)
    alone = slope * d_small
    per, flat = float(ev.get(run, "model", "per_parameter_s")), float(ev.get(run, "model", "bucketed_s"))
    return [[
        ev.s("An all-reduce leaves every rank with the sum of every rank's tensor. A ring does it in two passes, a "
             "reduce-scatter and an all-gather of n − 1 steps each, every step moving 1/n of the message, so each "
             "rank sends (and receives) 2(n − 1)/n · D bytes for a D-byte message: below 2D for any n, so the "
             "bytes a rank moves are set by the message size, not by the number of ranks."),
        ev.s(f"Measured by benchmarks/comm.py, gloo on {ev.q(run, 'world_size')} ranks over loopback (median of "
             f"{ev.q(run, 'repeats')} repeats, {ev.q(run, 'dtype')}): {_sizes(ev, run)}."),
        ev.s(f"At n = {ev.q(run, 'world_size')} the ring factor 2(n − 1)/n is "
             + ev.derive("ring_factor", factor, "2 * (n - 1) / n", {"n": n})
             + f", so the largest message ({ev.q(run, 'sizes', big, 'bytes')} bytes) moves "
             + ev.derive("ring_bytes_per_rank", round(factor * d_big), "2 * (n - 1) / n * bytes", {"n": n, "bytes": d_big},
                         " bytes")
             + " per rank, "
             + ev.derive("ring_bandwidth_gb_s", factor * d_big / t_big / 1e9, "ring_bytes_per_rank / seconds / 1e9",
                         {"ring_bytes_per_rank": factor * d_big, "seconds": t_big}, " GB/s")
             + " of ring traffic."),
        ev.s("From the smallest to the largest message each extra byte cost "
             + ev.derive("allreduce_ns_per_byte", slope * 1e9, "(seconds_largest - seconds_smallest) / "
                         "(bytes_largest - bytes_smallest) * 1e9", {"seconds_largest": t_big, "seconds_smallest":
                         t_small, "bytes_largest": d_big, "bytes_smallest": d_small}, " ns")
             + f"; at that rate the {ev.q(run, 'sizes', small, 'bytes')}-byte message would take "
             + ev.derive("smallest_at_per_byte_rate_s", alone, "ns_per_byte * 1e-9 * bytes_smallest",
                         {"ns_per_byte": slope * 1e9, "bytes_smallest": d_small}, " s")
             + f", and it took {ev.q(run, 'sizes', small, 'seconds', unit=' s')}: a small all-reduce is mostly the "
             "fixed cost of one collective call, not bytes.", fact(f"sizes.{small}.seconds", ">", alone, run=run),
             fact(f"sizes.{big}.seconds", ">", t_small, run=run)),
    ], [
        ev.s(f"The reference model's gradients are {ev.q(run, 'model', 'parameters')} tensors, "
             f"{ev.q(run, 'model', 'bytes')} bytes. Reduced one parameter at a time, {_hook_layout(ev, run)}, they "
             f"took {ev.q(run, 'model', 'per_parameter_s', unit=' s')}; "
             f"as one bucket of the same bytes, {ev.q(run, 'model', 'bucketed_s', unit=' s')}: "
             + ev.derive("per_parameter_over_bucketed", per / flat, "per_parameter_s / bucketed_s",
                         {"per_parameter_s": per, "bucketed_s": flat}, "×") + " the time."),
        ev.s("Bucketing wins because every collective pays its fixed cost once: DDP packs gradients into buckets "
             "(25 MB by default) and launches each as soon as it fills, overlapping the reduction with the rest of "
             "the backward pass.", fact("model.per_parameter_s", ">", flat, run=run)),
        ev.s(f"Here one all-reduce per parameter was not slower: {ev.q(run, 'model', 'parameters')} calls per step "
             f"pay {ev.q(run, 'model', 'parameters')} fixed costs, small against {ev.q(run, 'model', 'bytes')} bytes "
             "(and a shared machine's noise is larger); a model of hundreds of small tensors pays that fixed cost hundreds of times per step, which "
             "is what DDP's buckets (25 MB by default) avoid.", fact("model.per_parameter_s", "<=", flat, run=run)),
        ev.s("The trainer pays for per-parameter reduction, on a model past DDP's first bucket, to be exact: each "
             "element then sits at the same offset of the tensor reduced in every attempt, so the order of each sum, "
             "and the digests, do not depend on how DDP laid out its buckets (chapter 1); a model within it is one "
             "bucket in every update, reduced as one tensor in parameter order for the same reason."),
    ]]


def _hook_layout(ev: Evidence, run: str) -> str:
    """What the trainer's own hook does with the measured model, from the job's record of it."""
    cap = f"{ev.q(run, 'model', 'one_bucket_bytes')} bytes"
    if ev.get(run, "model", "hook") == "per_parameter":
        return (f"as the trainer's hook (<code>trainer/gradsync.py</code>) does for a model past DDP's first bucket "
                f"of {cap}, as this one is")
    return (f"which the trainer's hook (<code>trainer/gradsync.py</code>) does only for a model past DDP's first "
            f"bucket of {cap} (this one is within it, and is reduced as one flat tensor)")


PIPELINE_CASES: tuple[tuple[int, int], ...] = ((4, 4), (4, 16), (8, 16), (10, 4), (10, 32))
"""(stages p, micro-batches m), configured: depths the 2 cores cannot give a core per stage, so their bubble
is computed (chapter pipeline measures 2 stages)."""


def memory(ev: Evidence) -> list[Paragraph]:
    d, f = "bytes-ddp", "bytes-fsdp"
    numel, n = float(ev.get(d, "numel")), int(ev.get(d, "world_size"))
    P, G, O = (float(ev.get(d, k)) for k in ("params", "grads", "optimizer"))
    fsdp = sum(float(ev.get(f, k)) for k in ("params", "grads", "optimizer"))
    held = {"params": P, "grads": G, "optimizer": O}
    stages = {"zero1": (P + G + O / n, "params + grads + optimizer / n"),
              "zero2": (P + (G + O) / n, "params + (grads + optimizer) / n"),
              "zero3": ((P + G + O) / n, "(params + grads + optimizer) / n")}
    z = {k: ev.derive(f"{k}_bytes_per_rank", round(v), formula, {**held, "n": n}, " bytes")
         for k, (v, formula) in stages.items()}
    # The mixed-precision accounting, per parameter: 2 + 2 bytes of half weights and gradients, 12 of fp32
    # master weights and moments; the same stages, computed (the trainer trains in fp32).
    mixed = {"zero1": (4 * numel + 12 * numel / n, "(2 + 2) * numel + 12 * numel / n"),
             "zero2": (2 * numel + 14 * numel / n, "2 * numel + (2 + 12) * numel / n"),
             "zero3": (16 * numel / n, "16 * numel / n")}
    zm = {k: ev.derive(f"mixed_{k}_bytes_per_rank", round(v), formula, {"numel": numel, "n": n}, " bytes")
          for k, (v, formula) in mixed.items()}
    return [[
        ev.s(f"Count it, then measure it. benchmarks/fsdp.py's model has {ev.q(d, 'numel')} parameters; after a "
             f"real backward and AdamW step each DDP rank holds {ev.q(d, 'params')} bytes of fp32 parameters, "
             f"{ev.q(d, 'grads')} of gradients and {ev.q(d, 'optimizer')} of AdamW's two moments: "
             + ev.derive("fp32_bytes_per_param", (P + G + O) / numel, "(params + grads + optimizer) / numel",
                         {**held, "numel": numel})
             + " bytes per parameter (4 weights + 4 gradients + 8 moments; activations, DDP's bucket copy of the "
             "gradients and the allocator's slack not counted)."),
        ev.s("Mixed precision with AdamW also comes to 16 bytes per parameter, split differently: 2 (half-precision "
             "weights) + 2 (their gradients) + 12 (fp32 master weights and two fp32 moments); for this model "
             + ev.derive("mixed_bytes_total", round(16 * numel), "16 * numel", {"numel": numel}, " bytes")
             + ", computed, not measured (the trainer trains in fp32). Its optimizer state is "
             + ev.derive("mixed_optimizer_share_percent", 100 * 12 / 16, "100 * 12 / 16", {}, " %")
             + " of that, which is why ZeRO shards it first."),
    ], [
        ev.s(f"ZeRO on {ev.q(d, 'world_size')} ranks in the fp32 accounting measured above (4 + 4 + 8 bytes per "
             f"parameter), computed from those bytes: stage 1 (optimizer state sharded) {z['zero1']} per rank, "
             f"stage 2 (and gradients) {z['zero2']}, stage 3 (and parameters) {z['zero3']}, against "
             f"{ev.derive('ddp_bytes_per_rank', round(P + G + O), 'params + grads + optimizer', held, ' bytes')} "
             "unsharded."),
        ev.s("In the mixed-precision accounting (2 + 2 + 12 bytes per parameter, computed, not measured) the same "
             f"stages hold {zm['zero1']} (stage 1: the 12 bytes of fp32 state sharded), {zm['zero2']} (stage 2: "
             f"and the 2 bytes of gradients) and {zm['zero3']} (stage 3: all 16) per rank; the two accountings "
             "total the same 16 bytes per parameter but shard differently, so their stages are not "
             "interchangeable."),
        ev.s(f"FSDP's full shard is stage 3, and measured it holds {ev.q(f, 'params')} + {ev.q(f, 'grads')} + "
             f"{ev.q(f, 'optimizer')} = "
             + ev.derive("fsdp_bytes_per_rank", round(fsdp), "params + grads + optimizer (bytes-fsdp)",
                         {k: float(ev.get(f, k)) for k in ("params", "grads", "optimizer")}, " bytes")
             + " per rank: "
             + ev.derive("fsdp_over_zero3", fsdp / stages["zero3"][0], "fsdp_bytes_per_rank / zero3_bytes_per_rank",
                         {"fsdp_bytes_per_rank": fsdp, "zero3_bytes_per_rank": stages["zero3"][0]}, "×")
             + " the arithmetic."),
    ], [
        ev.s("A pipeline bubble, computed here for depths a 2-core machine cannot give a core per stage (chapter "
             "pipeline, under --full, measures it on 2 stage processes): with p stages and m micro-batches the first and last p − 1 slots "
             "of a step have idle stages, a fraction (p − 1)/(m + p − 1) of the step, or (p − 1)/m of the compute "
             "time. GPipe and 1F1B leave the same bubble; 1F1B starts each micro-batch's backward as soon as it "
             "can, so a stage holds at most p micro-batches' activations instead of all m."),
    ], [
        *(bubble_sentence(ev, p, m) for p, m in PIPELINE_CASES),
    ]]


def _page(what: str, run: str, detail: str, fire: bool) -> str:
    return (f"<strong>{escape(what)}</strong> ({escape(run)}): {detail} → "
            f"<span class=\"page {'yes' if fire else 'no'}\">{'PAGE' if fire else 'no page'}</span>")


def _page_no_progress(ev: Evidence) -> str:
    stalled = ev.get("hang-sigstop", "hangs", 0, "detected_after_s")
    window = ev.get("hang-sigstop", "spec", "hang_timeout_s")
    return _page("no forward progress for a window", "hang-sigstop",
                 f"no update for {ev.q('hang-sigstop', 'hangs', 0, 'detected_after_s', unit=' s')}, window "
                 f"{ev.q('hang-sigstop', 'spec', 'hang_timeout_s', unit=' s')} (configured)", stalled >= window)


def _page_ckpt_age(ev: Evidence) -> str:
    """On the exported metric itself, its peak over the run: what an alert on the gauge would have seen."""
    run = "hang-holding-gil"
    peak = ev.get(run, "metrics", "checkpoint_age_max_s")
    interval, step = ev.get(run, "spec", "ckpt_interval"), ev.get(run, "phases", "median_step_s")
    limit = PAGE_CKPT_AGE_INTERVALS * interval * step
    return _page("checkpoint age over a threshold", run,
                 f"the newest checkpoint's age peaked at {ev.q(run, 'metrics', 'checkpoint_age_max_s', unit=' s')} "
                 f"(while the hung job made no update); threshold {PAGE_CKPT_AGE_INTERVALS} intervals × "
                 f"{ev.q(run, 'spec', 'ckpt_interval')} updates (configured) × "
                 f"{ev.q(run, 'phases', 'median_step_s', unit=' s')} (the median update) = "
                 + ev.derive("checkpoint_age_threshold_s", limit, "intervals * ckpt_interval * median_step_s",
                             {"intervals": PAGE_CKPT_AGE_INTERVALS, "ckpt_interval": interval, "median_step_s": step},
                             " s"), peak > limit)


def _page_restart_loop(ev: Evidence, run: str) -> str:
    outcome, attempts = ev.get(run, "outcome"), ev.get(run, "totals", "attempts")
    return _page("a restart loop", run,
                 f"{ev.q(run, 'totals', 'attempts')} attempt(s), ended {ev.q(run, 'outcome')} at step "
                 f"{ev.q(run, 'totals', 'final_step')} (page on no_progress or more than {PAGE_ATTEMPTS} attempts)",
                 outcome == "no_progress" or attempts > PAGE_ATTEMPTS)


def _page_throughput(ev: Evidence) -> str:
    """On the longest slowdown of whole updates (report.json `slowdowns`), not on a mean: a straggler
    that recovers by itself costs a ticket, one that stays costs the job's throughput and a page."""
    run = "straggler"
    series = [(i, s) for i, s in enumerate(ev.reports[run]["slowdowns"]["series"]) if s["where"] == "update"]
    if not series:
        return _page("throughput collapse", run, f"no update took over {ev.q(run, 'slowdowns', 'slow_factor')}× "
                     f"the median update ({ev.q(run, 'slowdowns', 'median_step_s', unit=' s')}): nothing to page on",
                     False)
    i, longest = max(series, key=lambda pair: pair[1]["steps_per_episode"])
    at = ("slowdowns", "series", i)
    last = longest["first_steps"][0] + longest["steps_per_episode"] - 1
    after = "then ran at the median again" if last < ev.get(run, "totals", "final_step") else "until the run ended"
    return _page("throughput collapse", run,
                 f"rank(s) {', '.join(map(str, longest['ranks']))} took over "
                 f"{ev.q(run, 'slowdowns', 'slow_factor')}× the median update ("
                 f"{ev.q(run, 'slowdowns', 'median_step_s', unit=' s')}) for "
                 f"{ev.q(run, *at, 'steps_per_episode')} update(s) from update {ev.q(run, *at, 'first_steps', 0)}, "
                 f"{ev.q(run, *at, 'extra_s_per_episode', unit=' s')} lost, {after}; page when "
                 f"a slowdown outlasts {PAGE_SLOW_UPDATES} updates (configured: minutes in production), a ticket "
                 "when it recovers sooner", longest["steps_per_episode"] > PAGE_SLOW_UPDATES)


def paging(ev: Evidence) -> list[Paragraph]:
    return [[
        ev.s("Page on symptoms a human must act on, each a rule over numbers every run already reports. Computed "
             "on this handbook's runs:"),
    ], [
        ev.s(_page_no_progress(ev)), ev.s(_page_ckpt_age(ev)), ev.s(_page_restart_loop(ev, "restart-loop")),
        ev.s(_page_restart_loop(ev, "resume")), ev.s(_page_throughput(ev)),
    ], [
        ev.s("The restart-loop run is the correct trainer killed before update 3 in every attempt, before any "
             "checkpoint exists: the supervisor stops restarting it, and its INVALID progress verdict is the "
             "expected one.", verdict("progress", False, run="restart-loop")),
        ev.s("The resumed run restarted once and finished: one restart is recovery, not a loop.",
             fact("totals.attempts", "==", 2, run="resume"), fact("outcome", "==", "completed", run="resume")),
    ]]


CHAPTERS: tuple[Chapter, ...] = (
    Chapter("step", "What exactly is one training step, and where is its synchronization boundary?",
            ("resume", "straggler"), one_step, (("straggler", "progress"),)),
    Chapter("partition", "How is the data partitioned, and how do you prove that a resume neither replays nor "
            "skips samples?", ("resume", "sampler_not_saved"), partition,
            (("resume", "coverage"), ("sampler_not_saved", "coverage"))),
    Chapter("state", "What state must survive a restart?",
            ("resume", "optimizer_not_saved", "scheduler_not_saved", "rng_not_restored", "sampler_not_saved"),
            restart_state, (("optimizer_not_saved", "loss"), ("rng_not_restored", "loss"))),
    Chapter("health", "Which single metric tells you the job is unhealthy?", ("hang-sigstop", "straggler"),
            health_metric, (("hang-sigstop", "progress"), ("straggler", "progress"))),
    Chapter("resume", "How do you know a resumed run is correct?", ("resume",), resumed_correct,
            (("resume", "loss"),)),
    Chapter("world", "What breaks when the world size changes on resume?",
            ("shrink-world", "world_size_reslices", "fsdp-shrink-world"),
            world_size, (("shrink-world", "coverage"), ("world_size_reslices", "coverage"))),
    Chapter("stall", "How do you debug a job that is slow only every N minutes?", ("slow-disk",), periodic_stall,
            (("slow-disk", "progress"), ("slow-disk", "ckpt_age"))),
    Chapter("silent", "What is the most dangerous silent failure?", ("pad_uneven_shards",), silent_duplication,
            (("pad_uneven_shards", "loss"), ("pad_uneven_shards", "coverage"))),
    Chapter("interval", "How often should you checkpoint?", ("resume",), ckpt_interval, (("resume", "ckpt_age"),)),
    Chapter("hang", "Which rank hangs, and why does gloo not tell you?",
            ("hang-sigstop", "hang-holding-gil", "watchdog_disabled", "monitored-barrier"), which_rank_hangs,
            (("hang-holding-gil", "progress"),)),
    Chapter("async", ASYNC_QUESTION,
            ("wide-sync", "wide-async", "async-kill-persist", "wide-fsdp", "bytes-ddp", "bytes-fsdp"), async_and_fsdp,
            (("async-kill-persist", "ckpt_age"), ("async-kill-persist", "progress"))),
    Chapter("paging", "What should page someone?",
            ("hang-sigstop", "hang-holding-gil", "restart-loop", "resume", "straggler"),
            paging, (("hang-holding-gil", "ckpt_age"), ("restart-loop", "progress")), list_paragraphs=(1,)),
    Chapter("comm", "What does a gradient all-reduce cost, and why bucket it?", ("allreduce-cost",), communication),
    Chapter("memory", "How many bytes does a parameter cost, what do ZeRO's stages and FSDP save, and how much of a "
            "pipeline's step is bubble?", ("bytes-ddp", "bytes-fsdp"), memory, list_paragraphs=(3,)),
    *PRECISION_CHAPTERS,
    *PIPELINE_CHAPTERS,  # report/chapters_pipeline.py: the bubble measured, behind --full
    Chapter("period", PERIOD_QUESTION, ("noisy-neighbour", "slow-storage", "disk-contention"), periodic_slowdowns,
            (("noisy-neighbour", "progress"), ("slow-storage", "ckpt_age"), ("disk-contention", "ckpt_age")),
            full=True),
    Chapter("metrics", METRICS_QUESTION, ("shrink-world",), monitoring, (("shrink-world", "progress"),)),
    Chapter("loader", LOADER_QUESTION, ("loader-kill",), data_loader, full=True),
    *SCALE_CHAPTERS,  # report/chapters_scale.py: behind --full
    *PARALLEL_CHAPTERS,  # report/chapters_parallel.py: behind --full
)
