"""A fork server forked from the harness's own process (launchers.py `ForkedServer`): it starts as a
fresh interpreter's would, and `trainwreck run` starts its server that way once torch is imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainwreck.harness.launch import launchers

REPO = Path(__file__).resolve().parents[2]

FORK_FROM_A_HARNESS = """
import json, os, signal
signal.signal(signal.SIGTERM, lambda *_: None)  # as the CLI's interrupt handlers do
signal.signal(signal.SIGINT, lambda *_: None)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])  # as a deferred block might
os.environ.pop("GLOO_SOCKET_IFNAME", None)
from trainwreck.harness.launch.launchers import ForkedServer
server = ForkedServer("tests.harness.forked_probe", env={"GLOO_SOCKET_IFNAME": "lo", "FORKED_PROBE": "yes"})
print(json.dumps({**server.ready, "me": os.getpid()}))
server.close()
"""


def test_a_server_forked_from_a_harness_starts_with_a_fresh_interpreters_signals_and_the_given_environment() -> None:
    done = subprocess.run([sys.executable, "-c", FORK_FROM_A_HARNESS], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["parent"] == seen["named_parent"] == seen["me"] and seen["session_leader"]
    # The harness's handlers would swallow the SIGTERM that ends a server; a blocked signal stays blocked.
    assert seen["sigterm_default"] and seen["sigint_python"] and seen["blocked"] == []
    assert (seen["gloo_interface"], seen["marker"]) == ("lo", "yes")


@pytest.mark.parametrize(("forkable", "gpus"), [(False, 0), (True, 1)], ids=["a second thread", "a CUDA device"])
def test_fork_server_from_here_starts_nothing_in_a_process_with_a_second_thread_or_a_cuda_device(
        monkeypatch: pytest.MonkeyPatch, forkable: bool, gpus: int) -> None:
    started: list[str] = []
    monkeypatch.setattr(launchers, "forkable_here", lambda: forkable)
    monkeypatch.setattr(launchers.gpus, "cuda_device_count", lambda: gpus)  # the count started CUDA's driver here
    monkeypatch.setattr(launchers, "ForkedServer", lambda *a: started.append("forked"))
    monkeypatch.setattr(launchers, "_servers", launchers.ServerSlot())
    launchers.fork_server_from_here()
    assert started == []  # the first attempt starts a fresh one, as before


def test_trainwreck_run_forks_its_server_from_itself_once_torch_is_imported(tmp_path: Path) -> None:
    env = {**os.environ, "TRAINWRECK_GOLDEN_CACHE": str(tmp_path / "golden")}
    env.pop("OMP_NUM_THREADS", None)  # the CLI sets it before torch's import, or torch's pool thread stops the fork
    cli = subprocess.Popen([sys.executable, "-m", "trainwreck.harness.cli", "run", "--plan", "[]", "--world-sizes", "1",
                            "--total-steps", "4", "--out", str(tmp_path / "run")],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        me = psutil.Process(cli.pid)
        server = None
        deadline = time.monotonic() + 120
        while server is None and cli.poll() is None and time.monotonic() < deadline:
            # The server leads its own session (so do fresh ones); the checker's pool workers do not.
            leaders = [c for c in _children(me) if _leads_session(c)]
            server = leaders[0] if leaders else None
            time.sleep(0.02)  # a poll with a deadline: a child's start sends this test no notification
        assert server is not None, "no server started"
        assert server.cmdline() == me.cmdline()  # forked from the CLI; a fresh one runs -m ...forkserver
        out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 0, out + err


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children()
    except psutil.NoSuchProcess:
        return []


def _leads_session(process: psutil.Process) -> bool:
    try:
        return os.getsid(process.pid) == process.pid
    except ProcessLookupError:
        return False
