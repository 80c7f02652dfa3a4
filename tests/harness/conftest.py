"""Shared helpers for the harness tests: leftover-process and leftover-directory checks."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from trainwreck.harness.launch import launchers
from trainwreck.harness.supervise.command import warm
from trainwreck.trainer.progress import read_progress
from trainwreck.rundir.layout import RunDir


def reused_servers() -> list[launchers.ForkServer]:
    """The live servers this process keeps between jobs: the fork server and --cmd's command server."""
    return [s for s in (launchers._servers.server, warm._servers.server) if s is not None and s.alive()]


def live_descendants() -> list[psutil.Process]:
    """Processes below this test process, except the (reused) servers themselves."""
    keep = {server.pid for server in reused_servers()}
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid not in keep:
                out.append(proc)
        except psutil.NoSuchProcess:
            pass
    return out


def fork_server_children() -> list[psutil.Process]:
    """Live children of the reused servers: ranks they forked that outlived their attempt."""
    found = []
    for server in reused_servers():
        try:
            found += psutil.Process(server.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return found


def assert_no_leftover_processes() -> None:
    leftovers = live_descendants() + fork_server_children()
    described = []
    for proc in leftovers:
        try:
            described.append(f"{proc.pid} {proc.status()} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    assert not described, "processes left behind:\n" + "\n".join(described)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private TMPDIR for temporary run directories, so parallel tests cannot mask leftovers."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield tmp


def read_events(run_dir: Path, name: str = "*.jsonl") -> list[dict[str, Any]]:
    events = []
    for path in sorted((Path(run_dir) / "events").glob(name)):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass  # a torn last line of a killed rank
    return events


def harness_events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    events = read_events(run_dir, "harness.jsonl")
    return [e for e in events if kind is None or e["kind"] == kind]


def rank_events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir, "a*.jsonl") if e["kind"] == kind]


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `predicate` until it holds; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling files written by another process tree; no event to wait on


def silent_since(run_dir: Path, attempt: int, world_size: int) -> float:
    """When the attempt's ranks last published progress (the newest time on their boards): where the
    silence a watchdog measures begins. A hang's latency counts from here, not from the fault: the
    ranks the fault did not stop work on to the next collective first, for as long as the machine's
    load makes them take."""
    boards = [read_progress(RunDir(run_dir).rank_progress(attempt, r)) for r in range(world_size)]
    return max(b.t for b in boards if b is not None)
