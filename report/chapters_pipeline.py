"""The handbook's pipeline chapter: the bubble and the activations a stage holds, measured on real stage
processes under GPipe and 1F1B, beside the arithmetic (p - 1)/(m + p - 1).

The arithmetic lives here once: `bubble_fraction` and `bubble_sentence` also serve the memory chapter
(report/chapters.py), which computes the bubble for configured depths of 4 to 10 stages. The
measurement is benchmarks/pipeline.py's job (`pipeline` in harness/suites/handbook.py MEASURES), a few
seconds of two gloo stages, so the chapter is `full=True`. Same rules as the other chapter modules: every
number through `ev.q` or `ev.derive`, every comparison a sentence makes presumed, so a run that
contradicts it leaves it unsaid. This module must not import chapters.py.
"""
from __future__ import annotations

from trainwreck.report.claims import Claim, fact
from trainwreck.report.handbook import Chapter, Evidence, Paragraph

PIPELINE_QUESTION = ("How much of a pipeline's step is bubble under GPipe and under 1F1B as the micro-batches grow, "
                     "and how many micro-batches' activations does a stage hold?")
RUN = "pipeline"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B"}


def bubble_fraction(p: int, m: int) -> float:
    """The idle share of a step with p equal stages and m micro-batches, any schedule that flushes."""
    return (p - 1) / (m + p - 1)


def bubble_sentence(ev: Evidence, p: int, m: int) -> Claim:
    """One configured (p, m) pair's arithmetic: the bubble, its share of the compute, activations held."""
    tag = f"p{p}_m{m}"
    return ev.s(
        ev.derive(f"stages_{tag}", p, "configured (PIPELINE_CASES)", {}) + " stages, "
        + ev.derive(f"microbatches_{tag}", m, "configured (PIPELINE_CASES)", {}) + " micro-batches: bubble "
        + ev.derive(f"bubble_percent_{tag}", 100 * bubble_fraction(p, m), "100 * (p - 1) / (m + p - 1)",
                    {"p": p, "m": m}, " %")
        + " of the step ("
        + ev.derive(f"bubble_over_compute_percent_{tag}", 100 * (p - 1) / m, "100 * (p - 1) / m", {"p": p, "m": m},
                    " %")
        + " of the compute time); the first stage holds the activations of "
        + ev.derive(f"gpipe_inflight_{tag}", m, "m", {"m": m}) + " micro-batch(es) under GPipe and "
        + ev.derive(f"onef1b_inflight_{tag}", min(p, m), "min(p, m)", {"p": p, "m": m}) + " under 1F1B.")


def _row(ev: Evidence, p: int, m: int) -> Claim:
    key = f"p{p}"
    parts = [f"{SCHEDULES[s]} {ev.q(RUN, key, s, f'm{m}', 'bubble')} (its steps "
             f"{ev.q(RUN, key, s, f'm{m}', 'bubble_min')} to {ev.q(RUN, key, s, f'm{m}', 'bubble_max')}, a step "
             f"{ev.q(RUN, key, s, f'm{m}', 'step_s', unit=' s')})" for s in SCHEDULES]
    return ev.s(f"m = {ev.q(RUN, key, 'gpipe', f'm{m}', 'micro_batches')}: the formula "
                + ev.derive(f"formula_bubble_p{p}_m{m}", bubble_fraction(p, m), "(p - 1) / (m + p - 1)",
                            {"p": p, "m": m})
                + "; measured " + ", ".join(parts) + ".")


def _trend(ev: Evidence, p: int, micro: list[int]) -> list[Claim]:
    key, lo, hi = f"p{p}", micro[0], micro[-1]
    first, last = (float(ev.get(RUN, key, "gpipe", f"m{m}", "bubble")) for m in (lo, hi))
    measured = [float(ev.get(RUN, key, "gpipe", f"m{m}", "bubble")) for m in micro]
    over = last - bubble_fraction(p, hi)
    gap = float(ev.get(RUN, key, "1f1b", f"m{hi}", "bubble")) - last
    g_min, g_max = (float(ev.get(RUN, key, "gpipe", f"m{hi}", k)) for k in ("bubble_min", "bubble_max"))
    side = (">", g_max) if last + gap > g_max else ("<", g_min)  # inside the spread: neither holds
    rises = [(a, b) for a, b, va, vb in zip(micro, micro[1:], measured, measured[1:]) if vb >= va]
    a, b = (rises or [(lo, micro[1])])[0]  # the first doubling that did not shrink it (none: the sentence is not said)
    return [
        ev.s(f"GPipe's measured bubble fell at every doubling of m, from {ev.q(RUN, key, 'gpipe', f'm{lo}', 'bubble')} "
             f"at m = {lo} to {ev.q(RUN, key, 'gpipe', f'm{hi}', 'bubble')} at m = {hi}, as the formula says: the "
             "p − 1 slots of filling and draining stay, the m slots of work grow.",
             *(fact(f"{key}.gpipe.m{m}.bubble", "<", before, run=RUN) for before, m in zip(measured, micro[1:]))),
        ev.s(f"GPipe's measured bubble fell from {ev.q(RUN, key, 'gpipe', f'm{lo}', 'bubble')} at m = {lo} to "
             f"{ev.q(RUN, key, 'gpipe', f'm{hi}', 'bubble')} at m = {hi}, though not at every doubling (from m = "
             f"{a} to m = {b} it went from {ev.q(RUN, key, 'gpipe', f'm{a}', 'bubble')} to "
             f"{ev.q(RUN, key, 'gpipe', f'm{b}', 'bubble')}): on a shared machine a step's waits carry the other "
             "jobs' noise.", fact(f"{key}.gpipe.m{hi}.bubble", "<", first, run=RUN),
             fact(f"{key}.gpipe.m{b}.bubble", ">=", measured[micro.index(a)], run=RUN)),
        ev.s(f"At m = {hi} it is "
             + ev.derive(f"gpipe_over_formula_p{p}_m{hi}", over, "measured bubble - (p - 1) / (m + p - 1)",
                         {"measured": last, "p": p, "m": hi})
             + " of the step above the formula: the formula counts a send as free, and here each of the 2m "
               "activations and gradients on the critical path crosses a loopback socket to a process that must be "
               "scheduled to take it.",
             fact(f"{key}.gpipe.m{hi}.bubble", ">", bubble_fraction(p, hi), run=RUN)),
        *(ev.s("The formula gives GPipe and 1F1B the same bubble (both fill and drain the same p − 1 slots); at "
               f"m = {hi} the measured two differ by "
               + ev.derive(f"schedules_bubble_gap_p{p}_m{hi}", abs(gap), "abs(1F1B bubble - GPipe bubble)",
                           {"1f1b": last + gap, "gpipe": last})
               + " of the step, " + tail, *presumes) for tail, presumes in (
            (f"inside the spread of GPipe's own steps ({ev.q(RUN, key, 'gpipe', f'm{hi}', 'bubble_min')} to "
             f"{ev.q(RUN, key, 'gpipe', f'm{hi}', 'bubble_max')}): the schedule did not change the bubble.",
             (fact(f"{key}.1f1b.m{hi}.bubble", ">=", ev.get(RUN, key, "gpipe", f"m{hi}", "bubble_min"), run=RUN),
              fact(f"{key}.1f1b.m{hi}.bubble", "<=", ev.get(RUN, key, "gpipe", f"m{hi}", "bubble_max"), run=RUN))),
            (f"outside the spread of GPipe's own steps ({ev.q(RUN, key, 'gpipe', f'm{hi}', 'bubble_min')} to "
             f"{ev.q(RUN, key, 'gpipe', f'm{hi}', 'bubble_max')}): the other jobs' load on this machine, which "
             "the formula has no term for, weighs on a schedule's waits differently.",
             (fact(f"{key}.1f1b.m{hi}.bubble", *side, run=RUN),)))),
    ]


def _activations(ev: Evidence, p: int, hi: int) -> list[Claim]:
    key = f"p{p}"
    g, f = (ev.get(RUN, key, s, f"m{hi}") for s in SCHEDULES)
    per_stage = "; ".join(f"stage {ev.q(RUN, key, '1f1b', f'm{hi}', 'per_stage', s, 'stage')} held "
                          f"{ev.q(RUN, key, '1f1b', f'm{hi}', 'per_stage', s, 'peak_in_flight')}"
                          for s in range(len(f["per_stage"])))
    return [
        ev.s(f"Activations held, counted by a saved-tensors hook (parameters excluded): one micro-batch leaves "
             f"{ev.q(RUN, key, 'gpipe', f'm{hi}', 'per_stage', 0, 'saved_bytes_per_micro_batch', unit=' bytes')} "
             f"on stage 0 for its backward ({ev.q(RUN, 'micro_batch_rows')} rows through "
             f"{ev.q(RUN, 'layers_per_stage')} layers), and a stage holds them from a micro-batch's forward to its "
             "backward."),
        ev.s(f"At m = {hi} GPipe held {ev.q(RUN, key, 'gpipe', f'm{hi}', 'peak_in_flight')} micro-batches at once "
             f"({ev.q(RUN, key, 'gpipe', f'm{hi}', 'peak_saved_bytes', unit=' bytes')}), every one of them; 1F1B "
             f"held at most {ev.q(RUN, key, '1f1b', f'm{hi}', 'peak_in_flight')} "
             f"({ev.q(RUN, key, '1f1b', f'm{hi}', 'peak_saved_bytes', unit=' bytes')}, "
             + ev.derive(f"onef1b_over_gpipe_bytes_p{p}_m{hi}", f["peak_saved_bytes"] / g["peak_saved_bytes"],
                         "1F1B peak_saved_bytes / GPipe peak_saved_bytes",
                         {"1f1b": f["peak_saved_bytes"], "gpipe": g["peak_saved_bytes"]}, "×")
             + f" GPipe's): {per_stage}, p − s on stage s, because 1F1B starts a micro-batch's backward as soon as "
               "the last stage has its forward.",
             fact(f"{key}.gpipe.m{hi}.peak_in_flight", "==", hi, run=RUN),
             fact(f"{key}.1f1b.m{hi}.peak_in_flight", "<=", p, run=RUN),
             *(fact(f"{key}.1f1b.m{hi}.per_stage.{s}.peak_in_flight", "==", min(p - s, hi), run=RUN)
               for s in range(p))),
        ev.s("Both schedules computed the same step: each stage's gradients summed to the same digest under GPipe "
             f"and under 1F1B at every m ({ev.q(RUN, key, 'gpipe', f'm{hi}', 'grad_digest')} at m = {hi}, stage by "
             "stage), so 1F1B buys its memory with no change to the result.",
             *(fact(f"{key}.1f1b.m{m}.grad_digest", "==", ev.get(RUN, key, "gpipe", f"m{m}", "grad_digest"), run=RUN)
               for m in ev.get(RUN, "micro_batches"))),
    ]


def pipeline(ev: Evidence) -> list[Paragraph]:
    p = int(ev.get(RUN, "stages")[0])
    micro = [int(m) for m in ev.get(RUN, "micro_batches")]
    key, hi = f"p{p}", micro[-1]
    return [[
        ev.s(f"Measured, not only computed: benchmarks/pipeline.py ran {ev.q(RUN, 'stages', 0)} processes as "
             f"pipeline stages on loopback {ev.q(RUN, 'backend')}, each {ev.q(RUN, 'layers_per_stage')} Linear "
             f"layers of {ev.q(RUN, 'width')} on micro-batches of {ev.q(RUN, 'micro_batch_rows')} rows, activations "
             "sent forward and gradients back with torch.distributed send and recv, one thread per stage."),
        ev.s("Each stage's step, from a common start to a common end, is split into time computing (inside a "
             "forward or a backward), time blocked (waiting in recv for its neighbour, for its sends to be taken, "
             "or at the step's end for the slower stage) and the rest (starting sends, Python between the calls); "
             "the measured bubble is the blocked share of all stages' time, the median of "
             f"{ev.q(RUN, 'repeats')} steps per schedule and m, timed in interleaved rounds so that both schedules "
             "meet the same load."),
        ev.s(f"Why blocked time: this machine's {ev.q(RUN, 'cores')} cores are shared with other jobs (load "
             f"average {ev.q(RUN, 'load_average_1m')} when the job started); a stage that loses its core stretches "
             "its own compute and its neighbour's wait together, so waiting against computing keeps the schedule's "
             "shape where the wall clock alone would not. Inside their compute the stages had a core for "
             f"{ev.q(RUN, key, 'gpipe', f'm{hi}', 'cpu_share')} of the time (CPU time over wall time, GPipe at "
             f"m = {hi}), and the step's wall clock, counting Python's own work and the stages' skew, was idle "
             f"{ev.q(RUN, key, 'gpipe', f'm{hi}', 'idle_of_wall')} of the time."),
    ], [
        *(_row(ev, p, m) for m in micro),
    ], _trend(ev, p, micro), _activations(ev, p, hi)]


PIPELINE_CHAPTERS: tuple[Chapter, ...] = (
    Chapter("pipeline", PIPELINE_QUESTION, (RUN,), pipeline, list_paragraphs=(1,), full=True),
)
