"""The in-rank faults a `trainwreck run --cmd` rank can take: built by its probe from run.json's plan.

A user's trainer is not the reference trainer: the harness cannot reach its storage or its
gradient hook, only what its adapter calls through the probe. So a --cmd rank takes exactly
the kinds below; the job spec refuses every other in-rank kind (harness/supervise/spec.py), naming it.

- ``kill`` and ``hang`` at the fault points the adapter calls (``probe.point``): every adapter
  here calls ``step_start``; Lightning's also ``after_backward``. A point the trainer never
  reaches leaves the fault unfired, and the judge then says "unknown", never a pass.
- ``foreign_crash`` inside the framework's own save, through ``probe.saving(step, root)``
  (faults/foreign.py counts the save's file operations).

The harness names this factory in the rank's environment (harness/launch/launchers.py ``cmd_env``),
and the probe resolves it by name, so the trainer package never imports faults/. ``corrupt``
is the harness's own between attempts (faults/between_attempts.py), so the ranks leave it alone.

Every save's file operations are also recorded as a ``save_ops`` event (an extension kind the
judge ignores): the frameworks table turns the golden run's into one run per crash point.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from trainwreck.faults.foreign import FOREIGN_KIND, ForeignSave
from trainwreck.faults.inrank import FaultHooks
from trainwreck.faults.plan import FOREIGN, IN_RANK, KINDS, command_kinds

CMD_KINDS = tuple(k for k in command_kinds() if KINDS[k].where in (IN_RANK, FOREIGN))
"""The in-rank kinds a --cmd rank fires (declared `command=True` in faults/plan.py; the
harness's own kinds and `corrupt` come on top)."""
HOOKS_FACTORY = "trainwreck.faults.cmdrank:build_cmd_hooks"
"""What the harness names in TRAINWRECK_HOOKS for every --cmd rank."""


class CmdHooks(FaultHooks):
    """FaultHooks for the point faults, plus the foreign-save faults of ``saving``."""

    def __init__(self, plan: list[dict[str, Any]]) -> None:
        mine = [f for f in plan if f.get("kind") != "corrupt"]  # the harness applies those between attempts
        super().__init__(mine)
        self.foreign_plan = [f for f in mine if f.get("kind") == FOREIGN_KIND]
        self.saves: dict[Path, ForeignSave] = {}

    @contextmanager
    def saving(self, step: int, root: Path) -> Iterator[None]:
        """The framework's save after update `step`, writing under `root`: its file operations are
        counted, planned crashes fire inside it, and the ops are recorded once it is done."""
        assert self.events is not None, "bind() must run before a save"
        root = Path(root)
        if root not in self.saves:
            self.saves[root] = ForeignSave(self.foreign_plan, self.rank, self.attempt, self.record, root)
        save = self.saves[root]
        with save.saving(step):
            yield
        self.events.emit("save_ops", step=step, root=root.name, ops=[op.describe() for op in save.recorded])


def build_cmd_hooks(plan: list[dict[str, Any]]) -> CmdHooks:
    return CmdHooks(plan)
