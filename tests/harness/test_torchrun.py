"""The torchrun launcher, and the multi-host recipe run as two agents on loopback."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from trainwreck.harness.supervise.create_rundir import create_run_dir
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.harness.supervise.torchrun import torchrun_env
from tests.harness.conftest import assert_no_leftover_processes, harness_events, read_events
from trainwreck.trainer.config import TrainConfig

pytestmark = pytest.mark.slow  # every rank is a fresh interpreter importing torch: ~10 s per attempt


def test_the_torchrun_launcher_restarts_a_killed_worker_with_its_own_semantics(tmp_path: Path) -> None:
    run = tmp_path / "run"
    plan = [{"id": "k1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 6}]
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=10), world_sizes=(2,), plan=plan,
                             launcher="torchrun", run_dir=run))
    assert (record.outcome, record.attempts, record.final_step) == ("completed", 2, 10)
    assert [e["fault_id"] for e in harness_events(run, "fault")] == ["k1"]
    restarted = {e["attempt"] for e in read_events(run, "a*.jsonl") if e["kind"] == "start"}
    assert restarted == {0, 1}  # torchrun's restart count is the attempt number
    assert_no_leftover_processes()


def free_port() -> int:
    # Probe-then-bind races with anything else binding meanwhile; the harness never does
    # this. It is acceptable only here, because two independent torchrun agents must be
    # told one rendezvous endpoint in advance, exactly as two hosts would be.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_agents_on_loopback_run_the_job_like_two_hosts(tmp_path: Path) -> None:
    spec = JobSpec(config=TrainConfig.tiny(total_steps=8), world_sizes=(2,), launcher="torchrun",
                   run_dir=tmp_path / "run")
    run = create_run_dir(spec)  # on real hosts: the same run.json on each (or a shared filesystem)
    endpoint, rdzv_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    agents = []
    try:
        for node in range(2):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
                   "--max-restarts", "0", "--log-dir", str(run / "logs" / f"torchelastic{node}"),
                   "-m", "trainwreck.harness.launch.rank", "--run-dir", str(run), "--standalone"]
            agents.append(subprocess.Popen(cmd, env=torchrun_env(), start_new_session=True,
                                           stdout=open(run / "logs" / f"agent{node}.log", "wb"),
                                           stderr=subprocess.STDOUT))
        codes = [a.wait(timeout=240) for a in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    logs = "".join((run / "logs" / f"agent{n}.log").read_text()[-2000:] for n in range(2))
    assert codes == [0, 0], logs
    events = read_events(run, "a*.jsonl")
    assert {e["rank"] for e in events if e["kind"] == "step" and e["step"] == 8} == {0, 1}
    ends = [e for e in events if e["kind"] == "end"]
    assert [(e["rank"], e["status"], e["final_step"]) for e in ends] == [(0, "completed", 8)]
    assert_no_leftover_processes()


def test_a_torchrun_run_leaves_no_torchelastic_directory_in_the_temp_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "tmp"  # private, so parallel runs cannot add or hide directories here
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the agent inherits it and would mkdtemp there
    run = tmp_path / "run"
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=4), world_sizes=(2,), launcher="torchrun",
                             run_dir=run, max_restarts=0))
    assert record.outcome == "completed"
    assert sorted(p.name for p in tmp.glob("torchelastic_*")) == []
    assert list((run / "logs" / "torchelastic").iterdir()), "the agent wrote its logs somewhere else"
    assert_no_leftover_processes()
