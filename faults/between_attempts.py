"""Corrupting a foreign trainer's newest checkpoint between attempts (`trainwreck run --cmd`).

The reference trainer's corruption runs inside rank 0 (faults/corrupt.py) through its
storage; a user's command has no such seam, so the harness does it itself just before it
launches attempt `attempt`: the previous attempt's processes are reaped, the next one has
not looked yet. "Newest" is the newest committed checkpoint the run's own `save` events
name (the highest step; not pruned since), whatever its name (`snapshot.pt` overwritten in
place, HF `checkpoint-12`), found under the checkpoint directory or the run directory; a
run with no `save` event (or whose newest is not on disk) falls back to the entry of the
checkpoint directory with the highest step number in its name. In a directory checkpoint the largest file is damaged.
Nothing outside the run directory is touched, and no symlink is followed. `target` names an
entry relative to the checkpoint directory instead (Lightning's `last.ckpt`).

A fault that finds nothing to damage does not fire, and says why in
RUN_DIR/faults-unapplied.jsonl: the judge then calls the run "unknown" with that reason
(the run tested nothing), never invalid.

    {"id": "c1", "kind": "corrupt", "how": "flip" | "truncate", "attempt": 1}
    {"id": "c2", "kind": "corrupt", "how": "truncate", "target": "last.ckpt"}
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from trainwreck.rundir.events import EventLog
from trainwreck.rundir.layout import RunDir, iter_events

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


UNAPPLIED = "faults-unapplied.jsonl"
"""RUN_DIR/UNAPPLIED: one line per corruption fault that found nothing to damage, with the reason."""


def newest_committed(run_dir: Path, root: Path, attempt: int) -> tuple[Path | None, str | None, str]:
    """(its path, the name its `save` gave it, why not) of the newest committed checkpoint the
    run's own `save` events name before `attempt`; a name pruned since its last save is skipped.
    (None, None, reason) when no save names one that is still on disk."""
    saves: dict[str, dict[str, Any]] = {}
    for ev in iter_events(run_dir, batches=False):
        before = not isinstance(ev.get("attempt"), int) or ev["attempt"] < attempt
        name = ev.get("checkpoint")
        if ev.get("kind") == "save" and before and isinstance(name, str) and isinstance(ev.get("step"), int):
            if name not in saves or ev["t"] >= saves[name]["t"]:
                saves[name] = ev
        elif ev.get("kind") == "prune" and isinstance(name, str) and name in saves and ev["t"] >= saves[name]["t"]:
            del saves[name]
    if not saves:
        return None, None, "the run's events announce no committed checkpoint (no `save` event) before it"
    newest = max(saves.values(), key=lambda ev: (ev["step"], ev["t"]))
    name = newest["checkpoint"]
    nested = sorted(root.rglob(Path(name).name)) if root.is_dir() and not root.is_symlink() else []
    path = _inside(run_dir, [root / name, Path(run_dir) / name, *nested])
    if path is None:
        return None, name, (f"the newest committed checkpoint {name!r} (step {newest['step']}, "
                            f"attempt {newest.get('attempt')}) is not under {root} nor the run directory")
    return path, name, ""


def _inside(run_dir: Path, candidates: list[Path]) -> Path | None:
    """The first candidate that exists inside the run directory, reached through no symlink."""
    top = Path(run_dir).resolve()
    for path in candidates:
        if path.exists() and not path.is_symlink() and path.resolve().is_relative_to(top):
            return path
    return None


def _target(run_dir: Path, root: Path, target: str, attempt: int) -> tuple[Path | None, str | None, str]:
    """(path, checkpoint name, why not) of what a fault damages: the newest committed checkpoint
    (by the run's saves; by step number in names when it has none), or the named entry."""
    if target != "newest":
        path = root / target
        ok = path.exists() and not path.is_symlink()
        return (path, path.name, "") if ok else (None, None, f"its target {target!r} is not in {root}")
    path, name, why = newest_committed(run_dir, root, attempt)
    if path is not None:
        return path, name, why
    by_step = newest_checkpoint(root)  # writers that announce no saves, or name them oddly
    if by_step is not None:
        return by_step, by_step.name, ""
    return None, None, f"{why}, and no entry of {root} carries a step number in its name"


def unapplied(run_dir: Path) -> list[dict[str, Any]]:
    """The corruption faults that found nothing to damage (harness-written; unreadable lines skipped)."""
    try:
        lines = (Path(run_dir) / UNAPPLIED).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _record_unapplied(run_dir: Path, fault: dict[str, Any], attempt: int, why: str) -> None:
    with open(Path(run_dir) / UNAPPLIED, "a") as f:
        f.write(json.dumps({"fault_id": fault.get("id"), "attempt": attempt,
                            "reason": f"fault {fault.get('id')} found no checkpoint to damage before attempt "
                                      f"{attempt}: {why}"}) + "\n")


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
            newest, name, why = _target(run_dir, root, fault.get("target", "newest"), attempt)
            victim = _victim(newest) if newest is not None else None
            if newest is None or victim is None:
                _record_unapplied(run_dir, fault, attempt, why or f"{newest} holds no file")
                continue  # nothing to damage: the fault did not fire, and the judge says why
            data = victim.read_bytes()
            how = fault.get("how", "flip")
            rel = victim.relative_to(newest.parent)
            detail = (f"flipped byte {len(data) // 2} of {rel}" if how == "flip"
                      else f"truncated {rel} from {len(data)} to {len(data) // 2} bytes")
            events.emit("fault", attempt=attempt, fault_id=fault["id"], rank=None, detail=detail,
                        fault_kind="corrupt", checkpoint=name)
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
