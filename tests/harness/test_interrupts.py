"""`trainwreck run` stopped from outside (Ctrl-C, SIGTERM, a reader that leaves): one line, the
shell's exit code, and a run directory that reads as interrupted, never as a trainer bug."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.conftest import harness_events, wait_until
from tests.report.rundirs import clean_run

REPO = Path(__file__).resolve().parents[2]
# Rank 1 stops at update 3 and nothing declares the hang for 10 minutes: the job stands still
# until the test interrupts it, whatever the machine's speed.
STALL = json.dumps([{"id": "stall", "kind": "signal", "rank": 1, "signal": "SIGSTOP", "step": 3, "expect": "hang"}])


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One golden cache for the module's runs (the first run builds it)."""
    cache = tmp_path_factory.mktemp("golden")
    return dict(os.environ, PYTHONPATH=str(REPO), TRAINWRECK_GOLDEN_CACHE=str(cache))


def trainwreck(*args: str, env: dict[str, str], **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "trainwreck.harness.cli", *args], env=env,
                            **popen)  # type: ignore[call-overload]


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 120) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")


def check(run: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "trainwreck.harness.cli", *args, str(run)], env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "Ctrl-C"),
                                             pytest.param(signal.SIGTERM, 143, "SIGTERM", marks=pytest.mark.slow)])
def test_an_interrupted_run_says_one_line_and_reads_interrupted_never_invalid(
        tmp_path: Path, env: dict[str, str], sig: int, code: int, said: str) -> None:
    run = tmp_path / "run"
    proc = trainwreck("run", "--plan", STALL, "--total-steps", "8", "--hang-timeout", "600", "--out", str(run),
                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: run.is_dir() and bool(harness_events(run, "fault")), 300, "the stall to fire")
        proc.send_signal(sig)
    finally:
        out, err = finish(proc)
    assert proc.returncode == code, err
    assert err.strip() == f"trainwreck run: interrupted ({said}); ranks stopped, partial results left in place"
    [end] = harness_events(run, "end")
    assert (end["status"], end["outcome"], end["signal"]) == ("interrupted", "interrupted", signal.Signals(sig).name)
    assert all(e["stopped_by_harness"] for e in harness_events(run, "exit")), "the harness killed every rank"
    rc, text = check(run, env, "check")
    assert rc == 2 and text.splitlines()[-1] == "overall: INTERRUPTED", text
    assert f"interrupted ({signal.Signals(sig).name} to the harness)" in text
    rc, text = check(run, env, "report")
    assert rc == 2 and text.startswith("INTERRUPTED "), text
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["root_cause"] is None, "the harness's own kills are no crash of a rank"
    assert report["valid"] == "unknown" and report["interrupted"]["signal"] == signal.Signals(sig).name
    assert (run / "report" / "report.md").read_text().startswith("# run: INTERRUPTED")


def test_a_signal_inside_a_deferred_block_is_raised_when_the_block_ends_not_inside_it() -> None:
    """As around torch's import, whose C++ start-up aborts the process when a KeyboardInterrupt is
    raised inside it (harness/supervise/interrupts.py `deferred`)."""
    from trainwreck.harness.supervise import interrupts

    finished = False
    with pytest.raises(KeyboardInterrupt):
        with interrupts.stop_on_signals(), interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 30
            while interrupts.received() is None and time.monotonic() < deadline:
                pass  # bytecodes run: Python's handler runs at one of them, on this thread
            assert interrupts.received() is not None, "the signal never reached the handler"
            finished = True  # nothing was raised inside the block
    assert finished


# 1.5 s is nightly too: twice in four clean-clone runs on 2026-11-27 it exited -2 (killed by SIGINT)
# after printing its one line, a race not yet found (the session notes of that day). A Ctrl-C at
# that moment could also abort the process inside torch's import; that one is fixed (`deferred`).
@pytest.mark.parametrize("after_s", [pytest.param(0.8, marks=pytest.mark.slow),
                                     pytest.param(1.5, marks=pytest.mark.slow),
                                     pytest.param(4.0, marks=pytest.mark.slow)])
def test_ctrl_c_at_any_moment_of_start_up_stops_with_the_one_line(tmp_path: Path, env: dict[str, str],
                                                                   after_s: float) -> None:
    """While Python and torch import, the golden run builds, or the fork server starts."""
    proc = trainwreck("run", "--total-steps", "8", "--out", str(tmp_path / "run"), env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(after_s)  # the moment of the Ctrl-C is the test's input, not a synchronisation
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
    finally:
        out, err = finish(proc, timeout_s=60)
    assert proc.returncode == 130, err
    assert err.strip() == "trainwreck run: interrupted (Ctrl-C); ranks stopped, partial results left in place"
    assert time.monotonic() - started < 15, "the interrupt must stop the run, not wait for it to end"


def test_a_reader_that_leaves_neither_costs_a_traceback_nor_changes_the_exit_code(
        tmp_path: Path, env: dict[str, str]) -> None:
    """`trainwreck check RUN | head -1` on a VALID run: the closed pipe is not the verdict."""
    run = clean_run(tmp_path / "run")
    proc = trainwreck("check", str(run), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before a byte is written
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.wait(timeout=60)
    proc.stderr.close() if proc.stderr else None
    assert proc.returncode == 0 and err == "", err


def test_run_piped_into_a_reader_that_leaves_exits_with_its_verdict(tmp_path: Path, env: dict[str, str]) -> None:
    read, write = os.pipe()
    proc = trainwreck("run", "--total-steps", "8", "--out", str(tmp_path / "run"), env=env,
                      stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    os.close(read)  # as `| head -0` would
    out, err = finish(proc, timeout_s=300)
    assert proc.returncode == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    assert json.loads((tmp_path / "run" / "verdicts.json").read_text())["valid"] is True


def test_a_second_signal_while_the_handlers_are_restored_still_exits_130_with_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CI failure of 2026-11-27: the line was printed, then a KeyboardInterrupt raised as
    stop_on_signals put Python's handler back killed the process by SIGINT (exit -2, not 130)."""
    from contextlib import contextmanager

    from trainwreck.harness import cli

    @contextmanager
    def restoring_raises():  # what a signal pending while the handlers are put back does
        try:
            yield
        finally:
            raise KeyboardInterrupt

    def dispatch(argv: list[str]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "stop_on_signals", restoring_raises)
    monkeypatch.setattr(cli, "dispatch", dispatch)
    try:
        code = cli.main(["run"])
    except KeyboardInterrupt:
        pytest.fail("the second KeyboardInterrupt escaped main: the process would die by SIGINT (exit -2)")
    assert code == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "trainwreck run: interrupted (Ctrl-C); ranks stopped, partial results left in place"]
