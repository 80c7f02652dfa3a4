"""Storage faults through the Storage seam, and checkpoint damage between attempts."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainwreck.faults.plan import Plan
from trainwreck.invariants import History
from tests.faults.conftest import golden_history, run_plan
from trainwreck.trainer.config import TrainConfig


def save_seconds(out, step: int) -> float:  # type: ignore[no-untyped-def]
    [save] = [e for e in out.events("save") if e["step"] == step and e["attempt"] == 0]
    return save["seconds"]


def test_a_stalled_checkpoint_write_slows_the_save_without_breaking_anything(
        tmp_path: Path, golden: History) -> None:
    plan = Plan().storage_stall(seconds=0.5, op="write", step=8).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [stall] = out.fired("storage_stall-1")
    [save] = [e for e in out.events("save") if e["step"] == 8 and e["attempt"] == 0]
    # The stall fired inside the step-8 save, and that save took it (the step-4 save under 0.5 s
    # said "not in that one" only while the machine's fsyncs were fast).
    assert save["t"] - save["seconds"] - 0.01 <= stall["t"] <= save["t"] and save["seconds"] >= 0.5
    assert out.record.attempts == 1 and out.judgement.valid is True, out.explain()


def test_a_stalled_checkpoint_read_delays_the_restore_of_the_next_attempt(tmp_path: Path, golden: History) -> None:
    plan = Plan().kill(rank=1, step=6).storage_stall(seconds=0.3, op="read", attempt=1).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [stall] = out.fired("storage_stall-1")
    [restore] = [e for e in out.events("restore") if e["attempt"] == 1 and e["rank"] == 0]
    assert stall["attempt"] == 1 and restore["t"] - stall["t"] >= 0.3
    assert out.judgement.valid is True, out.explain()


def test_a_throttled_disk_makes_the_save_take_its_size_over_the_bandwidth(tmp_path: Path, golden: History) -> None:
    plan = Plan().storage_throttle(bytes_per_s=50_000, step=4).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    out.fired("storage_throttle-1")
    # A save writes ~25 kB, so at 50 kB/s it takes about half a second.
    assert save_seconds(out, 4) >= 0.4
    assert out.judgement.valid is True, out.explain()


@pytest.mark.parametrize("errno", ["ENOSPC", "EIO"])
def test_a_failed_checkpoint_write_fails_the_attempt_before_the_commit(
        errno: str, tmp_path: Path, golden: History) -> None:
    plan = Plan().storage_error(step=8, errno=errno, nth=3).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [event] = out.fired("storage_error-1")
    assert errno in event["detail"] and out.exit_codes(0)[0] == 1
    assert not [e for e in out.events("save") if e["step"] == 8 and e["attempt"] == 0]
    assert out.restores(1) == {4}
    assert out.judgement.valid is True, out.explain()


def test_a_torn_write_inside_the_temporary_directory_damages_no_checkpoint(tmp_path: Path, golden: History) -> None:
    plan = Plan().torn_write(step=8, nth=1).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [event] = out.fired("torn_write-1")
    assert "checkpoint" not in event and ".tmp-step-00000008" in event["detail"]
    assert out.exit_codes(0)[0] == -9 and out.restores(1) == {4}
    assert out.judgement.valid is True, out.explain()


def test_a_torn_write_of_the_naive_writer_names_the_committed_checkpoint_it_damaged(tmp_path: Path) -> None:
    cfg = TrainConfig.tiny(total_steps=12, variant="naive_writer")
    golden = golden_history(tmp_path / "golden", cfg)
    out = run_plan(Plan().torn_write(step=8, file="model.pt").to_list(), tmp_path / "run", golden, cfg=cfg)
    [event] = out.fired("torn_write-1")
    assert event["checkpoint"] == "step-00000008"
    assert {e["checkpoint"] for e in out.events("reject") if e["attempt"] == 1} >= {"step-00000008"}
    assert out.restores(1) == {4}
    assert out.verdict("atomicity") is True, out.explain()


# ----- corruption between attempts -----------------------------------------------------

KILL_AT_10 = Plan().kill(rank=1, step=10)  # attempt 0 commits 4 and 8, then dies


@pytest.mark.parametrize("how,restored", [("truncate", 4), ("flip", 4), ("delete_manifest", 4)])
def test_a_corrupted_newest_checkpoint_is_rejected_and_the_previous_one_restored(
        how: str, restored: int, tmp_path: Path, golden: History) -> None:
    plan = Plan(list(KILL_AT_10.to_list())).corrupt(how).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [event] = out.fired("corrupt-1")
    assert event["checkpoint"] == "step-00000008" and event["rank"] is None and event["attempt"] == 1
    rejected = [e for e in out.events("reject") if e["attempt"] == 1 and e["checkpoint"] == "step-00000008"]
    assert rejected and rejected[0]["t"] <= min(e["t"] for e in out.events("restore") if e["attempt"] == 1)
    assert out.restores(1) == {restored}
    assert out.judgement.valid is True, out.explain()


def test_breaking_the_two_newest_checkpoints_starts_the_next_attempt_fresh(tmp_path: Path, golden: History) -> None:
    plan = Plan(list(KILL_AT_10.to_list())).corrupt("break_newest_two").to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    damaged = {e["checkpoint"] for e in out.fired("corrupt-1")}
    assert damaged == {"step-00000008", "step-00000004"}
    assert out.restores(1) == set(), "nothing intact is left, so attempt 1 starts from step 0"
    assert out.judgement.valid is True, out.explain()


def test_a_torn_commit_pointer_falls_back_to_the_newest_checkpoint_that_verifies(
        tmp_path: Path, golden: History) -> None:
    plan = Plan(list(KILL_AT_10.to_list())).corrupt("tear_pointer").to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [event] = out.fired("corrupt-1")
    assert "checkpoint" not in event  # the pointer is not a checkpoint
    assert "latest" in {e["checkpoint"] for e in out.events("reject") if e["attempt"] == 1}
    assert out.restores(1) == {8}
    assert out.judgement.valid is True, out.explain()


def test_a_stale_temporary_directory_is_never_restored_and_is_cleaned_up(tmp_path: Path, golden: History) -> None:
    plan = Plan(list(KILL_AT_10.to_list())).corrupt("stale_tmp").to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [event] = out.fired("corrupt-1")
    assert ".tmp-step-00000009-999999" in event["detail"]
    assert out.restores(1) == {8}
    assert not list((tmp_path / "run" / "checkpoints").glob(".tmp-*"))
    assert out.judgement.valid is True, out.explain()
