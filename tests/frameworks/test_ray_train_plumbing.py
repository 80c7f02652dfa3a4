"""Ray Train's rows without Ray: the plumbing that carries the harness into Ray's workers, how a
restarted worker group numbers its attempt, and what the rows say when Ray is not installed."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.commands import frameworks as command
from trainwreck.harness.registry import RAY_TRAIN
from trainwreck.harness.suites import frameworks
from trainwreck.trainer.frameworks import ray_train
from trainwreck.rundir.layout import RunDir
from tests.frameworks.runs import without_extra

RAY_ROWS = ("ray_train", "ray_train_data")


def test_the_workers_get_the_run_directory_and_the_fault_hooks_and_nothing_else() -> None:
    env = {"TRAINWRECK_RUN_DIR": "/runs/r", "TRAINWRECK_HOOKS": "m:f", "TRAINWRECK_ATTEMPT": "3", "HOME": "/root"}
    assert ray_train.worker_env(env) == {"TRAINWRECK_RUN_DIR": "/runs/r", "TRAINWRECK_HOOKS": "m:f"}
    assert ray_train.worker_env({}) == {}


def test_every_simulated_node_binds_loopback_with_one_worker_slot_and_the_head_has_no_dashboard(
        tmp_path: Path) -> None:
    options = ray_train.cluster_options({"TRAINWRECK_RUN_DIR": "/runs/r"})
    assert options["runtime_env"] == {"env_vars": {"TRAINWRECK_RUN_DIR": "/runs/r"}}
    assert options["_node_ip_address"] == "127.0.0.1"
    head, worker = (ray_train.node_options(tmp_path, 2, head=h) for h in (True, False))
    for node in (head, worker):
        assert node["node_ip_address"] == "127.0.0.1" and node["resources"] == {ray_train.SLOT: 1}
        assert node["temp_dir"] == str(tmp_path / "ray")
    assert head["include_dashboard"] is False and "include_dashboard" not in worker


def test_ray_keeps_its_address_file_and_token_in_the_cluster_s_own_folder(tmp_path: Path) -> None:
    env = ray_train.ray_state_env(tmp_path)
    assert env["RAY_TMPDIR"] == str(tmp_path)  # the address file: $RAY_TMPDIR/ray/ray_current_cluster
    assert env["RAY_AUTH_MODE"] == "token" and len(env["RAY_AUTH_TOKEN"]) == 64  # no ~/.ray/auth_token
    assert ray_train.ray_state_env(tmp_path)["RAY_AUTH_TOKEN"] != env["RAY_AUTH_TOKEN"]


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
        for scenario in ("remove-node", "world-size"):  # a node of the simulated cluster lost, not a kill
            job = frameworks.job_for(fw, scenario)
            assert [f["kind"] for f in job.faults] == ["node_loss"] and job.faults[0]["ranks"] == [1]
        assert frameworks.job_for(fw, "world-size").world_sizes == (2, 1)
    torchrun = frameworks.FRAMEWORKS["torchrun"]
    assert not torchrun.runs("remove-node") and torchrun.runs("world-size")
    assert frameworks.job_for(torchrun, "world-size").faults[0]["kind"] == "kill"
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
    assert [(r.scenario, r.valid) for r in told] == [(frameworks.EVERY_OP, "unknown")]
    assert "ray.train.report" in told[0].reason


def test_without_ray_its_rows_are_unknown_with_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    without_extra(monkeypatch, "ray")
    args = argparse.Namespace(out=tmp_path / "out", json=True, frameworks=",".join(RAY_ROWS),
                              scenarios="golden,hang")
    assert command.main(args) == 2
    rows = json.loads(capsys.readouterr().out)
    assert [(r["framework"], r["scenario"], r["valid"]) for r in rows] == [
        (n, s, "unknown") for n in RAY_ROWS for s in ("golden", "hang")]
    assert all("pip install 'trainwreck[ray-train]'" in r["reason"] for r in rows)


def test_the_driver_answers_a_node_removal_request_once_it_has_removed_the_node(tmp_path: Path) -> None:
    from trainwreck.trainer.frameworks.ray_nodes import CONTROL, request_node_removal, serve_node_control

    done: list[str] = []
    control = serve_node_control(tmp_path, lambda: {"node_id": "n1", "pids": [7]}, lambda: done.append("replaced"))
    try:
        assert request_node_removal(tmp_path, 30) == {"node_id": "n1", "pids": [7]}
        assert request_node_removal(tmp_path, 30)["node_id"] == "n1"  # the driver serves every request
    finally:
        control.unlink()
    assert control == tmp_path / CONTROL and not list(tmp_path.iterdir())  # the reply FIFO went too
    assert done[:1] == ["replaced"]


def test_a_node_removal_nobody_serves_or_that_fails_is_an_error_not_a_wait(tmp_path: Path) -> None:
    import os

    from trainwreck.trainer.frameworks.ray_nodes import request_node_removal, serve_node_control

    assert "serves no node control" in request_node_removal(tmp_path, 30)["error"]
    os.mkfifo(tmp_path / "ray_node_control")  # a FIFO nobody reads: the same answer, at once
    assert "serves no node control" in request_node_removal(tmp_path, 30)["error"]

    def refuse() -> dict[str, Any]:
        raise ValueError("Removing a node that is connected to this Ray client is not allowed")

    replaced: list[bool] = []
    control = serve_node_control(tmp_path, refuse, lambda: replaced.append(True))
    try:
        assert request_node_removal(tmp_path, 30) == {
            "error": "ValueError: Removing a node that is connected to this Ray client is not allowed"}
    finally:
        control.unlink()
    assert not replaced  # nothing removed, nothing replaced


def test_corrupt_newest_aims_at_the_checkpoint_ray_registered_last_not_the_newest_announced(tmp_path: Path) -> None:
    from trainwreck.harness.supervise.raytrain import SNAPSHOT, STORAGE, on_registered, registered_newest

    assert registered_newest(tmp_path) is None
    (tmp_path / STORAGE).mkdir(parents=True)
    snapshot = {"checkpoint_results": [{"checkpoint_dir_name": "checkpoint_000003"}],
                "latest_checkpoint_result": {"checkpoint_dir_name": "checkpoint_000003", "metrics": {}}}
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text(json.dumps(snapshot))
    (tmp_path / STORAGE / SNAPSHOT).symlink_to(outside)
    assert registered_newest(tmp_path) is None, "a snapshot that is a link out of the run directory is not read"
    (tmp_path / STORAGE / SNAPSHOT).unlink()
    (tmp_path / STORAGE / SNAPSHOT).write_text(json.dumps(snapshot))
    assert registered_newest(tmp_path) == "checkpoint_000003"
    plan = [{"id": "k", "kind": "kill", "rank": 1, "step": 8},
            {"id": "cut", "kind": "corrupt", "how": "truncate", "target": "newest", "attempt": 1}]
    assert on_registered(plan, 1, "checkpoint_000003")[1]["target"] == "checkpoint_000003"
    assert on_registered(plan, 2, "checkpoint_000003") == plan  # another attempt's corruption is left alone
    assert "no checkpoint registered" in on_registered(plan, 1, None)[1]["target"]


def test_the_ray_folder_of_a_driver_the_harness_had_to_kill_is_removed_and_nothing_else(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    session = tmp_path / "tw-ray-abc"
    (session / "ray").mkdir(parents=True)
    (run / ray_train.SESSION_NOTE).write_text(str(session))
    assert ray_train.remove_session(run) == session and not session.exists()
    assert not (run / ray_train.SESSION_NOTE).exists()
    assert ray_train.remove_session(run) is None  # no note: nothing to do
    (run / ray_train.SESSION_NOTE).write_text(str(run))  # a note naming another folder is not followed
    assert ray_train.remove_session(run) is None and run.is_dir()


def test_a_shrinking_schedule_reaches_the_driver_as_its_elastic_minimum(tmp_path: Path) -> None:
    from trainwreck.harness.supervise.raytrain import driver_env

    assert driver_env(tmp_path, 1, (2, 1))["TRAINWRECK_MIN_WORKERS"] == "1"
    assert driver_env(tmp_path, 1, (2,))["TRAINWRECK_MIN_WORKERS"] == "2"  # the script's --workers: fixed size
    spec = frameworks.job_spec(frameworks.job_for(frameworks.FRAMEWORKS["ray_train"], "world-size"), tmp_path)
    assert [spec.world_size_for(a) for a in (0, 1, 2)] == [2, 1, 1]  # what the launcher watches per attempt


def test_a_growing_schedule_under_the_ray_driver_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from trainwreck.harness.errors import SpecError
    from trainwreck.harness.supervise.command.target import Command
    from trainwreck.harness.supervise.spec import JobSpec

    with pytest.raises(SpecError, match=r"world_sizes=\[1, 2\] grows to 2: the ray-driver launcher's group only "
                                        r"shrinks .* e\.g\. world_sizes=\(2, 1\)"):
        JobSpec(target=Command("python ray_train.py"), world_sizes=(1, 2), launcher=RAY_TRAIN, run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    JobSpec(target=Command("python ray_train.py"), world_sizes=(2, 1), launcher=RAY_TRAIN)  # shrinking is fine
