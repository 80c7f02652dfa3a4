"""A run directory from another harness that writes exactly the fields
docs/DESIGN.md lists: its harness events (fault, hang, exit, end) carry no
`attempt`, and the checkers place them by their time `t`."""

from __future__ import annotations

import json

from histories import HistoryBuilder, golden_run

from trainwreck.invariants import check_atomicity, check_hang
from trainwreck.invariants.cli import main

CORRUPT = {"id": "c1", "kind": "corrupt"}
HANG = {"id": "h1", "kind": "hang", "rank": 1, "step": 2, "expect": "hang"}
DOCUMENTED = {
    "fault": {"kind", "t", "fault_id", "rank", "detail", "checkpoint"},
    "hang": {"kind", "t", "ranks", "waiting", "last_step", "detected_after_s"},
    "exit": {"kind", "t", "rank", "code"},
    "end": {"kind", "t", "status", "final_step"},
}


def as_another_harness(b: HistoryBuilder) -> HistoryBuilder:
    """Keep only the documented fields of every harness event (no `attempt`)."""
    lines = [json.loads(line) for line in b.files["harness.jsonl"]]
    b.files["harness.jsonl"] = [json.dumps({k: v for k, v in ev.items() if k in DOCUMENTED[ev["kind"]]}) for ev in lines]
    assert all("attempt" not in json.loads(line) for line in b.files["harness.jsonl"])
    return b


def corrupted_between_attempts(b: HistoryBuilder, *, second_restore: str, second_rejects: tuple[str, ...]) -> HistoryBuilder:
    """step-4 is damaged after attempt 0 dies; attempt 1 rejects it and dies
    before saving; attempt 2 - which the damage's time also precedes - restores."""
    b.attempt(2).train(5, save_every=2).crash(1)
    b.harness("fault", fault_id="c1", rank=None, checkpoint="step-00000004", detail="flipped bytes")
    b.attempt(2, restore="step-00000002", rejects=("step-00000004",)).train(3).crash(0)
    b.attempt(2, restore=second_restore, rejects=second_rejects).train(8)
    b.end()
    return as_another_harness(b)


def test_a_checkpoint_damaged_between_attempts_and_rejected_by_every_later_attempt_is_valid(builder, capsys):
    b = corrupted_between_attempts(builder(total_steps=8, faults=[CORRUPT]), second_restore="step-00000002", second_rejects=("step-00000004",))
    verdict = check_atomicity(b.load())
    assert verdict.valid is True, verdict
    assert verdict.counts["rejects_required"] == 2
    assert main([str(b.dir), "--golden", str(golden_run(builder("golden").dir, total_steps=8))]) == 0


def test_a_damaged_checkpoint_restored_two_attempts_later_is_invalid(builder, capsys):
    b = corrupted_between_attempts(builder(total_steps=8, faults=[CORRUPT]), second_restore="step-00000004", second_rejects=())
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert any("attempt 2 restored step-00000004" in line for line in verdict.evidence), verdict.evidence
    assert main([str(b.dir)]) == 1


def test_a_damaged_checkpoint_restored_by_the_next_attempt_is_invalid(builder):
    b = builder(total_steps=8, faults=[CORRUPT])
    b.attempt(2).train(5, save_every=2).crash(1)
    b.harness("fault", fault_id="c1", rank=None, checkpoint="step-00000004", detail="flipped bytes")
    b.attempt(2, restore="step-00000004").train(8)
    b.end()
    assert check_atomicity(as_another_harness(b).load()).valid is False


def hang_run(b: HistoryBuilder, *, named: list[int]) -> HistoryBuilder:
    att = b.attempt(2).train(2, save_every=2)
    att.fault("h1", rank=1)
    b.harness("hang", t=b.tick(10.5), ranks=named, waiting=[0], last_step=2, detected_after_s=10.5)
    att.crash(1)
    b.attempt(2, restore="step-00000002").train(4)
    b.end()
    return as_another_harness(b)


def test_a_hang_event_without_attempt_is_placed_in_the_attempt_that_hung(builder):
    verdict = check_hang(hang_run(builder(total_steps=4, faults=[HANG]), named=[1]).load())
    assert verdict.valid is True, verdict


def test_a_hang_event_without_attempt_naming_the_wrong_rank_is_invalid(builder):
    assert check_hang(hang_run(builder(total_steps=4, faults=[HANG]), named=[0]).load()).valid is False


def test_a_harness_attempt_that_is_not_an_integer_is_refused_naming_the_fix(builder, capsys):
    b = builder(total_steps=4)
    b.attempt(2).train(4)
    b.harness("exit", attempt="0", rank=0, code=0)
    b.end()
    assert main([str(b.write())]) == 2
    assert "field 'attempt'" in capsys.readouterr().err
