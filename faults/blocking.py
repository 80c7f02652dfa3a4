"""Ways for a rank to block forever (stdlib only, so they can be tested without torch).

``releasing_gil``: waits on an Event nobody sets. The GIL is released, so other Python
threads of the rank (e.g. a heartbeat thread) keep running.

``holding_gil``: calls libc ``pause()`` through ``ctypes.PyDLL``. ``ctypes.CDLL``
releases the GIL around a foreign call; ``PyDLL`` does not, so while the rank sleeps in
the kernel no other Python thread of it can run. ``pause()`` returns after a signal is
handled (faulthandler's SIGUSR1 stack dump is handled in C, so the watchdog still gets
stacks); we then pause again at once, so other threads get at most a switch interval.
A spinning pure-Python loop would not do: the interpreter hands the GIL to waiting
threads every 5 ms. A C busy loop would, but would also burn a core the other ranks
need on a small machine.
"""
from __future__ import annotations

import ctypes
import threading
from typing import NoReturn


def releasing_gil() -> NoReturn:
    never = threading.Event()
    while True:
        never.wait()


def holding_gil() -> NoReturn:
    libc = ctypes.PyDLL(None)
    while True:
        libc.pause()
