"""No orphans: random kills across many attempts, and a SIGTERMed harness, leave nothing."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from tests.harness.conftest import assert_no_leftover_processes, harness_events, wait_until
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.progress import read_progress
from trainwreck.rundir.layout import RunDir

REPO = Path(__file__).resolve().parents[2]


def random_kill_plan(rng: random.Random, attempts: int) -> list[dict]:
    """One kill per attempt at a random moment (often during start-up), of one rank or all."""
    plan = []
    for i in range(attempts):
        at_s = round(rng.uniform(0.0, 0.4), 3)
        if rng.random() < 0.3:
            plan.append({"id": f"n{i}", "kind": "node_loss", "ranks": [0, 1], "at_s": at_s, "from_attempt": i})
        else:
            plan.append({"id": f"k{i}", "kind": "signal", "rank": rng.randrange(2),
                         "signal": rng.choice(["SIGKILL", "SIGTERM"]), "at_s": at_s, "from_attempt": i})
    return plan


def run_random_kills(total_attempts: int, per_job: int, seed: int, tmp: Path) -> None:
    rng = random.Random(seed)
    # Never finishes on its own, so every attempt ends by a kill; checkpoints are rare.
    cfg = TrainConfig.tiny(total_steps=10**6, ckpt_interval=10**6)
    done = 0
    while done < total_attempts:
        n = min(per_job, total_attempts - done)
        record = run_job(JobSpec(config=cfg, world_sizes=(2,), plan=random_kill_plan(rng, n),
                                 max_restarts=n - 1, no_progress_patience=n, keep=False))
        assert (record.outcome, record.attempts) == ("budget_exhausted", n)
        assert not record.run_dir.exists()
        done += n
        assert_no_leftover_processes()
    assert list(tmp.iterdir()) == []  # every temporary run directory was removed


def test_twenty_attempts_with_random_kills_leave_no_process_and_no_temporary_directory(private_tmp: Path) -> None:
    run_random_kills(20, per_job=10, seed=1, tmp=private_tmp)


@pytest.mark.slow
def test_two_hundred_attempts_with_random_kills_leave_no_process_and_no_temporary_directory(
        private_tmp: Path) -> None:
    run_random_kills(200, per_job=20, seed=2, tmp=private_tmp)


HARNESS_SCRIPT = """
import sys
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.trainer.config import TrainConfig
run_job(JobSpec(config=TrainConfig.tiny(total_steps=10**6, ckpt_interval=10**6), world_sizes=(2,),
                hang_timeout_s=60, run_dir=sys.argv[1], launcher=sys.argv[2]))
"""


@pytest.mark.parametrize("launcher", ["warm", pytest.param("spawn", marks=pytest.mark.slow)])
def test_a_sigtermed_harness_leaves_no_process_behind(tmp_path: Path, launcher: str) -> None:
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    harness = subprocess.Popen([sys.executable, "-c", HARNESS_SCRIPT, str(run), launcher], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def ranks_running() -> bool:
            boards = [read_progress(RunDir(run).rank_progress(0, r)) for r in range(2)]
            return all(b is not None and b.step >= 1 for b in boards)

        wait_until(ranks_running, 180, "both ranks to reach step 1")
        pids = [read_progress(RunDir(run).rank_progress(0, r)).pid for r in range(2)]  # type: ignore[union-attr]
        started = psutil.Process(harness.pid).children(recursive=True)  # fork server and ranks
        assert set(pids) <= {p.pid for p in started}
        harness.send_signal(signal.SIGTERM)
        output = harness.communicate(timeout=60)[0].decode(errors="replace")
        assert harness.returncode == 143, output
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
    gone, alive = psutil.wait_procs(started, timeout=15)
    assert alive == [], f"left behind: {alive}"
    assert all(not psutil.pid_exists(pid) for pid in pids)
    end = harness_events(run, "end")
    assert [(e["status"], e["outcome"], e["signal"]) for e in end] == [("interrupted", "interrupted", "SIGTERM")]
    assert {(e["rank"], e["code"], e["stopped_by_harness"]) for e in harness_events(run, "exit")} == \
        {(0, -9, True), (1, -9, True)}


def test_a_harness_sigkilled_while_it_builds_a_golden_run_leaves_no_child_alive(tmp_path: Path) -> None:
    """The fork server is started, then spends seconds importing torch: a harness SIGKILLed in
    that window (the first thing a golden build does) must take it down at once, as it does mid-run."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TRAINWRECK_GOLDEN_CACHE=str(tmp_path / "cache"))
    harness = subprocess.Popen([sys.executable, "-m", "trainwreck.harness.cli", "run", "--total-steps", "4",
                                "--out", str(tmp_path / "run")], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[psutil.Process] = []
    try:
        def started_a_child() -> bool:
            children[:] = psutil.Process(harness.pid).children(recursive=True)
            return bool(children)

        wait_until(started_a_child, 180, "the golden build to start its fork server")
        harness.kill()
        harness.wait()
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
    # Each child must die within a second (torch's import alone takes longer); a zombie has
    # died, only its reaping by whoever inherited it is left.
    def still_running() -> list[psutil.Process]:
        alive = []
        for proc in children:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        return alive

    try:
        wait_until(lambda: not still_running(), 1.0, "every child of the SIGKILLed harness to die")
    finally:
        for proc in still_running():
            proc.kill()  # psutil checks the pid is still the process we saw
