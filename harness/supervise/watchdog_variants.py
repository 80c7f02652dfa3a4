"""Hang watchdogs by name (JobSpec.watchdog): the reference and its planted defect.

Listed explicitly, so the reference watchdog never imports the defect built on it."""
from __future__ import annotations

import time
from typing import Iterable

from trainwreck.harness.supervise.watchdog import Hang, Watchdog

GLOO_STAND_IN_FACTOR = 1.5
"""The disabled watchdog's backstop, in hang timeouts: a stand-in for gloo's own
30-minute collective timeout, scaled down so the self-test finishes."""


class DisabledWatchdog(Watchdog):
    """Planted defect: nobody watches the progress boards. Like a bare gloo job, the attempt
    only ends when the collective timeout (here GLOO_STAND_IN_FACTOR x hang_timeout_s)
    expires, and that timeout names no rank."""

    def check(self, live: Iterable[int]) -> Hang | None:
        live = sorted(live)
        silent = time.monotonic() - self.last_change
        if not live or silent < GLOO_STAND_IN_FACTOR * self.budget(live):
            return None
        return Hang(suspects=[], waiting=live, last_step=-1, detected_after_s=round(silent, 3),
                    detected_at=time.time())


WATCHDOGS: dict[str, type[Watchdog]] = {"reference": Watchdog, "disabled": DisabledWatchdog}


def watchdog_class(name: str) -> type[Watchdog]:
    if name not in WATCHDOGS:
        raise ValueError(f"watchdog={name!r} is unknown; known watchdogs: {', '.join(sorted(WATCHDOGS))}")
    return WATCHDOGS[name]
