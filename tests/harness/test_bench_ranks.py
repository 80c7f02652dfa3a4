"""benchmarks/ranks.py: a benchmark job's ranks are forked from the warm command server (itself
forked from a single-threaded job), start cold (saying why) when it cannot serve them, and a failed
job quotes each failed rank's log."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainwreck.benchmarks import ranks
from trainwreck.harness.launch.launchers import ServerSlot
from trainwreck.harness.launch import procs
from trainwreck.harness.launch.procs import child_env
from trainwreck.harness.suites.handbook import run_benchmark_job
from trainwreck.harness.supervise.command import warm

PROBE = "tests.harness.rank_probe"


def test_a_jobs_ranks_are_forked_from_the_command_server_and_run_their_module_as_main() -> None:
    result = ranks.run_ranks(PROBE, 2, [], "probe")
    server = warm._servers.server
    assert server is not None and server.alive()
    assert [r["ppid"] for r in result["ranks"]] == [server.pid, server.pid]  # not this process: forked warm
    assert len({r["pid"] for r in result["ranks"]}) == 2
    assert all(r["main"].endswith(os.path.join("tests", "harness", "rank_probe.py")) for r in result["ranks"])
    assert not [p for p in server.exits if p in {r["pid"] for r in result["ranks"]}]  # reaped and forgotten


def test_ranks_the_server_cannot_serve_start_cold_and_say_why(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ranks, "serving", lambda *a, **k: "the server is off for this test")
    result = ranks.run_ranks(PROBE, 1, [], "probe")
    assert [r["ppid"] for r in result["ranks"]] == [os.getpid()]  # a fresh interpreter of this process
    assert "the probe ranks start cold (fresh interpreters): the server is off for this test" in capsys.readouterr().err


def test_a_failed_job_names_each_failed_rank_with_the_end_of_its_log() -> None:
    with pytest.raises(RuntimeError) as exc:
        ranks.run_ranks(PROBE, 2, ["--fail"], "probe")
    message = str(exc.value)
    assert "the probe job at world 2 failed: exit codes [3, 3]" in message
    assert "--- rank 0 (exit 3):\nrank 0 refuses to start" in message
    assert "--- rank 1 (exit 3):\nrank 1 refuses to start" in message


def test_a_handbook_job_forks_its_ranks_server_from_itself_not_a_fresh_interpreter() -> None:
    code, out, err = run_benchmark_job(["python", "-m", "tests.harness.bench_job_probe"])
    assert code == 0, err
    seen = json.loads(out)
    assert seen["server_parent"] == seen["job"]
    assert seen["server_cmdline"] == seen["job_cmdline"]  # a fresh one's names the job as its parent pid
    assert seen["rank_parents"] == [seen["server"], seen["server"]]


def test_a_process_running_a_second_thread_or_not_on_linux_starts_its_server_fresh_instead_of_forking_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    monkeypatch.setattr(warm, "ForkedServer", lambda *a: started.append("forked from this process"))
    monkeypatch.setattr(warm, "ForkServer", lambda *a: started.append("a fresh interpreter"))
    plan = warm.WarmPlan(warm.BENCHMARK_MODULES, child_env())
    for platform, threads in (("linux", 1), ("linux", 2), ("darwin", 1)):
        monkeypatch.setattr(warm, "_servers", ServerSlot())
        monkeypatch.setattr(procs, "thread_count", lambda: threads)
        monkeypatch.setattr(procs.sys, "platform", platform)
        warm.command_server(plan, here=True)
    assert started == ["forked from this process", "a fresh interpreter", "a fresh interpreter"]


def test_thread_count_counts_threads_python_does_not_know_of() -> None:
    # faulthandler's watchdog is a C thread, outside `threading`, as a library's (gloo's, OpenMP's) are.
    # In a process of its own: a test worker's other threads may end while this one counts.
    code = ("import faulthandler\nfrom trainwreck.harness.launch.procs import thread_count\n"
            "alone = thread_count()\nfaulthandler.dump_traceback_later(60)\n"
            "print(alone, thread_count())\nfaulthandler.cancel_dump_traceback_later()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["1", "2"], done.stdout + done.stderr
