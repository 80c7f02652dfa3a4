"""The root-cause sentence from hand-written verdicts and facts: each says what its facts show, once.

Fast (no run, no torch): the evidence lines are the ones `trainwreck defects` wrote for the planted
defects named in each test, so a sentence that those runs contradict shows here first.
"""
from __future__ import annotations

from typing import Any

from trainwreck.report.violation_cause import cause_claims
from trainwreck.report.claims import Claims
from trainwreck.report.facts import coverage_facts, first_evidence_new, hang_facts, progress_facts

RESTARTS_EPOCH = ("epoch 1: ids used twice: 1,5,7,13-14 (+2 more ids); "
                  "id 1 at attempt 0 rank 0 step 7 and attempt 1 rank 0 step 9")
PADDED = "epoch 0: ids used twice: 41; id 41 at attempt 0 rank 0 step 6 and attempt 0 rank 1 step 6"
LOST = ("attempt 1 restored step-00000004 at step 4 although the newer step-00000008 (step 8) was announced: "
        "a checkpoint announced as committed was lost")


def cause(verdicts: dict[str, Any], facts: dict[str, Any], **report: Any) -> tuple[list[str], str]:
    """(rendered claim keys, cause text) for a report with these verdicts and facts."""
    first = next(name for name, v in verdicts.items() if v["valid"] is False)
    report = {"verdicts": verdicts, "facts": {"first_violated": first, "restores": {"checked": 0, "mismatched": 0},
                                              "continuity": {"first_kind": None},
                                              "first_evidence_new": first_evidence_new(verdicts[first]), **facts},
              **report}
    say = Claims(report)
    cause_claims(say, report)
    return [c.key for c in say.of("cause") if c.rendered], say.text("cause")


def coverage(line: str, dup: int) -> dict[str, Any]:
    return {"valid": False, "summary": f"{dup} (epoch, id) pair(s) used twice within an epoch", "evidence": [line],
            "counts": {"duplicated_ids": dup, "ids_not_covered": 0, "golden_mismatched_steps": 8}}


def test_repeats_that_span_a_restart_are_blamed_on_the_resume_not_on_the_data_pipeline() -> None:
    v = coverage(RESTARTS_EPOCH, 32)
    keys, text = cause({"coverage": v}, {"coverage": coverage_facts(v)})
    assert keys == ["cause.coverage.restart_replay"]
    assert "the data pipeline itself" not in text and "without any restart" not in text
    assert "attempt 1 was dealt samples that an earlier attempt had already trained on in the same epoch" in text
    assert "id 1 of epoch 1: attempt 0 rank 0 step 7, again at attempt 1 rank 0 step 9; 32 (epoch, id)" in text


def test_repeats_inside_one_attempt_are_blamed_on_the_data_pipeline() -> None:
    v = coverage(PADDED, 2)
    keys, text = cause({"coverage": v}, {"coverage": coverage_facts(v)})
    assert keys == ["cause.coverage.duplicates"]
    assert "the data pipeline itself deals some ids more than once per epoch" in text


def test_a_summary_that_quotes_its_first_evidence_is_not_followed_by_it_again() -> None:
    v = {"valid": False, "summary": f"1 violation(s): {LOST}", "evidence": [LOST], "counts": {}}
    keys, text = cause({"atomicity": v}, {})
    assert keys == ["cause.summary_only"] and text.count(LOST) == 1 and "first evidence" not in text
    v = {"valid": False, "summary": "2 violation(s)", "evidence": [LOST, "another"], "counts": {}}
    keys, text = cause({"atomicity": v}, {})
    assert keys == ["cause.summary"] and text.endswith(f"first evidence: {LOST}.")


class Events:
    def __init__(self, *events: dict[str, Any]):
        self.events = list(events)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [ev for ev in self.events if ev["kind"] == kind]


def test_a_sigterm_answered_by_a_clean_exit_is_named_as_the_bug() -> None:
    """sigterm_exits_clean: every rank exits 0 on the preemption, the job 'completes' at step 10 of 16."""
    report = {"spec": {"total_steps": 16}, "attempts": [{"attempt": 0, "exits": {"0": 0, "1": 0}}],
              "faults": [{"id": "preempt", "signal": "SIGTERM", "attempt": 0, "ranks": [0, 1], "in_step": 10}]}
    end = {"kind": "end", "outcome": "completed", "final_step": 10}
    facts = {"progress": progress_facts(report, Events(end))}  # type: ignore[arg-type]
    line = "the job ended completed at step 10, not total_steps 16"
    keys, text = cause({"progress": {"valid": False, "summary": line, "evidence": [line]}}, facts)
    assert keys == ["cause.progress.signal_exits_clean"]
    assert text == ("Root cause: after fault preempt sent SIGTERM to rank(s) [0, 1] at step 10, every rank exited 0, "
                    "so the job ended completed at step 10 of 16 after 1 attempt(s) and was never resumed: the "
                    "trainer answered the signal by finishing cleanly instead of leaving the run to be restarted.")
    report["attempts"][0]["exits"]["1"] = -15  # a rank killed by the signal: not a clean exit, no such sentence
    facts = {"progress": progress_facts(report, Events(end))}  # type: ignore[arg-type]
    keys, text = cause({"progress": {"valid": False, "summary": line, "evidence": [line]}}, facts)
    assert keys == ["cause.summary_only"]


def test_a_hang_ended_by_an_event_that_names_no_rank_says_no_watchdog_named_the_hung_rank() -> None:
    """disabled (the watchdog): the stall ends by a backstop that names no rank."""
    report = {"faults": [{"id": "stop-r1", "rank": 1, "attempt": 0, "expect": "hang", "t_s": 0.36}],
              "hangs": [{"attempt": 0, "ranks": [], "waiting": [0, 1], "detected_after_s": 3.02, "t_s": 3.38}]}
    line = "fault 'stop-r1' (rank 1, attempt 0): hang event names rank(s) [], not the hung rank 1"
    v = {"valid": False, "summary": f"1 violation(s): {line}", "evidence": [line]}
    keys, text = cause({"hang": v}, {"hang": hang_facts(report)})
    assert keys == ["cause.hang.unnamed"]
    assert "fault stop-r1 hung rank 1 in attempt 0" in text and "no watchdog identified the hung rank" in text
    report["hangs"][0]["ranks"] = [1]  # a hang event naming the rank: the sentence does not apply
    keys, _ = cause({"hang": v}, {"hang": hang_facts(report)})
    assert keys == ["cause.summary_only"]


SHUFFLE = [  # trainwreck defects --only shuffle_ignores_epoch: the first batch off the golden run's is before the kill
    "step 7 (attempt 0): global batch differs from the golden run: used 2,7,9 which golden did not; lacks golden's 1,14,16",
    "step 9 (attempt 1): global batch differs from the golden run: used 3-4,11 which golden did not; lacks golden's 0,2,23",
]


def order_only(lines: list[str]) -> dict[str, Any]:
    return {"valid": False, "summary": f"{len(lines)} step(s) whose batch differs from the golden run", "evidence": lines,
            "counts": {"duplicated_ids": 0, "ids_not_covered": 0, "ids_outside_dataset": 0,
                       "golden_mismatched_steps": len(lines)}}


def test_an_order_that_differs_before_any_restart_is_blamed_on_the_trainers_order_not_on_the_resume() -> None:
    v = order_only(SHUFFLE)
    facts = coverage_facts(v)
    assert facts["first_golden_batch"] == {"step": 7, "attempt": 0} and facts["order_only"] is True
    keys, text = cause({"coverage": v}, {"coverage": facts})
    assert keys == ["cause.coverage.order_before_restart"]
    assert "the first at update 7 in attempt 0, before any restart" in text and "after the restart" not in text


def test_an_order_that_differs_only_after_a_restart_is_blamed_on_the_resume() -> None:
    v = order_only(SHUFFLE[1:])
    keys, text = cause({"coverage": v}, {"coverage": coverage_facts(v)})
    assert keys == ["cause.coverage.order"]
    assert "the first at update 9 in attempt 1: the data order after the restart" in text


def test_a_violation_of_order_alone_is_not_called_samples_trained_twice_or_never() -> None:
    from trainwreck.report.angles import _cost

    for v, said, unsaid in ((order_only(SHUFFLE), "Every id was used once per epoch", "twice or never"),
                            (coverage(PADDED, 2), "Samples were trained twice or never", "once per epoch")):
        report = {"verdicts": {"coverage": v}, "facts": {"coverage": coverage_facts(v)}}
        say = Claims(report)
        say.section = "angle:violation:coverage"
        _cost(say, report, "coverage")
        text = say.text(say.section)
        assert said in text and unsaid not in text


def test_the_violation_question_takes_an_before_a_vowel() -> None:
    from trainwreck.report.angles import _a

    assert (_a("atomicity"), _a("coverage"), _a("hang")) == ("an", "a", "a")


def test_a_job_ended_by_the_no_progress_rule_is_not_said_to_have_run_out_of_restarts() -> None:
    from trainwreck.report.angles import _cost

    bad = {"valid": False, "summary": "no_progress after 2 attempt(s)", "evidence": [], "counts": {}}
    for outcome, said, unsaid in (("no_progress", "the no-progress rule", "within its restart budget"),
                                  ("budget_exhausted", "within its restart budget", "no-progress rule")):
        report = {"verdicts": {"progress": bad}, "facts": {"progress": {"outcome": outcome,
                                                                        "no_progress": outcome == "no_progress"}}}
        say = Claims(report)
        say.section = "angle:violation:progress"
        _cost(say, report, "progress")
        text = say.text(say.section)
        assert said in text and unsaid not in text, text
