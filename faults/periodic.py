"""A child process that runs beside one rank for bursts of updates on a period.

    {"id": "x", "kind": K, "rank": 1, "step": 3, "every": 6, "steps": 2, "until": 20}

From update `step` on, every `every` updates, the rank's injector starts a child for `steps`
updates and ends it at the next update's start outside a burst (by the pid it started, nothing
else). The kinds differ in what the child does (faults/neighbour.py takes the rank's core,
faults/contention.py writes to its disk); this module owns when it runs and how it ends, so
the two share one rule for both.
"""
from __future__ import annotations

import atexit
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable

END_TIMEOUT_S = 5.0


class PeriodicChild:
    """One rank's faults of one periodic kind (a faults/inrank.py `StepInjector`)."""

    def __init__(self, faults: list[dict[str, Any]], record: Callable[..., None], rank: int, root: Path) -> None:
        self.faults, self.record, self.rank, self.root = faults, record, rank, root
        self.child: subprocess.Popen[bytes] | None = None
        self.started: set[str] = set()
        if faults:
            atexit.register(self.end)  # a burst that outlives the loop ends with the rank

    @staticmethod
    def busy(fault: dict[str, Any], step: int) -> bool:
        """Whether update `step` falls inside one of the fault's bursts."""
        since = step - fault["step"]
        return since >= 0 and since % fault["every"] < fault["steps"] and step <= fault.get("until", step)

    def at_step(self, step: int) -> None:
        burst = next((f for f in self.faults if self.busy(f, step)), None)
        if burst is None:
            self.end()
        elif self.child is None:
            first = burst["id"] not in self.started  # one fault event, at the first burst (the straggler's rule)
            self.started.add(burst["id"])
            argv = self.prepare(burst, step, first)
            self.child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, close_fds=True)
            # The burst starts when the child acts, not an interpreter start-up later.
            assert self.child.stdout is not None
            self.child.stdout.readline()

    def prepare(self, fault: dict[str, Any], step: int, first: bool) -> list[str]:
        """The child's command line; records the fault event when `first`, before the child acts."""
        raise NotImplementedError

    def end(self) -> None:
        """End the child this object started, by its pid."""
        child, self.child = self.child, None
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=END_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
        self.ended()

    def ended(self) -> None:
        """What the rank does after its child is gone."""
