"""The power-loss sweep (harness/suites/sweep.py run_sweep with power_loss): every save of a real job
recorded in-rank, each crash state materialised as a run directory whose event log is cut
at the power cut, the job resumed from it as its next attempt and judged by every invariant."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.conftest import assert_no_leftover_processes, harness_events, rank_events
from trainwreck.faults.powerloss import LowOp, OpLog
from trainwreck.rundir.layout import next_attempt
from trainwreck.harness.suites.sweep import SweepRequest, SweepResult, cut_events, cut_time, run_sweep


def resumed_attempts(run_dir: str) -> set[int]:
    return {e["attempt"] for e in harness_events(Path(run_dir), "attempt")}


def test_a_few_reference_power_loss_states_resume_as_real_runs_and_are_all_valid(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_sweep(SweepRequest("reference", power_loss=True, limit=4), out=tmp_path, progress=lines.append)
    assert len(result.rows) == 4 and result.explored >= 50, result.stats
    assert result.failures == [], [r.to_json() for r in result.rows if r.verdict is not True]
    # The fault fired: the states judged lost or tore unsynced ops, not only clean cuts.
    assert any(r.lost or r.torn for r in result.rows), [r.description for r in result.rows]
    for row in result.rows:
        assert resumed_attempts(row.run_dir) == {0, 1}, "the job did not resume as attempt 1 after the cut"
        assert Path(row.report).is_file() and json.loads(Path(row.run_dir, "verdicts.json").read_text())["valid"]
    assert len(lines) == 5 and lines[0].startswith("reference: ") and "explored" in lines[0]
    assert_no_leftover_processes()


def test_rename_without_fsync_fails_a_power_loss_state_and_says_what_the_disk_lost(tmp_path: Path) -> None:
    result = run_sweep(SweepRequest("rename_no_fsync", power_loss=True, limit=3), out=tmp_path)
    first = result.first_failure
    assert first is not None, [r.description for r in result.rows]
    assert first.verdict is False and first.failing, first.to_json()
    assert "the power failed right after op" in first.description
    assert any(word in first.description for word in ("is missing", "is empty", "holds only")), first.description
    assert first.to_json()["valid"] is False and result.to_json()["failures"] >= 1
    assert_no_leftover_processes()


def op_at(index: int, t: float) -> LowOp:
    return LowOp(index, "mkdir", f"d{index}", inode=index + 1, parent=0, name=f"d{index}", t=t)


def test_the_event_log_is_cut_just_before_the_op_the_power_failed_at(tmp_path: Path) -> None:
    observed, dest = tmp_path / "observed", tmp_path / "dest"
    (observed / "events").mkdir(parents=True)
    (observed / "events" / "a000-r000-p1.jsonl").write_text(
        "".join(json.dumps({"kind": "step", "t": t, "step": t}) + "\n" for t in (1, 2, 3, 4)))
    (observed / "events" / "harness.jsonl").write_text(
        json.dumps({"kind": "attempt", "attempt": 0, "t": 0.5}) + "\n" + json.dumps({"kind": "exit", "t": 9}) + "\n")
    log = OpLog({}, {".": 0}, [op_at(0, 2.5), op_at(1, 3.5)])
    cut_events(observed, dest, cut_time(log, 1, observed))
    assert [e["t"] for e in rank_events(dest, "step")] == [1, 2, 3]
    assert [e["kind"] for e in harness_events(dest)] == ["attempt"]
    # After the last op, the cut is just before the first rank exit: every step is kept.
    assert cut_time(log, 2, observed) == 9


def test_a_job_starts_at_attempt_0_in_a_fresh_run_dir_and_after_the_last_attempt_of_an_old_one(
        tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    assert next_attempt(tmp_path) == 0
    (tmp_path / "events" / "harness.jsonl").write_text(
        "".join(json.dumps({"kind": "attempt", "attempt": a, "t": a}) + "\n" for a in (0, 1, 2)))
    assert next_attempt(tmp_path) == 3


@pytest.mark.parametrize("argv,expected", [
    (["--points", "1:after"], "with --power-loss use --limit"),
    (["--limit", "0"], "--limit 0 judges nothing"),
])
def test_bad_power_loss_arguments_exit_2_with_one_line_naming_the_fix(
        tmp_path: Path, argv: list[str], expected: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "trainwreck.harness.cli", "sweep", "--power-loss", *argv,
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def reference_power_loss(tmp_path_factory: pytest.TempPathFactory) -> SweepResult:
    return run_sweep(SweepRequest("reference", power_loss=True), out=tmp_path_factory.mktemp("powerloss"))


@pytest.mark.slow
def test_the_reference_save_survives_every_generated_power_loss_state(reference_power_loss: SweepResult) -> None:
    result = reference_power_loss
    assert len(result.rows) == result.explored >= 50, result.stats
    assert result.failures == [], [(r.state, r.description, r.summary) for r in result.failures]
    assert sum(1 for r in result.rows if r.lost or r.torn) >= 10, "too few states lost anything"


@pytest.mark.slow
def test_rename_without_fsync_fails_many_of_sixty_power_loss_states(tmp_path: Path) -> None:
    result = run_sweep(SweepRequest("rename_no_fsync", power_loss=True, limit=60), out=tmp_path)
    assert len(result.rows) == 60 and len(result.failures) >= 1
    assert all(r.failing for r in result.failures), "a failing state must name its invariant"


def test_dcp_commit_can_lose_a_checkpoint_that_dcp_save_returned_and_the_state_is_described(tmp_path: Path) -> None:
    from trainwreck.faults.powerloss import DCP_DIR, DCP_EARLIER
    result = run_sweep(SweepRequest("dcp", power_loss=True), out=tmp_path)
    first = result.first_failure
    assert first is not None and first.point == len(result.ops), "only a cut after dcp.save returned loses the commit"
    assert f"{DCP_DIR} is missing" in first.description and "dcp.save had returned" in first.summary
    assert any(r.verdict is True and r.point == len(result.ops) for r in result.rows), "the check must also pass"
    assert not any(DCP_EARLIER in r.summary for r in result.failures), "the durable earlier save was damaged"
    assert json.loads(Path(first.report).read_text())["valid"] is False
