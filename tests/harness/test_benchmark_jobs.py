"""harness/suites/handbook.py `run_benchmark_job`: the handbook's benchmark jobs are forked from the
command server with stdout and stderr apart, start cold (saying why) when it cannot serve them, and
are killed past their time."""
from __future__ import annotations

import json
import os

import psutil
import pytest

from trainwreck.harness.suites import handbook
from trainwreck.harness.supervise.command import warm

PROBE = ["python", "-m", "tests.harness.job_probe"]


def test_a_job_is_forked_from_the_command_server_with_its_stdout_apart_from_its_stderr() -> None:
    code, out, err = handbook.run_benchmark_job([*PROBE, "--exit", "4"])
    server = warm._servers.server
    assert server is not None and code == 4
    assert json.loads(out)["ppid"] == server.pid  # forked warm, not a fresh interpreter of this process
    assert err == "a warning on stderr\n"


def test_a_job_the_server_cannot_serve_runs_cold_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(handbook, "fork_command", lambda *a, **k: "the server is off for this test")
    code, out, err = handbook.run_benchmark_job(PROBE)
    assert code == 0 and json.loads(out)["ppid"] == os.getpid() and err == "a warning on stderr\n"
    assert "starts cold (a fresh interpreter): the server is off for this test" in capsys.readouterr().err


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "cold"])
def test_a_job_past_its_time_is_killed_and_reads_as_no_exit_code(forked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handbook, "MEASURE_TIMEOUT_S", 1.0)
    if not forked:
        monkeypatch.setattr(handbook, "fork_command", lambda *a, **k: "cold for this test")
    code, out, _ = handbook.run_benchmark_job([*PROBE, "--sleep", "60"])
    assert code is None
    if forked:  # its output survives it (the cold job's pipe is dropped with it)
        job = json.loads(out)
        assert job["ppid"] == warm._servers.server.pid and not psutil.pid_exists(job["pid"])
