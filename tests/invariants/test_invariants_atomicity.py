"""atomicity: committed, intact checkpoints only; damage rejected first; no needless loss."""

from __future__ import annotations

from trainwreck.invariants import check_atomicity


def test_resume_from_the_newest_committed_checkpoint_is_valid(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, restore="step-00000004").train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is True, verdict


def test_fallback_past_a_rejected_checkpoint_is_valid(builder):
    b = builder(total_steps=8, faults=[{"id": "c1", "kind": "corrupt"}])
    b.attempt(2).train(5, save_every=2).crash(1)
    b.corrupt("c1", "step-00000004", attempt=1)
    b.attempt(2, restore="step-00000002", rejects=("step-00000004",)).train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is True, verdict
    assert verdict.counts["rejects_required"] == 1


def test_rejects_from_several_ranks_are_accepted(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.corrupt("c1", "step-00000004", attempt=1)
    b.attempt(2, restore="step-00000002", rejects=("step-00000004",), reject_ranks=(0, 1)).train(8)
    assert check_atomicity(b.load()).valid is True


def test_everything_pruned_or_corrupt_starts_fresh_validly(builder):
    b = builder(total_steps=8)
    att = b.attempt(2).train(5, save_every=2)
    att.prune("step-00000002")  # retention keeps one checkpoint
    att.crash(1)
    b.corrupt("c1", "step-00000004", attempt=1)
    b.attempt(2, rejects=("step-00000004",)).train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is True, verdict
    assert verdict.counts["fresh_starts"] == 2


def test_damage_older_than_the_restore_point_needs_no_reject(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.corrupt("c1", "step-00000002", attempt=1)
    b.attempt(2, restore="step-00000004").train(8)
    assert check_atomicity(b.load()).valid is True


def test_checkpoint_resaved_after_damage_is_intact_again(builder):
    b = builder(total_steps=10)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.corrupt("c1", "step-00000004", attempt=1)
    b.attempt(2, restore="step-00000002", rejects=("step-00000004",)).train(7, save_every=2).crash(0)
    # attempt 1 re-saved step-00000004 (and step-00000006): both intact now.
    b.attempt(2, restore="step-00000006").train(10)
    verdict = check_atomicity(b.load())
    assert verdict.valid is True, verdict


def test_in_rank_tear_during_a_save_is_not_cleared_by_that_save(builder):
    b = builder(total_steps=8)
    att = b.attempt(2).train(4, save_every=2)
    att.fault("s1", rank=0, checkpoint="step-00000004", detail="short write")
    att.train(5).crash(1)
    b.attempt(2, restore="step-00000004").train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert "which fault 's1' had damaged" in verdict.evidence[0]


def test_restore_of_a_never_committed_checkpoint_is_invalid(builder):
    b = builder(total_steps=6)
    b.attempt(2).train(2, save_every=2).train(4).crash(1)  # the save of step 4 never committed
    b.attempt(2, restore="step-00000004", restore_step=4).train(6)
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert "restored step-00000004" in verdict.evidence[0] and "never committed" in verdict.evidence[0]


def test_restore_older_than_the_newest_intact_checkpoint_is_invalid(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, restore="step-00000002").train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert "at step 2 although the newer step-00000004 (step 4) was announced by the save event at events/a000-r000" \
        in verdict.evidence[0]
    assert "and the attempt neither restored nor rejected it: needless lost work if it was still on disk" \
        in verdict.evidence[0]


def test_corrupted_checkpoint_restored_without_rejection_is_invalid(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.corrupt("c1", "step-00000004", attempt=1)
    b.attempt(2, restore="step-00000004").train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert verdict.evidence[0].startswith("attempt 1 restored step-00000004 (events/a001-r000")
    assert "which fault 'c1' had damaged (events/harness.jsonl:" in verdict.evidence[0]


def test_considered_damage_that_was_not_rejected_is_invalid(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.corrupt("c1", "step-00000004", attempt=1)
    b.attempt(2, restore="step-00000002").train(8)  # silently skipped it: no reject
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert verdict.evidence == [
        "attempt 1 considered step-00000004 (step 4, saved in attempt 0), damaged by fault 'c1', but never rejected it"
    ]


def test_reject_after_the_restore_is_too_late(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.corrupt("c1", "step-00000004", attempt=1)
    att = b.attempt(2, restore="step-00000002")
    att.emit(0, "reject", checkpoint="step-00000004", reason="late")
    att.train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert "only after restoring or training" in verdict.evidence[0]


def test_fresh_start_while_an_intact_checkpoint_exists_is_needless_lost_work(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2).train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert "attempt 1 started fresh although step-00000004" in verdict.evidence[0]


def test_an_announced_checkpoint_the_resume_rejects_is_called_lost_not_intact(builder):
    # What a power cut does: the save event announced step 4, nothing the harness did touched
    # it, and the next attempt found it unusable. The words must say that, not "intact".
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, rejects=("step-00000004", "step-00000002")).train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    line = verdict.evidence[0]
    assert line.startswith("attempt 1 started fresh although step-00000004 (step 4) was announced by the save event "
                           "at events/a000-r000")
    assert "(attempt 0) and no fault or retention touched it since, yet the attempt found it unusable and rejected " \
           "it (verification failed, events/a001-r000" in line
    assert line.endswith("a checkpoint announced as committed was lost") and "intact" not in line


def test_an_announced_checkpoint_the_resume_ignored_is_needless_lost_work(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2).train(8)
    line = check_atomicity(b.load()).evidence[0]
    assert "and the attempt neither restored nor rejected it: needless lost work if it was still on disk" in line
    assert "yet the attempt found it unusable" not in line


def test_restore_of_a_pruned_checkpoint_is_invalid(builder):
    b = builder(total_steps=8)
    att = b.attempt(2).train(5, save_every=2)
    att.prune("step-00000004")
    att.crash(1)
    b.attempt(2, restore="step-00000004").train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert "retention had pruned" in verdict.evidence[0]


def test_no_rank_events_is_unknown(builder):
    b = builder()
    b.end()
    assert check_atomicity(b.load()).valid == "unknown"


def test_in_rank_corruption_at_bind_counts_against_its_own_attempt_when_a_later_attempt_follows(builder):
    # faults/corrupt.py: rank 0 of attempt 1 damages the newest checkpoints in bind(),
    # after its own `start` and before any rank can look; attempt 1 rejects both and
    # starts fresh, then dies, and attempt 2 resumes. The damage is attempt 1's to see:
    # placed after attempt 1's first event it was counted against attempt 2 and the
    # rejects read as "announced checkpoint lost" (the audit's plan-0006 of seed 9).
    b = builder(total_steps=12, faults=[{"id": "c1", "kind": "corrupt", "attempt": 1}])
    b.attempt(2).train(5, save_every=2).crash(1)
    att = b.attempt(2)
    for name in ("step-00000004", "step-00000002"):
        b.write_event(att.file(0), "fault", attempt=1, rank=None, world_size=2, fault_id="c1",
                      applied_by_rank=0, fault_kind="corrupt", checkpoint=name, detail="truncated")
    for name in ("step-00000004", "step-00000002"):
        att.emit(0, "reject", checkpoint=name, reason="model.pt is short")
    att.train(7, save_every=2).crash(0)
    b.attempt(2, restore="step-00000006").train(12)
    history = b.load()
    assert [ev["attempt"] for ev in history.of_kind("fault")] == [1, 1]
    verdict = check_atomicity(history)
    assert verdict.valid is True, verdict
    assert verdict.counts["rejects_required"] == 2


def test_an_attempt_that_died_before_its_probe_wrote_anything_is_still_counted(builder):
    """Attempt 1's ranks die in `torch.load` before their probe writes an event: only the
    harness's `exit` events show it ran. It is an attempt and a restart all the same (the harness
    said "no_progress after 2 attempt(s)"), and the summary says its start was not judged."""
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.spec["world_sizes"].append(2)
    for rank in range(2):
        b.harness("exit", attempt=1, rank=rank, code=1)
    verdict = check_atomicity(b.load())
    assert verdict.valid is True, verdict
    assert verdict.summary.startswith("2 attempt(s), 1 restart(s): "), verdict.summary
    assert verdict.summary.endswith("; 1 attempt(s) left no rank events, so their start is not judged")
    assert (verdict.counts["attempts"], verdict.counts["attempts_without_rank_events"]) == (2, 1)
