"""The root cause of an INVALID verdict, in one sentence, from the first violated invariant's evidence.

A reader of a failed run should not have to read six verdicts and forty evidence lines to learn
why it failed. The first violated invariant (in the judge's order) and the facts read from its
evidence (report/facts.py) pick one of the claims below; each presumes the facts it
states, so the sentence cannot blame what the run shows is intact (a sampler that replayed data
is never blamed on the model when every restore digest matches its save). Add a cause by adding
a function to CAUSES; an invariant without one still gets a sentence from its own summary.
"""
from __future__ import annotations

from typing import Any, Callable

from trainwreck.report.claims import F, Claims, fact, verdict

NOT_THE_MODEL = ("The restored model is not to blame: all {m} restore digest(s) equal what their saves recorded.")


def _coverage(say: Claims, report: dict[str, Any]) -> None:
    bad = verdict("coverage", False)
    say("cause.coverage.replay",
        "Root cause: attempt {a} replayed samples the run had already trained on before the failure: at update "
        "{step} its sampler went back from epoch {frm} to epoch {to}, so the sampler's position was not restored "
        "with the checkpoint.", bad, fact("facts.coverage.went_back", "!=", None),
        a=F("facts.coverage.went_back.attempt"), step=F("facts.coverage.went_back.step"),
        frm=F("facts.coverage.went_back.from_epoch"), to=F("facts.coverage.went_back.to_epoch"))
    say("cause.coverage.restart_replay",
        "Root cause: without any epoch going back, attempt {a} was dealt samples that an earlier attempt had "
        "already trained on in the same epoch (id {id} of epoch {epoch}: {first}, again at {again}; {n} (epoch, id) "
        "pair(s) in all): the resume restarted from a data position other than the one its checkpoint had reached.",
        bad, fact("facts.coverage.went_back", "==", None), fact("facts.coverage.twice_span", "!=", None),
        a=F("facts.coverage.twice_span.attempt"), id=F("facts.coverage.twice_span.id"),
        epoch=F("facts.coverage.twice_span.epoch"), first=F("facts.coverage.twice_span.first"),
        again=F("facts.coverage.twice_span.again"), n=F("verdicts.coverage.counts.duplicated_ids"))
    say("cause.coverage.duplicates",
        "Root cause: the lineage used {n} (epoch, id) pair(s) twice without any restart going back an epoch: "
        "the data pipeline itself deals some ids more than once per epoch.", bad,
        fact("facts.coverage.went_back", "==", None), fact("verdicts.coverage.counts.duplicated_ids", ">", 0),
        fact("facts.coverage.twice_span", "==", None), fact("facts.coverage.twice_within", "!=", None),
        n=F("verdicts.coverage.counts.duplicated_ids"))
    say("cause.coverage.skipped",
        "Root cause: {n} id(s) were never used in an epoch the run completed: the resume skipped samples.", bad,
        fact("facts.coverage.went_back", "==", None),
        fact("verdicts.coverage.counts.duplicated_ids", "==", 0), fact("verdicts.coverage.counts.ids_not_covered", ">", 0),
        n=F("verdicts.coverage.counts.ids_not_covered"))
    order = (bad, fact("facts.coverage.went_back", "==", None), fact("verdicts.coverage.counts.duplicated_ids", "==", 0),
             fact("verdicts.coverage.counts.ids_not_covered", "==", 0),
             fact("verdicts.coverage.counts.golden_mismatched_steps", ">", 0))
    say("cause.coverage.order",
        "Root cause: no id repeats and none is missing, but {n} lineage step(s) used another global batch than "
        "the uninterrupted golden run, the first at update {step} in attempt {a}: the data order after the restart "
        "is not the one the run would have had.", *order, fact("facts.coverage.first_golden_batch.attempt", ">", 0),
        n=F("verdicts.coverage.counts.golden_mismatched_steps"), step=F("facts.coverage.first_golden_batch.step"),
        a=F("facts.coverage.first_golden_batch.attempt"))
    say("cause.coverage.order_before_restart",
        "Root cause: no id repeats and none is missing, but {n} lineage step(s) used another global batch than "
        "the uninterrupted golden run, the first at update {step} in attempt 0, before any restart: the trainer's "
        "data order itself differs from the reference's (an epoch's shuffle that ignores the epoch, another seed), "
        "not the resume.", *order, fact("facts.coverage.first_golden_batch.attempt", "==", 0),
        n=F("verdicts.coverage.counts.golden_mismatched_steps"), step=F("facts.coverage.first_golden_batch.step"))
    _model_cleared(say, bad)


def _model_cleared(say: Claims, *presumes: Any) -> None:
    say("cause.model_cleared", NOT_THE_MODEL, *presumes, fact("facts.restores.checked", ">", 0),
        fact("facts.restores.mismatched", "==", 0),
        fact("facts.continuity.first_kind", "not in", ["restore_digest", "restore_step", "save_digest"]),
        m=F("facts.restores.checked"))


def _continuity(say: Claims, report: dict[str, Any]) -> None:
    bad = verdict("continuity", False)
    say("cause.continuity.restore",
        "Root cause: the resumed state is not the state that was saved: {first}.", bad,
        fact("facts.continuity.first_kind", "in", ["restore_digest", "restore_step"]),
        first=F("facts.continuity.first"))
    say("cause.continuity.save",
        "Root cause: a checkpoint does not hold the state of the update it names: {first}.", bad,
        fact("facts.continuity.first_kind", "==", "save_digest"), first=F("facts.continuity.first"))
    say("cause.continuity.trajectory",
        "Root cause: every restore digest equals its save ({m} checked), yet from lineage step {step} the run "
        "leaves the uninterrupted golden run: state the checkpoint does not carry or restore (the LR schedule, an "
        "RNG stream, the optimizer's moments outside the digest, the data order) differs after the restart.", bad,
        fact("facts.continuity.first_kind", "in", ["golden_digest", "golden_loss"]),
        fact("facts.restores.mismatched", "==", 0), fact("facts.restores.checked", ">", 0),
        m=F("facts.restores.checked"), step=F("facts.continuity.first_step"))
    say("cause.continuity.trajectory_unchecked",
        "Root cause: from lineage step {step} the run leaves the uninterrupted golden run: {first}.", bad,
        fact("facts.continuity.first_kind", "in", ["golden_digest", "golden_loss"]),
        fact("facts.restores.checked", "==", 0),
        step=F("facts.continuity.first_step"), first=F("facts.continuity.first"))


def _progress(say: Claims, report: dict[str, Any]) -> None:
    bad = (verdict("progress", False), fact("facts.progress.short", "==", True),
           fact("facts.progress.clean_exit", "==", True), fact("facts.progress.outcome", "==", "completed"))
    say("cause.progress.signal_exits_clean",
        "Root cause: after fault {fault} sent {signal} to rank(s) {ranks} at step {step}, every rank exited 0, so the "
        "job ended completed at step {final} of {total} after {n} attempt(s) and was never resumed: the trainer "
        "answered the signal by finishing cleanly instead of leaving the run to be restarted.", *bad,
        fact("facts.progress.signal", "!=", None), fault=F("facts.progress.signal.fault"),
        signal=F("facts.progress.signal.signal"), ranks=F("facts.progress.signal.ranks"),
        step=F("facts.progress.signal.step"), final=F("facts.progress.final_step"),
        total=F("facts.progress.total_steps"), n=F("facts.progress.attempts"))
    say("cause.progress.exits_clean",
        "Root cause: every rank of the last attempt exited 0 at step {final}, short of total_steps {total}, with "
        "no signal fault fired in that attempt: the trainer stopped early and reported success.", *bad,
        fact("facts.progress.signal", "==", None), final=F("facts.progress.final_step"),
        total=F("facts.progress.total_steps"))


def _hang(say: Claims, report: dict[str, Any]) -> None:
    say("cause.hang.unnamed",
        "Root cause: fault {fault} hung rank {rank} in attempt {a}, and the stall was ended by a hang event, raised "
        "after {after} s without progress, that names no rank (it lists ranks {waiting} as waiting): no watchdog "
        "identified the hung rank, so the job learned that it stalled, not which rank stalled.", verdict("hang", False),
        fact("facts.hang.unnamed", "!=", None), fault=F("facts.hang.unnamed.fault"),
        rank=F("facts.hang.unnamed.rank"), a=F("facts.hang.unnamed.attempt"), after=F("facts.hang.unnamed.after_s"),
        waiting=F("facts.hang.unnamed.waiting"))


def _crash(say: Claims, report: dict[str, Any]) -> None:
    say("cause.crash", "Root cause: {sentence}.", fact("root_cause", "!=", None), sentence=F("root_cause.sentence"))


CAUSES: dict[str, Callable[[Claims, dict[str, Any]], None]] = {
    "coverage": _coverage, "continuity": _continuity, "progress": _progress, "hang": _hang}
"""Invariant -> the claims that name its root cause from its evidence; the others use their summary
(the invariants are declared in report/presentation.py; tests/report/test_presentation.py ties the two)."""


def cause_claims(say: Claims, report: dict[str, Any]) -> None:
    """The root-cause claims of a report: an unplanned crash first, else the first violated invariant's."""
    say.section = "cause"
    if report.get("root_cause"):
        _crash(say, report)
        return
    first = (report.get("facts") or {}).get("first_violated")
    if first is None:
        return
    before = len(say.of("cause"))
    CAUSES.get(first, lambda s, r: None)(say, report)
    if not any(c.rendered for c in say.of("cause")[before:] if c.key != "cause.model_cleared"):
        # Most summaries already quote the first evidence line: then it is not said twice.
        say("cause.summary", "Root cause: {name} is violated: {summary}; first evidence: {first}.",
            verdict(first, False), fact("facts.first_evidence_new", "!=", None), name=first,
            summary=F(f"verdicts.{first}.summary"), first=F("facts.first_evidence_new"))
        say("cause.summary_only", "Root cause: {name} is violated: {summary}.", verdict(first, False),
            fact("facts.first_evidence_new", "==", None), name=first, summary=F(f"verdicts.{first}.summary"))
