"""SIGINT and SIGTERM to the harness: exceptions that stop every rank, and a record of which and when.

While a command or a job runs (`stop_on_signals`), SIGINT raises KeyboardInterrupt and SIGTERM
raises `Terminated`, so every `finally` kills and reaps what it started, and the job's `end`
event can say the run was interrupted (by which signal, when) instead of failed. The signal
is also remembered: Python drops an exception raised where it cannot propagate (a `__del__`,
a callback inside an import), and the supervision loop's `raise_if_received` then stops the
job at its next poll instead of letting it run on. A second signal during the cleanup is
ignored, so the cleanup finishes. Standard library only: `trainwreck` installs it before it
imports anything slow.
"""
from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Iterator


class Terminated(SystemExit):
    """SIGTERM reached the harness: clean up, then exit 143 like an unhandled SIGTERM would."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@dataclass(frozen=True)
class Received:
    """The signal that interrupted the harness, and when (unix seconds)."""

    signum: int
    t: float

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal, the shell's convention: 130 for Ctrl-C, 143 for SIGTERM."""
        return 128 + self.signum


SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: Received | None = None
_depth = 0
_deferring = 0
_old: dict[int, Any] = {}


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated()


def _handler(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is not None:
        return  # already stopping: let the cleanup finish
    _received = Received(signum, time.time())
    if not _deferring:
        _raise(signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT/SIGTERM raise for the duration (main thread only: signal() works only there).
    Nested uses share the outermost one's record; a signal received before a nested use
    began (swallowed on the way) stops it at once."""
    global _depth, _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth == 0:
        _received = None
        _old.update({sig: signal.signal(sig, _handler) for sig in SIGNALS})
    _depth += 1
    try:
        raise_if_received()
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            for sig, old in _old.items():
                signal.signal(sig, old)
            _old.clear()


@contextmanager
def deferred() -> Iterator[None]:
    """SIGINT/SIGTERM are recorded but raised only when the block ends: for code where an exception
    raised at any bytecode kills the process instead of unwinding it. `import torch` is such code:
    its C++ initialisation (torch._C._c10d_init) runs Python, and a KeyboardInterrupt raised there
    became a C++ exception nothing caught, so the harness died of SIGABRT ("terminate called after
    throwing an instance of 'pybind11::error_already_set'") instead of saying its one line."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    raise_if_received()


def received() -> Received | None:
    """The signal that interrupted the current command or job, if one did."""
    return _received


def raise_if_received() -> None:
    """Raise the interrupt again when one was received but something swallowed its exception."""
    if _received is not None and _depth > 0 and threading.current_thread() is threading.main_thread():
        _raise(_received.signum)


def interrupt_of(exc: BaseException) -> Received:
    """The signal behind KeyboardInterrupt or Terminated (raised by this module, or by Python's
    own SIGINT handler when none was installed)."""
    if _received is not None:
        return _received
    return Received(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT, time.time())
