"""Bad input fails with a clear message before any process starts."""
from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from trainwreck.faults.external import ExternalFaults, FaultError
from trainwreck.harness.supervise.create_rundir import RunDirError
from trainwreck.harness.supervise.spec import JobSpec, SpecError
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.trainer.config import TrainConfig


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_world_size_that_does_not_divide_the_global_batch_is_refused_listing_the_ones_that_do() -> None:
    with pytest.raises(SpecError, match=r"world size 3 does not divide global_batch=16.*1, 2, 4, 8, 16"):
        JobSpec(config=TrainConfig.tiny(), world_sizes=(2, 3))


def test_an_unknown_launcher_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(SpecError, match="unknown launcher 'mpirun'; known launchers: warm, spawn, torchrun"):
        JobSpec(config=TrainConfig.tiny(), launcher="mpirun")


def test_torchrun_with_a_changing_world_size_is_refused() -> None:
    with pytest.raises(SpecError, match="cannot change between attempts"):
        JobSpec(config=TrainConfig.tiny(), world_sizes=(4, 2), launcher="torchrun")


def test_a_run_directory_that_already_holds_a_run_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("{}")
    before = children()
    with pytest.raises(RunDirError, match="already holds a run.*pick another --out or remove it"):
        run_job(JobSpec(config=TrainConfig.tiny(), run_dir=tmp_path))
    assert children() <= before


def test_a_run_directory_that_is_not_writable_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        target = Path("/sys/trainwreck-not-writable")  # root ignores permission bits; sysfs does not
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        target = locked / "run"
    before = children()
    with pytest.raises(RunDirError, match="not writable.*pick another --out"):
        run_job(JobSpec(config=TrainConfig.tiny(), run_dir=target))
    assert children() <= before


@pytest.mark.parametrize("fault, message", [
    ({"id": "s1", "kind": "signal", "rank": 0, "signal": "SIGHUP", "step": 3}, "'s1': signal='SIGHUP' is not one of"),
    ({"id": "s2", "kind": "signal", "rank": "1", "step": 3, "signal": "SIGKILL"}, "'s2': rank='1' must be an integer"),
    ({"id": "s3", "kind": "signal", "rank": 1, "signal": "SIGKILL"}, "'s3': give exactly one of 'step'"),
    ({"id": "n1", "kind": "node_loss", "ranks": [], "at_s": 1}, "'n1': kind 'node_loss' needs 'ranks'"),
    ({"id": "n2", "kind": "node_loss", "ranks": [0], "at_s": -1}, "'n2': at_s=-1 must be"),
])
def test_a_malformed_external_fault_names_its_id_and_field(fault: dict, message: str) -> None:
    with pytest.raises(FaultError, match=message):
        ExternalFaults([fault])
    with pytest.raises(SpecError, match=message):
        JobSpec(config=TrainConfig.tiny(), plan=[fault])


def test_external_faults_fire_once_at_their_step_or_time_and_not_before_their_attempt() -> None:
    faults = ExternalFaults([
        {"id": "k", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 5},
        {"id": "t", "kind": "node_loss", "ranks": [0, 1], "at_s": 2.0, "from_attempt": 1},
        {"id": "x", "kind": "kill", "rank": 0, "step": 1},  # in-rank: not the harness's
        {"id": "big", "kind": "signal", "rank": 3, "signal": "SIGTERM", "step": 1},
    ])
    assert [f.id for f in faults.faults] == ["k", "t", "big"]
    assert faults.due(0, {0: 9, 1: 4}, 5.0, world_size=2) == []
    assert [f.id for f in faults.due(0, {0: 9, 1: 5}, 5.0, world_size=2)] == ["k"]
    assert faults.due(0, {0: 9, 1: 6}, 5.0, world_size=2) == []  # once per run
    assert faults.due(1, {}, 1.9, world_size=2) == []
    assert [f.id for f in faults.due(1, {}, 2.0, world_size=2)] == ["t"]
    assert [f.id for f in faults.due(2, {3: 1}, 0.0, world_size=4)] == ["big"]  # rank 3 exists now


@pytest.mark.parametrize("hang_s, exit_s, budget_s", [(2.0, None, 30.0), (20.0, None, 60.0), (2.0, 1.5, 1.5)])
def test_the_exit_budget_is_three_hang_budgets_at_least_30_s_unless_given(hang_s: float, exit_s: float | None,
                                                                           budget_s: float) -> None:
    assert JobSpec(config=TrainConfig.tiny(), hang_timeout_s=hang_s, exit_timeout_s=exit_s).exit_budget_s == budget_s


@pytest.mark.parametrize("exit_s, message", [(0.0, "exit_timeout_s=0.0 must be > 0"),
                                             (float("nan"), "exit_timeout_s=nan is not a finite number"),
                                             (7200.0, "exit_timeout_s=7200.0 exceeds the limit of 3600 s")])
def test_an_unusable_exit_budget_is_refused_naming_the_field(exit_s: float, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        JobSpec(config=TrainConfig.tiny(), exit_timeout_s=exit_s)
