"""The supervisor against the real trainer (TrainConfig.tiny) under the warm launcher."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from tests.harness.conftest import assert_no_leftover_processes, harness_events, rank_events, read_events, silent_since
from trainwreck.trainer.config import TrainConfig


def fired(run_dir: Path, fault_id: str) -> dict:
    events = [e for e in harness_events(run_dir, "fault") if e["fault_id"] == fault_id]
    assert len(events) == 1, f"fault {fault_id} fired {len(events)} times"
    return events[0]


def test_a_clean_job_completes_in_one_attempt_and_writes_the_run_directory(tmp_path: Path) -> None:
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=8), world_sizes=(2,), run_dir=tmp_path / "run"))
    assert (record.status, record.outcome, record.attempts, record.final_step) == ("completed", "completed", 1, 8)
    run = tmp_path / "run"
    assert (run / "run.json").exists() and (run / "checkpoints").is_dir()
    end = harness_events(run, "end")
    assert end == [dict(end[0], status="completed", final_step=8)]
    assert sorted((e["rank"], e["code"]) for e in harness_events(run, "exit")) == [(0, 0), (1, 0)]
    assert not list((run / "stacks").iterdir())  # stack files are kept only when they hold a dump
    assert_no_leftover_processes()


def test_a_killed_rank_restarts_the_job_from_the_newest_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    plan = [{"id": "k1", "kind": "signal", "rank": 0, "signal": "SIGKILL", "step": 6}]
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=12), world_sizes=(2,), plan=plan, run_dir=run))
    assert (record.outcome, record.attempts, record.final_step) == ("completed", 2, 12)
    fault = fired(run, "k1")
    exits = [e for e in harness_events(run, "exit") if e["attempt"] == 0 and e["rank"] == 0]
    assert exits[0]["code"] == -9 and exits[0]["t"] >= fault["t"]
    restores = {e["step"] for e in rank_events(run, "restore") if e["attempt"] == 1}
    assert restores == {4}  # ckpt_interval=4 and the kill landed in update 6
    assert_no_leftover_processes()


def test_a_sigstopped_rank_is_reported_within_the_timeout_plus_one_second_with_every_stack(tmp_path: Path) -> None:
    run, timeout = tmp_path / "run", 2.0
    plan = [{"id": "h1", "kind": "signal", "rank": 1, "signal": "SIGSTOP", "step": 3, "expect": "hang"}]
    # External step triggers are polled (20 ms), so the stop can land a step or two late;
    # with the only save at step 8 it cannot land in the checkpoint phase, whose budget
    # (3x the timeout) is deliberately longer than the bound asserted below.
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=8, ckpt_interval=8), world_sizes=(2,),
                             plan=plan, hang_timeout_s=timeout, run_dir=run))
    assert (record.outcome, record.hangs, record.attempts) == ("completed", 1, 2)
    fault = fired(run, "h1")
    [hang] = harness_events(run, "hang")
    assert hang["attempt"] == 0 and 1 in hang["ranks"] and hang["t"] > fault["t"]
    # The explicit latency bound of the issue: detected within hang_timeout_s + 1 s of the last
    # progress any rank published (counted from the fault, rank 0's way to its all-reduce on a
    # loaded machine was part of it).
    assert hang["t"] - silent_since(run, 0, 2) <= timeout + 1.0
    pids = {e["rank"]: e["pid"] for e in rank_events(run, "start") if e["attempt"] == 0}
    expected = {f"stacks/a000-r{r:03d}-p{pid}.txt" for r, pid in pids.items()}
    assert set(hang["stacks"]) == expected
    for name in expected:
        text = (run / name).read_text()
        assert "File " in text and "most recent call first" in text, text
    assert_no_leftover_processes()


def test_a_rank_three_times_slower_than_the_others_is_not_reported_as_hung(tmp_path: Path) -> None:
    run = tmp_path / "run"
    plan = [{"id": "slow1", "kind": "test_straggler", "rank": 1, "factor": 3, "base_s": 0.2}]
    # A slow step (0.6 s) is 60% of the budget: close enough that a watchdog blaming the
    # waiting ranks, or timing ranks one by one, would fire; ours must not.
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=6), world_sizes=(2,), plan=plan,
                             hang_timeout_s=1.0, run_dir=run,
                             hooks_factory="tests.harness.straggler_hooks:build_hooks"))
    assert [e["fault_id"] for e in rank_events(run, "fault")] == ["slow1"]  # the straggler was slow
    assert (record.outcome, record.attempts, record.hangs) == ("completed", 1, 0)
    assert harness_events(run, "hang") == []
    assert_no_leftover_processes()


def test_restarts_that_do_not_advance_the_checkpoint_stop_as_no_progress(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # Every attempt is killed before its first checkpoint (step 4), so restarts go nowhere.
    plan = [{"id": f"k{i}", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 2, "from_attempt": i}
            for i in range(4)]
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=12), world_sizes=(2,), plan=plan,
                             max_restarts=5, run_dir=run))
    assert (record.status, record.outcome, record.attempts) == ("failed", "no_progress", 2)
    assert [fired(run, f"k{i}")["attempt"] for i in range(2)] == [0, 1]
    assert harness_events(run, "end")[0]["outcome"] == "no_progress"
    assert_no_leftover_processes()


def test_the_restart_budget_ends_a_job_whose_every_attempt_fails(tmp_path: Path) -> None:
    run = tmp_path / "run"
    plan = [{"id": "k0", "kind": "signal", "rank": 0, "signal": "SIGTERM", "step": 5},
            {"id": "k1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 10, "from_attempt": 1}]
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=12), world_sizes=(2,), plan=plan,
                             max_restarts=1, run_dir=run))
    assert (record.status, record.outcome, record.attempts) == ("failed", "budget_exhausted", 2)
    fired(run, "k0"), fired(run, "k1")
    assert record.final_step >= 8  # attempt 1 restored checkpoint 4 and got past step 8
    assert_no_leftover_processes()


def test_the_world_size_schedule_gives_each_attempt_its_planned_size(tmp_path: Path) -> None:
    run = tmp_path / "run"
    plan = [{"id": "n1", "kind": "node_loss", "ranks": [2, 3], "step": 6}]
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=10), world_sizes=(4, 2), plan=plan, run_dir=run))
    assert (record.outcome, record.attempts) == ("completed", 2)
    fault = fired(run, "n1")
    assert fault["rank"] is None and fault["ranks"] == [2, 3]
    sizes = {(e["attempt"], e["world_size"]) for e in rank_events(run, "start")}
    assert sizes == {(0, 4), (1, 2)}
    assert_no_leftover_processes()


@pytest.mark.slow
def test_the_spawn_launcher_runs_and_restarts_the_same_job(tmp_path: Path) -> None:
    run = tmp_path / "run"
    plan = [{"id": "k1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 6}]
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=10), world_sizes=(2,), plan=plan,
                             launcher="spawn", run_dir=run))
    assert (record.outcome, record.attempts, record.final_step) == ("completed", 2, 10)
    fired(run, "k1")
    assert_no_leftover_processes()


def test_an_agent_that_never_restarts_its_group_ends_the_job_as_no_progress_saying_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray Train waits forever for a node that is not coming back: the harness must not wait with it."""
    import threading

    from trainwreck.harness.registry import RAY_TRAIN, LauncherKind
    from trainwreck.harness.supervise.command.target import Command

    monkeypatch.setattr(LauncherKind, "startup_budget_s", lambda self, hang_timeout_s, cuda=False: hang_timeout_s)
    agent = f"{sys.executable} -c 'import time; time.sleep(600)'"  # runs, and starts no worker ever
    spec = JobSpec(target=Command(agent), launcher=RAY_TRAIN, hang_timeout_s=2.0, run_dir=tmp_path / "run")
    records = []
    job = threading.Thread(target=lambda: records.append(run_job(spec)), daemon=True)
    job.start()
    job.join(timeout=120)
    assert not job.is_alive(), "the harness waited on an agent that never restarted its group"
    assert records[0].outcome == "no_progress"
    end = [e for e in read_events(tmp_path / "run") if e["kind"] == "end"]
    assert end and "no worker group followed attempt 0 within" in end[0]["reason"]
    assert_no_leftover_processes()
