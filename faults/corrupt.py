"""Checkpoint corruption between attempts: damage what the next attempt will find.

When it runs: rank 0's hooks apply a `corrupt` fault in ``bind()`` of attempt
`attempt` (default 1). ``bind`` runs before the process group exists, so the other
ranks of that attempt cannot get past rendezvous, and nobody reads a checkpoint until
rank 0 has selected one after rendezvous. So this is exactly "between attempts": the
previous attempt's processes are gone (the harness reaps them before it launches the
next) and the new one has not looked yet. Doing it in-rank rather than in the harness
keeps every injector in faults/ and needs no new harness hook.

Where: the checkpoint store of the run directory, reached through the trainer's
``LocalStorage`` (so a target name cannot escape it). The fault event carries
``rank: null`` (damage from outside any training rank, counted before the attempt by
the atomicity checker), ``applied_by_rank: 0`` and ``checkpoint`` for each checkpoint
it damaged, and is written before the damage is done.

A fault that finds nothing to damage (no committed checkpoint, a named target or file the
run never wrote: `__1_0.distcp` at world size 1) raises `CannotAct` with the reason; the
hooks record it as a `fault_skip` event and the judge reports the fault as never fired
(unknown), never as a crash of the rank that applied it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from trainwreck.trainer.checkpoint import MANIFEST, POINTER, checkpoint_name, checkpoint_step, committed_names
from trainwreck.rundir.layout import RunDir
from trainwreck.trainer.storage import LocalStorage, Storage

# emit(fault, detail, checkpoint=None): records the `fault` event (flushed) before the damage.
Emit = Callable[..., None]


class CannotAct(Exception):
    """A fault whose target does not exist in this run: the message says what was missing."""


def checkpoints_root(events_path: Path) -> Path:
    """RUN_DIR/checkpoints of the run a rank's event file belongs to."""
    return RunDir.of_events_file(events_path).checkpoints


def committed(storage: Storage) -> list[str]:
    """Checkpoints the loader counts as committed, newest first: the store's own rule
    (trainer/checkpoint.py `committed_names`), so a fault never picks a different target."""
    return committed_names(storage)


def targets(storage: Storage, fault: dict[str, Any], how_many: int = 1) -> list[str]:
    """The checkpoints to damage: the newest committed ones, or the one named by `target`."""
    target = fault.get("target", "newest")
    if target != "newest":
        if target not in storage.list("."):
            raise CannotAct(f"its target {target!r} is not in checkpoints/")
        return [target]
    names = committed(storage)[:how_many]
    if len(names) < how_many:
        raise CannotAct(f"it needs {how_many} committed checkpoint(s) and the store holds {len(names)}")
    return names


def apply_corruption(fault: dict[str, Any], storage: Storage, emit: Emit) -> list[str]:
    """Apply one `corrupt` fault; returns the damaged checkpoints. Nothing to damage raises
    CannotAct before any event or damage, so the run is judged "unknown" (the fault did not
    test anything) and says why."""
    how = fault["how"]
    if how == "tear_pointer":
        return _tear_pointer(fault, storage, emit)
    if how == "stale_tmp":
        return _stale_tmp(fault, storage, emit)
    names = targets(storage, fault, 2 if how == "break_newest_two" else 1)
    if how != "delete_manifest":  # every file is checked before any is damaged: all or nothing
        for name in names:
            _existing(storage, _file(fault, name))
    for name in names:
        if how == "delete_manifest":
            emit(fault, f"deleted {name}/{MANIFEST}", checkpoint=name)
            storage.remove(f"{name}/{MANIFEST}")
        elif how in ("truncate", "break_newest_two"):
            _truncate(fault, storage, emit, name)
        elif how == "flip":
            _flip(fault, storage, emit, name)
    return names


def _file(fault: dict[str, Any], name: str) -> str:
    return f"{name}/{fault.get('file', 'model.pt')}"


def _existing(storage: Storage, path: str) -> str:
    """`path` if the store holds it; otherwise why the fault cannot act, with what is there."""
    if storage.exists(path):
        return path
    folder = path.rpartition("/")[0] or "."
    try:
        present = ", ".join(sorted(storage.list(folder))[:8]) or "nothing"
    except OSError:
        present = "nothing readable"
    raise CannotAct(f"{path} does not exist (that checkpoint holds {present}); a file name that names a "
                    "rank, such as __1_0.distcp, exists only when the run has that rank")


def _truncate(fault: dict[str, Any], storage: Storage, emit: Emit, name: str) -> None:
    path = _file(fault, name)
    data = storage.read(path)
    size = min(fault.get("offset", len(data) // 2), len(data))
    if size == len(data):
        size = max(0, len(data) - 1)  # an offset at or past the end would change nothing
    emit(fault, f"truncated {path} from {len(data)} to {size} bytes", checkpoint=name)
    storage.write(path, data[:size])


def _flip(fault: dict[str, Any], storage: Storage, emit: Emit, name: str) -> None:
    path = _file(fault, name)
    data = bytearray(storage.read(path))
    start = min(fault.get("offset", len(data) // 2), max(0, len(data) - 1))
    end = min(start + fault.get("count", 1), len(data))
    emit(fault, f"flipped bytes {start}..{end - 1} of {path} ({len(data)} bytes)", checkpoint=name)
    for i in range(start, end):
        data[i] ^= 0xFF
    storage.write(path, bytes(data))


def _tear_pointer(fault: dict[str, Any], storage: Storage, emit: Emit) -> list[str]:
    # The pointer is not a checkpoint: no `checkpoint` field; every checkpoint stays intact.
    if not storage.exists(POINTER):
        raise CannotAct(f"there is no {POINTER} pointer to tear (no checkpoint was committed)")
    data = storage.read(POINTER)
    emit(fault, f"tore {POINTER}: kept {len(data) // 2} of {len(data)} bytes")
    storage.write(POINTER, data[: len(data) // 2])
    return []


def _stale_tmp(fault: dict[str, Any], storage: Storage, emit: Emit) -> list[str]:
    """A save that died half-way: a temporary directory of the next step with a torn file.
    It damages no checkpoint; it must never be restored and retention must clear it."""
    newest = committed(storage)
    step = (checkpoint_step(newest[0]) or 0) + 1 if newest else 1
    tmp = f".tmp-{checkpoint_name(step)}-999999"
    emit(fault, f"left a stale temporary directory {tmp} with a half-written model.pt")
    storage.mkdir(tmp)
    storage.write(f"{tmp}/model.pt", b"PK\x03\x04 torn")
    return []


def corrupt_run_dir(fault: dict[str, Any], events_path: Path, emit: Emit) -> list[str]:
    """`apply_corruption` on the store of the run directory that holds `events_path`."""
    root = checkpoints_root(events_path)
    if not root.is_dir():
        raise CannotAct("the run directory has no checkpoints/ (no checkpoint was saved)")
    try:
        storage = LocalStorage(root, within=root.parent)  # a checkpoints/ linked elsewhere is not ours to damage
    except OSError as exc:
        raise CannotAct(f"checkpoints/ cannot be opened inside the run directory: {exc}") from None
    return apply_corruption(fault, storage, emit)
