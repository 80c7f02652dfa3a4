"""Ray Train's rows without Ray: the plumbing that carries the harness into Ray's workers, how a
restarted worker group numbers its attempt, and what the rows say when Ray is not installed."""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.commands import frameworks as command
from trainwreck.harness.registry import RAY_TRAIN
from trainwreck.harness.suites import frameworks
from trainwreck.trainer.frameworks import ray_train
from trainwreck.rundir.layout import RunDir

RAY_ROWS = ("ray_train", "ray_train_data")


def test_the_workers_get_the_run_directory_and_the_fault_hooks_and_nothing_else() -> None:
    env = {"TRAINWRECK_RUN_DIR": "/runs/r", "TRAINWRECK_HOOKS": "m:f", "TRAINWRECK_ATTEMPT": "3", "HOME": "/root"}
    assert ray_train.worker_env(env) == {"TRAINWRECK_RUN_DIR": "/runs/r", "TRAINWRECK_HOOKS": "m:f"}
    assert ray_train.worker_env({}) == {}


def test_the_local_cluster_binds_loopback_without_a_dashboard_and_passes_the_env() -> None:
    options = ray_train.cluster_options({"TRAINWRECK_RUN_DIR": "/runs/r"})
    assert options["address"] == "local" and options["_node_ip_address"] == "127.0.0.1"
    assert options["include_dashboard"] is False
    assert options["runtime_env"] == {"env_vars": {"TRAINWRECK_RUN_DIR": "/runs/r"}}


def test_a_restarted_group_takes_the_attempt_after_the_last_one_its_ranks_logged(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert ray_train.group_attempt(tmp_path) == 0
    run.events.mkdir(parents=True)
    run.harness_events.write_text(json.dumps({"kind": "attempt", "attempt": 0, "t": 0}) + "\n")
    assert ray_train.group_attempt(tmp_path) == 0  # the supervisor's attempt 0 is the first group's
    run.rank_events(0, 1, 123).write_text("")
    run.rank_events(1, 0, 456).write_text("")
    assert ray_train.group_attempt(tmp_path) == 2


def test_ray_train_jobs_run_under_the_ray_train_launcher_with_the_restart_budget(tmp_path: Path) -> None:
    for name in RAY_ROWS:
        fw = frameworks.FRAMEWORKS[name]
        job = frameworks.job_for(fw, "kill-mid-epoch")
        spec = frameworks.job_spec(job, tmp_path / name)
        assert spec.launcher == RAY_TRAIN and spec.max_restarts == 1 and spec.world_sizes == (2,)
        assert job.faults[0]["kind"] == "kill" and job.faults[0]["rank"] == 1
    assert "--data" in frameworks.FRAMEWORKS["ray_train_data"].command()
    assert frameworks.FRAMEWORKS["ray_train_data"].command()[-1] == "dataset"


def test_a_scenario_ray_does_not_run_is_an_unknown_row_naming_why(tmp_path: Path) -> None:
    class Ran(Exception):
        pass

    def runner(job: Any, run_dir: Path) -> Any:
        raise Ran(job.scenario)

    fw = frameworks.FRAMEWORKS["ray_train"]
    if not fw.installed():
        pytest.skip("without ray every row is the install row (the next test)")
    told: list[frameworks.Row] = []
    with pytest.raises(Ran, match="golden"):  # only the golden row is run, after the rows that are not
        frameworks._framework_rows(fw, tmp_path, runner, ["world-size", frameworks.EVERY_OP], told.append)
    assert [(r.scenario, r.valid) for r in told] == [("world-size", "unknown"), (frameworks.EVERY_OP, "unknown")]
    assert "elastic.py" in told[0].reason and "ray.train.report" in told[1].reason


def test_without_ray_its_rows_are_unknown_with_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "ray" else real(name, *args)

    monkeypatch.setattr(frameworks.importlib.util, "find_spec", find_spec)
    args = argparse.Namespace(out=tmp_path / "out", json=True, frameworks=",".join(RAY_ROWS),
                              scenarios="golden,hang")
    assert command.main(args) == 2
    rows = json.loads(capsys.readouterr().out)
    assert [(r["framework"], r["scenario"], r["valid"]) for r in rows] == [
        (n, s, "unknown") for n in RAY_ROWS for s in ("golden", "hang")]
    assert all("pip install 'trainwreck[ray-train]'" in r["reason"] for r in rows)
