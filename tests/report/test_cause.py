"""The root-cause sentence from hand-written verdicts and facts: each says what its facts show, once.

Fast (no run, no torch): the evidence lines are the ones `trainwreck defects` wrote for the planted
defects named in each test, so a sentence that those runs contradict shows here first.
"""
from __future__ import annotations

from typing import Any

from trainwreck.harness.report.cause import cause_claims
from trainwreck.harness.report.claims import Claims
from trainwreck.harness.report.facts import coverage_facts

RESTARTS_EPOCH = ("epoch 1: ids used twice: 1,5,7,13-14 (+2 more ids); "
                  "id 1 at attempt 0 rank 0 step 7 and attempt 1 rank 0 step 9")
PADDED = "epoch 0: ids used twice: 41; id 41 at attempt 0 rank 0 step 6 and attempt 0 rank 1 step 6"


def cause(verdicts: dict[str, Any], facts: dict[str, Any], **report: Any) -> tuple[list[str], str]:
    """(rendered claim keys, cause text) for a report with these verdicts and facts."""
    first = next(name for name, v in verdicts.items() if v["valid"] is False)
    report = {"verdicts": verdicts, "facts": {"first_violated": first, "restores": {"checked": 0, "mismatched": 0},
                                              "continuity": {"first_kind": None}, **facts},
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
