"""What real models write, judged right (issue 33, items 1-4): local buffers (a BatchNorm's
running statistics) apart from the state replicas agree on, every rank saving one path, and
a restore of bytes a planned fault damaged. Hand-built run directories, so these are quick."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.invariants.histories import HistoryBuilder, digest
from trainwreck.invariants.atomicity import check_atomicity
from trainwreck.invariants.continuity import check_continuity
from trainwreck.invariants.judge import judge
from trainwreck.invariants.replicas import check_replicas


def buffers(step: int, rank: int) -> str:
    """Rank `rank`'s running statistics after update `step`: each rank's own, by design."""
    return f"bn-{step}-r{rank}"


def ddp_with_batchnorm(run_dir: Path, faults: list[dict] | None = None, old_digest: bool = False) -> HistoryBuilder:
    """Two ranks train 1..4: equal `digest`, per-rank `buffers`; or, as an older probe wrote
    them (`old_digest`), a `digest` per rank that covered the statistics too."""
    b = HistoryBuilder(run_dir, faults=faults or [])
    att = b.attempt(2)
    for step in range(1, 5):
        for rank in range(2):
            att.emit(rank, "batch", step=step, epoch=b.epoch_of(step), samples=b.rank_batch(step, rank, 2))
        for rank in range(2):
            state = ({"digest": f"{digest(step)}+{buffers(step, rank)}"} if old_digest
                     else {"digest": digest(step), "buffers": buffers(step, rank)})
            att.emit(rank, "step", step=step, loss=1.0, **state)
        att.position = step
    return b


def restore_on_both(b: HistoryBuilder, step: int, content: str, state: str, stats: str) -> None:
    att = b.attempt(2)
    for rank in range(2):
        att.emit(rank, "restore", step=step, checkpoint="ckpt.pt", digest=state, buffers=stats, content=content)
    att.position = step
    att.train(8)
    b.end()


def test_batchnorm_buffers_that_differ_between_ranks_at_every_step_are_no_divergence(tmp_path: Path) -> None:
    b = ddp_with_batchnorm(tmp_path / "run")
    b.attempts[0].emit(0, "save", step=4, checkpoint="ckpt.pt", digest=digest(4), buffers=buffers(4, 0),
                       content="bytes-4")
    b.attempts[0].crash(1)
    restore_on_both(b, 4, "bytes-4", digest(4), buffers(4, 0))
    verdicts = judge(b.load(), None).verdicts
    assert verdicts["replicas"].valid is True, verdicts["replicas"].to_json()
    assert verdicts["replicas"].counts["restores_compared"] == 1
    assert verdicts["continuity"].valid is True and verdicts["continuity"].counts["restores_checked"] == 2


def test_replicas_names_the_part_that_differs_parameters_at_a_step_or_buffers_at_a_restore(tmp_path: Path) -> None:
    b = HistoryBuilder(tmp_path / "run")
    att = b.attempt(2)
    att.train(2, digests=lambda step: digest(step))
    att.emit(1, "step", step=3, loss=1.0, digest="unsynced", buffers="x")
    att.emit(0, "step", step=3, loss=1.0, digest=digest(3), buffers="x")
    att.save(3, name="ckpt.pt", content="c3")
    att.crash(1)
    att = b.attempt(2)
    for rank, stats in ((0, "bn-a"), (1, "bn-b")):  # both loaded one file: their statistics must agree
        att.emit(rank, "restore", step=3, checkpoint="ckpt.pt", digest=digest(3), buffers=stats, content="c3")
    verdict = check_replicas(b.load())
    assert verdict.valid is False
    assert verdict.evidence == [
        "attempt 0 step 3: parameters or optimizer state differ: rank(s) 0 digest state-3; rank(s) 1 digest unsynced",
        "attempt 1 restore: buffers (running statistics) differ: rank(s) 0 buffers bn-a; rank(s) 1 buffers bn-b"]


@pytest.mark.parametrize("rank_order", [(0, 1), (1, 0)])
@pytest.mark.parametrize("old_digest", [False, True], ids=["buffers-apart", "digest-covering-buffers"])
def test_every_rank_saving_one_path_is_judged_by_the_bytes_on_disk_not_by_which_event_came_last(
        tmp_path: Path, rank_order: tuple[int, int], old_digest: bool) -> None:
    """Both ranks hashed the same final bytes (rank 1's) after both wrote, each with its own
    statistics; whichever event came last, the restore of rank 1's bytes matches rank 1's save.
    The same for a run of an older probe, whose `digest` covered the statistics too."""
    b = ddp_with_batchnorm(tmp_path / "run", old_digest=old_digest)

    def state(rank: int) -> dict[str, str]:
        return {"digest": f"{digest(4)}+{buffers(4, rank)}"} if old_digest else {"digest": digest(4),
                                                                               "buffers": buffers(4, rank)}
    for rank in rank_order:
        b.attempts[0].emit(rank, "save", step=4, checkpoint="ckpt.pt", content="rank-1-bytes", **state(rank))
    b.attempts[0].crash(1)
    att = b.attempt(2)
    for rank in range(2):
        att.emit(rank, "restore", step=4, checkpoint="ckpt.pt", content="rank-1-bytes", **state(1))
    verdict = check_continuity(b.load())
    assert verdict.valid is True, verdict.to_json()
    assert verdict.counts["restores_checked"] == 2


def test_a_restore_whose_statistics_no_save_of_those_bytes_holds_is_a_discontinuity_naming_buffers(
        tmp_path: Path) -> None:
    b = ddp_with_batchnorm(tmp_path / "run")
    b.attempts[0].emit(0, "save", step=4, checkpoint="ckpt.pt", digest=digest(4), buffers=buffers(4, 0),
                       content="bytes-4")
    b.attempts[0].crash(1)
    restore_on_both(b, 4, "bytes-4", digest(4), "bn-reset")
    verdict = check_continuity(b.load())
    assert verdict.valid is False
    assert verdict.evidence[0].startswith("attempt 1 rank 0 restored ckpt.pt: buffers (running statistics) differ: "
                                          "bn-reset != bn-4-r0 recorded by its save (attempt 0 step 4)"), verdict.evidence


def test_a_restore_of_bytes_a_planned_corrupt_fault_damaged_names_the_fault_and_is_checked(tmp_path: Path) -> None:
    c1 = {"id": "c1", "kind": "corrupt", "how": "flip", "attempt": 1}
    b = ddp_with_batchnorm(tmp_path / "run", faults=[c1])
    b.attempts[0].emit(0, "save", step=4, checkpoint="ckpt.pt", digest=digest(4), buffers=buffers(4, 0),
                       content="bytes-4")
    b.attempts[0].crash(1)
    b.corrupt("c1", "ckpt.pt", 1)
    restore_on_both(b, 4, "flipped-bytes", "state-4-flipped", buffers(4, 0))
    history = b.load()
    atomicity, continuity = check_atomicity(history), check_continuity(history)
    assert atomicity.valid is False
    assert atomicity.evidence[0].startswith("attempt 1 restored ckpt.pt (events/a001-r000-p4100.jsonl:"), atomicity.evidence
    assert "which fault 'c1' had damaged (events/harness.jsonl:" in atomicity.evidence[0]
    assert "never committed" not in atomicity.summary
    assert continuity.valid is False and continuity.counts["restores_checked"] == 2
    assert ("parameters or optimizer state differ: digest state-4-flipped != state-4 recorded by its save "
            "(attempt 0 step 4); its bytes were damaged by fault 'c1' (events/harness.jsonl:") in continuity.evidence[0]


def test_bytes_no_save_committed_and_no_fault_damaged_are_still_never_committed(tmp_path: Path) -> None:
    b = ddp_with_batchnorm(tmp_path / "run")
    b.attempts[0].emit(0, "save", step=4, checkpoint="ckpt.pt", digest=digest(4), content="bytes-4")
    b.attempts[0].crash(1)
    restore_on_both(b, 4, "other-bytes", digest(4), buffers(4, 0))
    verdict = check_atomicity(b.load())
    assert verdict.valid is False and "which was never committed: its bytes (content other-bytes)" in verdict.summary
