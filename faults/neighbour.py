"""A noisy neighbour: a busy process that takes a share of one rank's core, on a period.

    {"id": "nn", "kind": "noisy_neighbour", "rank": 1, "step": 3, "every": 6, "steps": 2, "share": 0.75}

From update `step` on, every `every` updates, the rank's injector starts a child process for
`steps` updates and ends it (by the pid it started, nothing else). The child pins itself to
the rank's core where the OS allows it and, in slices of SLICE_S, spins on that core for
`share` of each slice while the rank is stopped (SIGSTOP), then continues the rank (SIGCONT)
and sleeps for the rest. That is what a neighbour under a CPU quota does to a tenant: it
burns the core the rank would have used, for a share set by the fault rather than by how
busy the machine happens to be, so the slowdown is the same on an idle and a crowded box
(a plain spinning process would take 1/(runnable tasks) of the core, which on a loaded CI
machine is nothing). The rank is always continued before the child exits: on SIGTERM, on
its own error, and when its parent is gone.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from trainwreck.faults.periodic import PeriodicChild

SLICE_S = 0.05
"""One scheduling slice: the rank is stopped for `share` of it, then runs for the rest (longer
when this process wakes late on a busy machine: the next stop then grows to keep the share)."""
MAX_SHARE = 0.95
"""The largest share taken: a rank stopped all the time would be a hang, not a neighbour."""

_CHILD = r"""
import os, signal, sys, time
rank_pid, core, share, slice_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
done = False
def stop(*_):
    global done
    done = True
signal.signal(signal.SIGTERM, stop)
try:
    if core >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
except OSError:
    pass  # not allowed here: the neighbour then runs wherever the OS puts it
try:
    ran = (1 - share) * slice_s
    first = True
    while not done and os.getppid() == rank_pid:
        os.kill(rank_pid, signal.SIGSTOP)
        if first:  # the rank waits for this line: stopped before it reads it, the burst starts at once
            first = False
            sys.stdout.write("ready\n")
            sys.stdout.flush()
        # Stopped for `share` of the time since the last stop, however late this process woke up.
        end = time.perf_counter() + max(share * slice_s, ran * share / (1 - share))
        while time.perf_counter() < end and not done:
            pass  # the busy part: the core the rank is not getting
        os.kill(rank_pid, signal.SIGCONT)
        resumed = time.perf_counter()
        time.sleep((1 - share) * slice_s)
        ran = time.perf_counter() - resumed
finally:
    try:
        os.kill(rank_pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
"""


def rank_core() -> int:
    """The core the neighbour sits on: the first the rank may run on (-1 where the OS cannot say)."""
    try:
        return min(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return -1


class NoisyNeighbour(PeriodicChild):
    """One rank's `noisy_neighbour` faults: `at_step` starts and ends the child at update starts."""

    def __init__(self, faults: list[dict[str, Any]], record: Callable[..., None], rank: int, root: Path) -> None:
        super().__init__(faults, record, rank, root)
        self.core = rank_core()

    def prepare(self, fault: dict[str, Any], step: int, first: bool) -> list[str]:
        share = min(float(fault["share"]), MAX_SHARE)
        if first:
            self.record(fault, f"rank {self.rank}: a neighbour process takes {share:g} of core {self.core} for "
                               f"{fault['steps']} update(s) every {fault['every']} from update {step}",
                        step=step, core=self.core, share=share)
        return [sys.executable, "-S", "-c", _CHILD, str(os.getpid()), str(self.core), str(share), str(SLICE_S)]

    def ended(self) -> None:
        os.kill(os.getpid(), signal.SIGCONT)  # harmless when running; never leave this rank stopped
