"""Checkpoints known by content: a `restore` is matched to the `save` that wrote the same bytes
(the optional `content` field of both), falling back to the name when either lacks it.

Real scripts overwrite one file (`snapshot.pt`) or rename it aside as a backup, so a name
alone says little about which state a restore loaded."""

from __future__ import annotations

import pytest
from histories import HistoryBuilder, digest

from trainwreck.invariants import check_atomicity, check_continuity, check_coverage, judge

PLAN = [{"id": "k1", "kind": "signal", "rank": 1, "step": 9}]


def golden_of(builder, total_steps: int = 12) -> HistoryBuilder:
    golden = builder("golden", total_steps=total_steps)
    golden.attempt(2).train(total_steps)
    golden.end()
    return golden


def snapshot_saves(b: HistoryBuilder, *, with_content: bool = True, crash_at: int = 9):
    """Attempt 0 overwrites snapshot.pt after updates 4 and 8, then rank 1 is killed."""
    att = b.attempt(2)
    for step in (4, 8):
        att.train(step)
        att.save(step, name="snapshot.pt", content=f"sha-{step}" if with_content else None)
    return att.train(crash_at).crash(1, "k1")


@pytest.mark.parametrize("with_content, valid", [(True, True), (False, False)])
def test_a_backup_restored_after_its_successor_was_corrupted_is_matched_by_content(builder, with_content, valid):
    # The script renames snapshot.pt aside (snapshot.prev.pt) before writing the next one, and
    # falls back to the backup when the newest fails its check: a correct script, bit-identical
    # to golden. By name, "snapshot.prev.pt" was never saved: a false alarm.
    b = builder(total_steps=12, faults=[*PLAN, {"id": "c1", "kind": "corrupt"}])
    snapshot_saves(b, with_content=with_content)
    b.corrupt("c1", "snapshot.pt", attempt=1)
    b.attempt(2, restore="snapshot.prev.pt", restore_step=4, rejects=("snapshot.pt",),
              restore_content="sha-4" if with_content else None).train(12)
    b.end()
    judgement = judge(b.load(), golden_of(builder).load())
    assert judgement.valid is valid, judgement.to_json()
    if not valid:
        assert "restored snapshot.prev.pt" in judgement.verdicts["atomicity"].summary
        assert "never committed" in judgement.verdicts["atomicity"].summary


def test_one_file_overwritten_in_place_and_restored_is_valid(builder):
    b = builder(total_steps=12, faults=PLAN)
    snapshot_saves(b)
    att = b.attempt(2, restore="snapshot.pt", restore_step=8, restore_content="sha-8").train(12)
    att.save(12, name="snapshot.pt", content="sha-12")
    b.end()
    judgement = judge(b.load(), golden_of(builder).load())
    assert judgement.valid is True, judgement.to_json()
    assert judgement.verdicts["continuity"].counts["restores_checked"] == 2


def test_a_script_that_loads_the_newest_snapshot_but_retrains_its_epoch_is_invalid(builder):
    # pytorch/examples' ddp-tutorial-series stores EPOCHS_RUN = epoch: after a crash following
    # the save at the end of epoch 1 (update 8), it loads that state and trains epoch 1 again.
    b = builder(total_steps=12, faults=PLAN)
    snapshot_saves(b)
    b.attempt(2, restore="snapshot.pt", restore_step=4, restore_digest=digest(8), restore_content="sha-8") \
        .train(12, digests=lambda k: f"replayed-{k}")
    b.end()
    history, golden = b.load(), golden_of(builder).load()
    continuity = check_continuity(history, golden)
    assert continuity.valid is False
    assert ("restored snapshot.pt as step 4, but those bytes (content sha-8) were saved as snapshot.pt at step 8"
            in continuity.evidence[0])
    coverage = check_coverage(history, golden)
    assert coverage.valid is False and "used twice within an epoch" in coverage.summary, coverage
    assert "id 0 at attempt 0 rank 1 step 7 and attempt 1 rank 1 step 7" in coverage.evidence[0]


def test_restored_bytes_that_no_save_committed_are_invalid_and_say_whose_content_differed(builder):
    b = builder(total_steps=12, faults=PLAN)
    snapshot_saves(b)
    b.attempt(2, restore="snapshot.pt", restore_step=8, restore_content="sha-torn").train(12)
    b.end()
    verdict = check_atomicity(b.load())
    assert verdict.valid is False
    assert "its bytes (content sha-torn) match no save before the attempt" in verdict.evidence[0]
    assert "committed content sha-8 at step 8" in verdict.evidence[0]


def test_a_restore_with_content_against_saves_without_it_is_matched_by_name(builder):
    b = builder(total_steps=12, faults=PLAN)
    snapshot_saves(b, with_content=False)
    b.attempt(2, restore="snapshot.pt", restore_step=8, restore_content="sha-8").train(12)
    b.end()
    judgement = judge(b.load(), golden_of(builder).load())
    assert judgement.valid is True, judgement.to_json()
