"""Fault points: the only way faults reach a running rank.

The trainer calls ``hooks.point(NAME, step, **ctx)`` at named places in the loop and
inside a checkpoint save. Without a plan the hooks are ``NoHooks``, whose methods do
nothing, so the reference trainer pays one attribute lookup per point. ``faults/``
supplies a ``Hooks`` implementation that fires planned faults at these points.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # typing only: the trainer does not depend on these at run time
    from trainwreck.rundir.events import EventLog
    from trainwreck.trainer.gradsync import CommHook
    from trainwreck.trainer.storage import Storage

# Points in the train loop; each fires before the named work of update `step`.
STEP_START = "step_start"
AFTER_DATA = "after_data"
AFTER_FORWARD = "after_forward"
AFTER_BACKWARD = "after_backward"  # ctx: model (gradients are reduced and present)
AFTER_OPTIMIZER = "after_optimizer"
LOOP_POINTS = (STEP_START, AFTER_DATA, AFTER_FORWARD, AFTER_BACKWARD, AFTER_OPTIMIZER)

# Points inside a checkpoint save (rank 0 only; ctx: checkpoint=name, file=name).
SAVE_BEFORE_FILE = "save.before_file"
SAVE_AFTER_FILE = "save.after_file"
SAVE_BEFORE_RENAME = "save.before_rename"
SAVE_AFTER_RENAME = "save.after_rename"
SAVE_BEFORE_POINTER = "save.before_pointer"
SAVE_AFTER_POINTER = "save.after_pointer"
SAVE_POINTS = (
    SAVE_BEFORE_FILE,
    SAVE_AFTER_FILE,
    SAVE_BEFORE_RENAME,
    SAVE_AFTER_RENAME,
    SAVE_BEFORE_POINTER,
    SAVE_AFTER_POINTER,
)
# Every rank, at a checkpoint step, after the state gather and before the barrier that
# ends the save: where a non-writing rank waits while rank 0 writes.
SAVE_WAIT = "save.wait"
# Points a replica-group trainer reaches (trainer/frameworks/torchft_train.py): inside the
# update's gradient all-reduce across replica groups, and inside a heal (fetching a live
# peer's state); the reference trainer has neither, so no plan for it should name them.
IN_ALLREDUCE = "in_allreduce"
IN_HEAL = "in_heal"
REPLICA_POINTS = (IN_ALLREDUCE, IN_HEAL)
ALL_POINTS = LOOP_POINTS + SAVE_POINTS + (SAVE_WAIT,) + REPLICA_POINTS


class Hooks(Protocol):
    """What the trainer asks of a fault injector."""

    def bind(self, events: EventLog, rank: int, world_size: int, attempt: int) -> None:
        """Called once per rank before training, with the rank's event log."""

    def point(self, name: str, step: int, **ctx: Any) -> None:
        """A named fault point was reached before update `step` (see the constants)."""

    def wrap_storage(self, storage: Storage) -> Storage:
        """Return the storage the checkpoint store should use (storage faults wrap it)."""

    def wrap_comm_hook(self, hook: CommHook) -> CommHook:
        """Return the DDP communication hook to register (communication faults wrap the
        trainer's own reduction, so a faulty rank still runs the same collectives)."""


class NoHooks:
    """The reference trainer without a plan: every point is a no-op."""

    def bind(self, events: EventLog, rank: int, world_size: int, attempt: int) -> None:
        pass

    def point(self, name: str, step: int, **ctx: Any) -> None:
        pass

    def wrap_storage(self, storage: Storage) -> Storage:
        return storage

    def wrap_comm_hook(self, hook: CommHook) -> CommHook:
        return hook
