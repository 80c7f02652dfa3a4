"""The handbook's chapters on numerics and silent loss: mixed precision, omitted samples, a poisoned
communicator, and what activations cost.

Same rules as report/chapters.py (which appends PRECISION_CHAPTERS to CHAPTERS): every
number through `ev.q` or `ev.derive`, every verdict a sentence states presumed. These chapters
run about a dozen extra jobs, so they are `full=True`: `trainwreck handbook --full` runs them, the
default handbook keeps its time budget.
"""
from __future__ import annotations

from trainwreck.report.claims import fact, verdict
from trainwreck.report.handbook import Chapter, Evidence, Paragraph

PRECISION_QUESTION = "What does mixed precision change in a checkpoint, and what does loss scaling protect?"
POISON_QUESTION = "What poisons the whole communicator: a NaN gradient, a skipped collective?"


def _max_loss_gap(ev: Evidence, a: str, b: str) -> tuple[float, int]:
    va, vb = ev.get(a, "loss", "values"), ev.get(b, "loss", "values")
    gaps = [abs(x - y) for x, y in zip(va, vb)]
    return max(gaps), len(gaps)


def precision(ev: Evidence) -> list[Paragraph]:
    cont = ("verdicts", "continuity", "counts")
    gap, n = _max_loss_gap(ev, "bf16-resume", "resume")
    first = ev.get("bf16-resume", "loss", "values", 0)
    return [[
        ev.s("bf16 autocast runs on CPU (torch.autocast('cpu', dtype=torch.bfloat16)); bf16 keeps fp32's exponent "
             "range, so it needs no loss scaling, and a checkpoint needs nothing beyond what fp32 training saves."),
        ev.s(f"Killed and resumed, the bf16 run restored {ev.q('bf16-resume', *cont, 'restores_checked')} "
             f"checkpoint(s) with digests equal to their saves and matched its own bf16 golden run at "
             f"{ev.q('bf16-resume', *cont, 'golden_steps_checked')} steps with "
             f"{ev.q('bf16-resume', *cont, 'violations')} violation(s).",
             verdict("continuity", True, run="bf16-resume")),
        ev.s("Against the fp32 run of the same data and seed, its loss differed by at most "
             + ev.derive("bf16_fp32_max_loss_gap", gap, "max over steps |loss_bf16 - loss_fp32|",
                         {"steps": n}) + f" over {n} updates: bf16 is a different trajectory, so its golden run must be bf16 too.",
             fact("loss.values.0", "!=", first, run="resume")),
        ev.s("Against the fp32 run of the same data and seed its loss was identical at every update, so bf16 here "
             "changed nothing measurable.", fact("loss.values.0", "==", first, run="resume")),
    ], [
        ev.s("fp16 has 5 exponent bits, so the trainer multiplies the loss by a GradScaler's scale before "
             "backward and divides the gradients by it before the step; the scale and its growth counter are "
             "training state, saved in scheduler.pt beside the LR schedule."),
        ev.s(f"The fp16 run with its scaler checkpointed (<code>fp16-resume</code>) restored "
             f"{ev.q('fp16-resume', *cont, 'restores_checked')} checkpoint(s) and matched its golden run at "
             f"{ev.q('fp16-resume', *cont, 'golden_steps_checked')} steps with "
             f"{ev.q('fp16-resume', *cont, 'violations')} violation(s).",
             verdict("continuity", True, run="fp16-resume")),
        ev.s("<code>scaler_not_saved</code> (CAUGHT by continuity) leaves the scaler out of the checkpoint: "
             f"{ev.q('scaler_not_saved', 'facts', 'continuity', 'first')}. The state digest covers the scaler's "
             "state, so the restore itself is caught.",
             verdict("continuity", False, run="scaler_not_saved"),
             fact("facts.continuity.first_kind", "==", "restore_digest", run="scaler_not_saved")),
        ev.s(f"Its loss never left the golden curve (largest gap {ev.q('scaler_not_saved', 'loss', 'golden', 'max_gap')}), "
             "so the scale had not moved before the save: what the restore lost is the scale's growth counter, "
             "which decides when the scale next grows; a loss plot cannot show that, the digest does.",
             fact("loss.golden.max_gap", "==", 0.0, run="scaler_not_saved")),
    ], [
        ev.s("<code>fp16_unscaled</code> (CAUGHT by continuity) trains fp16 without the scaler: "
             f"{ev.q('fp16_unscaled', 'facts', 'continuity', 'first')}, and "
             f"{ev.q('fp16_unscaled', *cont, 'violations')} discontinuities in all.",
             verdict("continuity", False, run="fp16_unscaled")),
        ev.s("On this small model its loss equals the scaled run's at every update (largest gap "
             f"{ev.q('fp16_unscaled', 'loss', 'golden', 'max_gap')}): without a scale fp16 rounds gradients below "
             "its normal range (about 6e-5) coarsely and flushes those below about 6e-8 to zero, which changed the "
             "state's digest from the first update but not, in these updates, the loss.",
             fact("loss.golden.max_gap", "==", 0.0, run="fp16_unscaled")),
        ev.s("No invariant sees underflow as such: continuity catches the trajectory leaving the golden run that "
             "scaled its loss, and production has no golden run. Underflow is a numerical-health signal (the share "
             "of gradient elements that are zero or subnormal in fp16), not a restart-correctness invariant, so "
             "trainwreck does not add one.",
             verdict("coverage", True, run="fp16_unscaled"), verdict("replicas", True, run="fp16_unscaled")),
    ]]


def omission(ev: Evidence) -> list[Paragraph]:
    cov = ("verdicts", "coverage", "counts")
    run = "truncate_uneven_shards"
    return [[
        ev.s("Omission is duplication's twin: cutting uneven shards to the shortest (what DistributedSampler "
             "with drop_last=True does to a batch) keeps every rank's step count equal and never trains the "
             "dropped samples."),
        ev.s(f"The reference trainer on the same scenario left {ev.q('resume', *cov, 'ids_not_covered')} id(s) "
             f"uncovered over {ev.q('resume', *cov, 'epochs')} epochs.", verdict("coverage", True, run="resume")),
        ev.s(f"<code>{run}</code> (CAUGHT by coverage): {ev.q(run, *cov, 'ids_not_covered')} id(s) never used in "
             f"a completed epoch and {ev.q(run, *cov, 'golden_mismatched_steps')} step(s) whose batch differs from "
             f"the golden run's, with {ev.q(run, *cov, 'duplicated_ids')} duplicated.",
             verdict("coverage", False, run=run)),
        ev.s("Its loss still fell, by "
             + ev.derive("truncate_loss_drop_percent", 100 * (1 - ev.get(run, "loss", "final") / ev.get(run, "loss", "values", 0)),
                         "100 * (1 - loss.final / loss.values[0])",
                         {"first": ev.get(run, "loss", "values", 0), "final": ev.get(run, "loss", "final")}, " %")
             + " from the first update to the last: nothing but the count of ids per epoch shows the samples that "
               "were never seen.",
             fact("loss.final", "<", ev.get(run, "loss", "values", 0), run=run)),
        ev.s(f"Padding (<code>pad_uneven_shards</code>, the silent chapter) repeats "
             f"{ev.q('pad_uneven_shards', *cov, 'duplicated_ids')} (epoch, id) pair(s) instead: the same coverage "
             "count catches both directions.", verdict("coverage", False, run="pad_uneven_shards")),
    ]]


def poison(ev: Evidence) -> list[Paragraph]:
    rep = ("verdicts", "replicas")
    out: list[Paragraph] = []
    for run, where in (("nan-reduced", "after the all-reduce, into rank 1's already reduced gradient"),
                       ("nan-local", "before the all-reduce, into rank 1's own gradient")):
        finite, total = len(ev.get(run, "loss", "steps")), int(ev.get(run, "spec", "total_steps"))
        out.append([
            ev.s(f"A NaN {where}: {ev.q(run, 'faults', 0, 'detail')}."),
            ev.s(f"Its report holds a finite loss up to update {ev.q(run, 'loss', 'steps', -1)} only: the other "
                 + ev.derive(f"{run}_updates_without_finite_loss", total - finite, "spec.total_steps - len(loss.steps)",
                             {"total_steps": total, "finite_losses": finite})
                 + f" of {ev.q(run, 'spec', 'total_steps')} updates logged no finite loss (the global loss is "
                 "all-reduced, so every rank logs the same)."),
            ev.s(f"Replicas {ev.q(run, *rep, 'valid')}: "
                 f"{ev.q(run, *rep, 'summary')}; continuity {ev.q(run, 'verdicts', 'continuity', 'valid')}: "
                 f"{ev.q(run, 'facts', 'continuity', 'first')}.", verdict("continuity", False, run=run)),
        ])
    out.append([
        ev.s("After the all-reduce the NaN stays in one replica, and the replica check catches the ranks "
             "disagreeing.", verdict("replicas", False, run="nan-reduced")),
        ev.s("Before it, the all-reduce sums the NaN into every rank's gradient: every rank takes the same poisoned "
             "step, the replicas agree bit for bit, and only the comparison with a golden run shows it. That is "
             "a communicator-wide poison; a non-finite check on the reduced gradient (GradScaler's skip, or a "
             "guard) is the production defence, and it must act on every rank alike.",
             verdict("replicas", True, run="nan-local"), verdict("continuity", False, run="nan-local")),
    ])
    skip = "skip-collective"
    out.append([
        ev.s(f"A skipped collective: {ev.q(skip, 'faults', 0, 'detail')}. The other rank waits inside the "
             f"all-reduce; after {ev.q(skip, 'hangs', 0, 'detected_after_s', unit=' s')} without progress the "
             f"watchdog named rank(s) {ev.q(skip, 'hangs', 0, 'ranks')} and restarted the job, which completed at "
             f"step {ev.q(skip, 'totals', 'final_step')} in {ev.q(skip, 'totals', 'attempts')} attempt(s).",
             verdict("hang", True, run=skip), fact("outcome", "==", "completed", run=skip)),
        ev.s("Every rank sits in the same backward phase, so the watchdog cannot single out the skipper from "
             "progress alone; restarting the whole communicator is the recovery, since no rank's collective "
             "sequence can be trusted after a desync.", fact("hangs.0.ranks", "contains", 1, run=skip)),
    ])
    return out


def activations(ev: Evidence) -> list[Paragraph]:
    m = "activations"
    none, layer, seg = (float(ev.get(m, k, "held_after_forward_bytes")) for k in ("none", "per_layer", "segments"))
    t_none, t_seg, t_layer = (float(ev.get(m, k, "fwd_bwd_s")) for k in ("none", "segments", "per_layer"))
    per = float(ev.get(m, "layer_activation_bytes"))
    depth = int(ev.get(m, "depth"))
    return [[
        ev.s(f"Measured with {ev.q(m, 'method')}: CPU PyTorch has no allocator statistics like "
             "torch.cuda.max_memory_allocated, tracemalloc does not see tensor storage (PyTorch's CPU allocator "
             "calls malloc itself), and RSS never shrinks, so the bytes malloc has handed out and not taken back, "
             "read before and after, are the tensors alive in between."),
        ev.s(f"The reference MLP with {ev.q(m, 'depth')} hidden layers of {ev.q(m, 'width')} "
             f"({ev.q(m, 'parameters')} parameters) on a batch of {ev.q(m, 'batch')}: one layer's activation is "
             f"{ev.q(m, 'layer_activation_bytes', unit=' bytes')}, and after forward the process held "
             f"{ev.q(m, 'none', 'held_after_forward_bytes', unit=' bytes')} for backward, "
             + ev.derive("held_layers", none / per, "held_after_forward_bytes / layer_activation_bytes",
                         {"held": none, "layer": per}, " layers of activations")
             + f" (autograd's saved tensors, counted with a hook: {ev.q(m, 'saved_tensor_bytes', unit=' bytes')})."),
    ], [
        ev.s(f"Checkpointing every layer held {ev.q(m, 'per_layer', 'held_after_forward_bytes', unit=' bytes')}: "
             + ev.derive("per_layer_over_plain", layer / none, "per_layer / none", {"per_layer": layer, "none": none},
                         "×")
             + " the plain run, because a linear layer followed by ReLU saves only its input, which is exactly what "
               "a checkpoint keeps: per-layer checkpointing of such a block buys nothing and costs a recompute "
             + f"({ev.q(m, 'per_layer', 'fwd_bwd_s', unit=' s')} against {ev.q(m, 'none', 'fwd_bwd_s', unit=' s')}).",
             fact("per_layer.held_after_forward_bytes", ">=", 0.9 * none, run=m)),
        ev.s(f"Checkpointing segments of {ev.q(m, 'segment_layers')} layers (√depth) held "
             f"{ev.q(m, 'segments', 'held_after_forward_bytes', unit=' bytes')}, "
             + ev.derive("segments_over_plain", seg / none, "segments / none", {"segments": seg, "none": none}, "×")
             + f" the plain run, and peaked in backward at {ev.q(m, 'segments', 'peak_in_backward_bytes', unit=' bytes')} "
             f"against {ev.q(m, 'none', 'peak_in_backward_bytes', unit=' bytes')}; a forward and backward took "
             f"{ev.q(m, 'segments', 'fwd_bwd_s', unit=' s')} against {ev.q(m, 'none', 'fwd_bwd_s', unit=' s')} "
             "(one extra forward of each segment, on a shared machine).",
             fact("segments.held_after_forward_bytes", "<", none, run=m)),
        ev.s(f"With k segments of a {depth}-layer stack the held activations are about k + {depth}/k layers, least at "
             "k = √depth: memory O(√n) for one extra forward."),
    ], [
        ev.s("A pipeline multiplies these bytes by the micro-batches a stage holds between their forward and "
             "backward: chapter pipeline counts them on real stage processes, all m under GPipe and at most p "
             "under 1F1B."),
    ]]


PRECISION_CHAPTERS: tuple[Chapter, ...] = (
    Chapter("precision", PRECISION_QUESTION,
            ("resume", "bf16-resume", "fp16-resume", "scaler_not_saved", "fp16_unscaled"), precision,
            (("bf16-resume", "loss"), ("scaler_not_saved", "loss")), full=True),
    Chapter("omission", "Is silently skipping samples caught like duplicating them?",
            ("resume", "truncate_uneven_shards", "pad_uneven_shards"), omission,
            (("truncate_uneven_shards", "coverage"),), full=True),
    Chapter("poison", POISON_QUESTION, ("nan-reduced", "nan-local", "skip-collective"), poison,
            (("nan-local", "loss"), ("skip-collective", "progress")), full=True),
    Chapter("activations", "What do activations cost, and what does activation checkpointing buy?",
            ("activations",), activations, full=True),
)
