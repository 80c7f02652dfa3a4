"""Helpers for tests of hostile files (issue 24): plant a FIFO, and run a call with a deadline
so that a regression that blocks on one fails its test instead of stalling the suite.
No trainwreck imports: tests import these before the code under test."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

DEADLINE_S = 20.0


def within_deadline(call: Callable[[], Any], seconds: float = DEADLINE_S) -> Any:
    """`call()`, failing the test if it has not returned after `seconds` (a blocked open)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # handed back to the test thread
            result["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        unblock_fifos()
        worker.join(5)
        pytest.fail(f"still blocked after {seconds} s (a FIFO or device was opened and waited on)")
    if "error" in result:
        raise result["error"]
    return result.get("value")


_FIFOS: list[Path] = []


def mkfifo(path: Path) -> Path:
    os.mkfifo(path)
    _FIFOS.append(path)
    return path


def unblock_fifos() -> None:
    """Open every planted FIFO's other end once, so a thread blocked on one can return."""
    for path in _FIFOS:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            pass
