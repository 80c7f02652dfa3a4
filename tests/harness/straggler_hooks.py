"""A test-only in-rank injector that makes one rank 3x slower than the others.

Why this is an honest straggler: every rank "computes" for `base_s` per update
(a sleep standing in for work, so the ratio does not depend on the machine's load),
and the slow rank for `factor * base_s`. DDP then makes every rank wait for it at
the gradient all-reduce, which is exactly what a real straggler does to a job.
Plan entry: {"id": ..., "kind": "test_straggler", "rank": 1, "factor": 3, "base_s": 0.2}.
"""
from __future__ import annotations

import time
from typing import Any

from trainwreck.trainer.hooks import STEP_START, NoHooks


class Straggler(NoHooks):
    def __init__(self, plan: list[dict[str, Any]]) -> None:
        self.fault = next(f for f in plan if f["kind"] == "test_straggler")
        self.events: Any = None
        self.rank = -1
        self.fired = False

    def bind(self, events: Any, rank: int, world_size: int, attempt: int) -> None:
        self.events, self.rank = events, rank

    def point(self, name: str, step: int, **ctx: Any) -> None:
        if name != STEP_START:
            return
        slow = self.rank == self.fault["rank"]
        if slow and not self.fired:
            self.fired = True
            self.events.emit("fault", fault_id=self.fault["id"], rank=self.rank,
                             detail=f"rank {self.rank} runs {self.fault['factor']}x slower")
        time.sleep(self.fault["base_s"] * (self.fault["factor"] if slow else 1))


def build_hooks(plan: list[dict[str, Any]]) -> Straggler:
    return Straggler(plan)
