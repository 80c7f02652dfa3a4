"""DCP's own writer on its own: a process crash at each of its file operations.

torch.distributed.checkpoint's FileSystemWriter commits a save by writing ``.metadata.tmp``
and renaming it to ``.metadata`` (after removing an older ``.metadata`` in the same
directory); it has no pointer of its own. This module records one such save in-process
(no_dist, through the Storage seam: trainer/storage.py storage_fs), crashes it at each
mutating op (before, after, torn for a write: faults/storage.py FaultyStorage, the same
crash_op fault the job sweep uses) and judges what is left by loading it, in two layouts:
a new directory per save, and every save into the same directory (DCP's default
``overwrite=True`` allows it). harness/suites/sweep.py `DcpCrash` runs it; the
power-loss model of the same save is faults/powerloss.py's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwreck.faults.powerloss import DCP_DIR, DCP_EARLIER, dcp_loads, dcp_save
from trainwreck.faults.storage import FaultyStorage, Op, RecordingStorage, StepClock
from trainwreck.faults.sweep import CRASH_STEP, crash_plan
from trainwreck.trainer.storage import LocalStorage, Storage

DCP_LAYOUTS = {"dcp": "a new directory per save", "dcp_in_place": "every save into the same directory"}
"""The two ways a job can point DCP's FileSystemWriter at a checkpoint directory."""


class ProcessDied(Exception):
    """The emulated process crash: once raised, the storage below refuses every operation."""


class DiesOnCrash:
    """A Storage that stops doing anything once `kill` is called: the in-process stand-in for
    SIGKILL, which leaves every completed operation on disk (the kernel still has it) and
    none after. DCP wraps the exception, so the guard keeps its later steps off the disk."""

    def __init__(self, inner: Storage) -> None:
        self.inner, self.killed = inner, False

    def kill(self) -> None:
        self.killed = True
        raise ProcessDied("the process crashed here")

    def __getattr__(self, name: str) -> Any:
        if self.killed:
            raise ProcessDied(f"a dead process cannot {name}")
        return getattr(self.inner, name)


def dcp_names(layout: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """((earlier checkpoint, its step), (swept checkpoint, its step)) for a layout."""
    if layout not in DCP_LAYOUTS:
        raise ValueError(f"DCP layout {layout!r} is unknown; use one of {', '.join(DCP_LAYOUTS)}")
    return ((DCP_EARLIER if layout == "dcp" else DCP_DIR, 8), (DCP_DIR, CRASH_STEP))


def record_dcp_ops(root: Path, layout: str) -> list[Op]:
    """The mutating ops of DCP's save at CRASH_STEP after its earlier save (in-process, no_dist)."""
    (earlier, early_step), (name, step) = dcp_names(layout)
    local = LocalStorage(Path(root))
    dcp_save(local, Path(root), earlier, early_step)
    recording = RecordingStorage(local)
    dcp_save(recording, Path(root), name, step)  # type: ignore[arg-type]
    return recording.mutating()


def crash_dcp_save(root: Path, layout: str, op_index: int, when: str) -> tuple[list[str], bool]:
    """Run the layout's two DCP saves in `root`, the second crashed at `op_index` (`when`):
    (the fault's own detail lines, whether dcp.save returned)."""
    (earlier, early_step), (name, step) = dcp_names(layout)
    local = LocalStorage(Path(root))
    dcp_save(local, Path(root), earlier, early_step)
    details: list[str] = []
    dying = DiesOnCrash(local)
    faulty = FaultyStorage(dying, crash_plan(op_index, when), StepClock(CRASH_STEP),  # type: ignore[arg-type]
                           lambda fault, detail, **extra: details.append(detail), crash=dying.kill)
    try:
        dcp_save(faulty, Path(root), name, step)  # type: ignore[arg-type]
    except BaseException:  # DCP wraps the crash in CheckpointException, a BaseException
        if not dying.killed:
            raise
        return details, False
    return details, True


def judge_dcp_crash(root: Path, layout: str, returned: bool) -> tuple[bool, str]:
    """(valid, why) after a crash: a reader must still find a checkpoint that loads as
    written. New directory per save: the earlier one loads, and the new one loads with its
    own values once its `.metadata` exists (or dcp.save returned). In place: the directory
    loads as the earlier save or as the new one, never as a mix or not at all."""
    (earlier, early_step), (name, step) = dcp_names(layout)
    if layout == "dcp":
        problem = dcp_loads(root, earlier, early_step)
        if problem is None and (returned or (Path(root) / name / ".metadata").exists()):
            problem = dcp_loads(root, name, step)
        return problem is None, problem or "the earlier checkpoint loads, and the new one once committed"
    as_new = dcp_loads(root, name, step)
    if as_new is None:
        return True, f"{name} loads as the new save"
    as_old = None if returned else dcp_loads(root, name, early_step)
    if as_old is None:
        return True, f"{name} loads as the earlier save"
    return False, f"{name} holds neither save: {as_old}" if "loads other values" in as_new else f"{as_new}"
