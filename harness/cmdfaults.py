"""Corrupting a foreign trainer's newest checkpoint between attempts (`trainwreck run --cmd`).

The reference trainer's corruption runs inside rank 0 (faults/corrupt.py) through its
storage; a user's command has no such seam, so the harness does it itself just before it
launches attempt `attempt`: the previous attempt's processes are reaped, the next one has
not looked yet. "Newest" is the entry of the checkpoint directory with the highest step
number in its name (HF `checkpoint-12`, `ckpt-000012-....pt`); in a directory checkpoint the
largest file is damaged. Nothing outside the checkpoint directory is touched, and no
symlink is followed. A framework whose newest checkpoint carries no step number (Lightning's
`last.ckpt`) names it: `target`, relative to the checkpoint directory.

    {"id": "c1", "kind": "corrupt", "how": "flip" | "truncate", "attempt": 1}
    {"id": "c2", "kind": "corrupt", "how": "truncate", "target": "last.ckpt"}
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from trainwreck.trainer.events import EventLog
from trainwreck.trainer.rundir import RunDir

HOWS = ("flip", "truncate")
_STEP = re.compile(r"(\d+)")


def check_corrupt_fault(fault: dict[str, Any]) -> None:
    """ValueError naming the field and the fix."""
    fid = fault.get("id")
    if fault.get("how", "flip") not in HOWS:
        raise ValueError(f"fault {fid}: field 'how'={fault.get('how')!r}: use one of {', '.join(HOWS)}")
    attempt = fault.get("attempt", 1)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise ValueError(f"fault {fid}: field 'attempt'={attempt!r}: corruption happens before an attempt "
                         "that restores, so give an integer >= 1")
    target = fault.get("target", "newest")
    if not isinstance(target, str) or Path(target).is_absolute() or ".." in Path(target).parts:
        raise ValueError(f"fault {fid}: field 'target'={target!r}: give \"newest\" or a name inside the "
                         "checkpoint directory, e.g. \"last.ckpt\"")


def newest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The entry with the highest step number in its name; hidden and temporary entries and symlinks skipped."""
    try:
        entries = [p for p in ckpt_dir.iterdir() if not p.name.startswith(".") and not p.is_symlink()
                   and not p.name.endswith(".tmp") and _STEP.search(p.name)]
    except OSError:
        return None
    return max(entries, key=lambda p: int(_STEP.search(p.name).group(1)), default=None)  # type: ignore[union-attr]


def _target(root: Path, target: str) -> Path | None:
    """The checkpoint a fault damages: the newest by step number, or the named entry (no symlink)."""
    if target == "newest":
        return newest_checkpoint(root)
    path = root / target
    return path if path.exists() and not path.is_symlink() else None


def _victim(checkpoint: Path) -> Path | None:
    if checkpoint.is_file():
        return checkpoint
    files = [p for p in checkpoint.rglob("*") if p.is_file() and not p.is_symlink()]
    return max(files, key=lambda p: (p.stat().st_size, p.name), default=None)


def corrupt_before(run_dir: Path, ckpt_dir: str, plan: list[dict[str, Any]], attempt: int) -> None:
    """Apply every `corrupt` fault planned for `attempt`; each writes its `fault` event before the damage."""
    due = [f for f in plan if f.get("kind") == "corrupt" and f.get("attempt", 1) == attempt]
    if not due:
        return
    root = (Path(run_dir) / ckpt_dir)
    if root.is_symlink():
        return  # never follow a link out of the run directory
    events = EventLog(RunDir(run_dir).harness_events)
    try:
        for fault in due:
            newest = _target(root, fault.get("target", "newest"))
            victim = _victim(newest) if newest is not None else None
            if victim is None:
                continue  # nothing to damage: the fault did not fire, and the judge says so
            data = victim.read_bytes()
            how = fault.get("how", "flip")
            rel = victim.relative_to(root)
            detail = (f"flipped byte {len(data) // 2} of {rel}" if how == "flip"
                      else f"truncated {rel} from {len(data)} to {len(data) // 2} bytes")
            events.emit("fault", attempt=attempt, fault_id=fault["id"], rank=None, detail=detail,
                        fault_kind="corrupt", checkpoint=newest.name)
            if how == "flip" and data:
                middle = len(data) // 2
                data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
            else:
                data = data[:len(data) // 2]
            with open(victim, "r+b") as f:
                f.write(data)
                f.truncate(len(data))
                os.fsync(f.fileno())
    finally:
        events.close()
