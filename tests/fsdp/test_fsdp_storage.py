"""FSDP shard writes go through the trainer's one Storage: storage faults reach every rank's
shards, and a comm fault, which FSDP cannot fire, is refused before any process starts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwreck.harness.cli import main as cli
from trainwreck.rundir.layout import iter_events


def run_fsdp(tmp_path: Path, capsys: pytest.CaptureFixture[str], plan: list[dict],
             *more: str) -> tuple[int, dict, list[dict]]:
    out = tmp_path / "run"
    code = cli(["run", "--parallelism", "fsdp", "--plan", json.dumps(plan), "--out", str(out), "--json", *more])
    result = json.loads(capsys.readouterr().out)
    faults = [e for e in iter_events(out, batches=False) if e["kind"] == "fault"]
    return code, result, faults


def test_a_torn_write_in_rank_1_tears_its_own_shard_file_and_the_job_resumes_valid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, result, faults = run_fsdp(tmp_path, capsys, [{"id": "torn-r1", "kind": "torn_write", "rank": 1, "step": 8}])
    assert [(f["fault_id"], f["rank"]) for f in faults] == [("torn-r1", 1)], "the fault never fired in rank 1"
    assert "__1_0.distcp" in faults[0]["detail"], faults[0]["detail"]
    assert code == 0 and result["valid"] is True, result


def test_a_full_disk_under_rank_1s_shard_write_fails_the_save_and_the_job_resumes_valid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, result, faults = run_fsdp(tmp_path, capsys, [{"id": "enospc-r1", "kind": "storage_error", "rank": 1,
                                                        "step": 8, "errno": "ENOSPC"}])
    assert [(f["fault_id"], f["rank"]) for f in faults] == [("enospc-r1", 1)], "the fault never fired in rank 1"
    assert ".tmp-step-00000008-sharded/__1_0.distcp" in faults[0]["detail"], faults[0]["detail"]
    assert code == 0 and result["valid"] is True, result


@pytest.mark.parametrize("kind, extra", [("comm_delay", {"seconds": 0.5}), ("comm_fail", {}),
                                         ("skip_collective", {"expect": "hang"})])
def test_a_comm_fault_under_fsdp_exits_2_naming_the_fault_and_the_fix_before_any_process_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, extra: dict) -> None:
    out = tmp_path / "run"
    plan = [{"id": "c1", "kind": kind, "rank": 1, "step": 5, **extra}]
    assert cli(["run", "--parallelism", "fsdp", "--plan", json.dumps(plan), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"fault 'c1': kind {kind!r}" in err and "parallelism='ddp'" in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists(), "a run directory was written for a plan that was refused"


def test_a_corruption_of_a_shard_no_rank_wrote_is_reported_unfired_with_its_reason_not_a_crash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # At world size 1 only rank 0 writes a shard (__0_0.distcp); the plan names rank 1's.
    plan = [{"id": "kill-r0", "kind": "kill", "rank": 0, "step": 10},
            {"id": "flip-shard", "kind": "corrupt", "how": "flip", "attempt": 1, "file": "__1_0.distcp"}]
    code, result, faults = run_fsdp(tmp_path, capsys, plan, "--world-sizes", "1")
    assert [f["fault_id"] for f in faults] == ["kill-r0"], "the kill fired; the corruption had nothing to damage"
    events = list(iter_events(tmp_path / "run", batches=False))
    [skip] = [e for e in events if e["kind"] == "fault_skip"]
    assert (skip["fault_id"], skip["rank"], skip["attempt"]) == ("flip-shard", 0, 1)
    assert "step-00000008/__1_0.distcp does not exist" in skip["reason"], skip["reason"]
    assert [e["code"] for e in events if e["kind"] == "exit" and e.get("attempt") == 1] == [0], "rank 0 crashed"
    assert result["unfired_faults"] == ["flip-shard"] and result["valid"] == "unknown", result
    assert f"fault flip-shard could not act: {skip['reason']}" in result["notes"], result["notes"]
    assert all(v["valid"] is True for v in result["verdicts"].values()), result["verdicts"]
    assert code == 2
