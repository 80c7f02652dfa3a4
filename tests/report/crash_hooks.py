"""A test-only in-rank hook that crashes ranks with an exception no planned fault explains.

It stands in for the bug found on a fresh machine (numpy missing: every rank died in
broadcast_object_list with `RuntimeError: Numpy is not available`). It emits no `fault`
event on purpose: to the report this must look like what it imitates, an unplanned crash.
Plan entry: {"id": ..., "kind": "test_crash", "ranks": [1], "step": 3, "message": "..."}; "ranks" is one
rank or every rank (then they meet in a barrier first, so each of them raises).
Other entries (external faults the harness fires) are left to the harness.
"""
from __future__ import annotations

from typing import Any

from trainwreck.trainer.hooks import STEP_START, NoHooks


class Crash(NoHooks):
    def __init__(self, plan: list[dict[str, Any]]) -> None:
        self.fault = next(f for f in plan if f["kind"] == "test_crash")
        self.rank, self.world_size = -1, 0

    def bind(self, events: Any, rank: int, world_size: int, attempt: int) -> None:
        self.rank, self.world_size = rank, world_size

    def point(self, name: str, step: int, **ctx: Any) -> None:
        if name == STEP_START and step == self.fault["step"] and self.rank in self.fault["ranks"]:
            if sorted(self.fault["ranks"]) == list(range(self.world_size)) and self.world_size > 1:
                # Every crashing rank reaches the crash before any raises: the harness stops the
                # attempt at the first death, and a rank still on its way would die of that instead.
                import torch.distributed as dist

                dist.barrier()
            raise RuntimeError(self.fault["message"])


def build_hooks(plan: list[dict[str, Any]]) -> Crash:
    return Crash(plan)
