"""The checkpoint store: atomic saves, verified loads, retention.

Layout under the storage root (``RUN_DIR/checkpoints``)::

    step-00000012/            one committed checkpoint: *.pt files + manifest.json
    .tmp-step-00000016-PID/   a save in progress (stale if its writer died)
    .trash-step-00000004-PID/ a checkpoint being removed by retention
    latest                    the commit record: {"step": 12, "checkpoint": "step-00000012"}

A save writes every file into a temporary directory and fsyncs it, writes the manifest
(sizes, sha256, step, config identity, state digest), renames the directory into
place, fsyncs the parent, and then commits by replacing ``latest`` atomically. The
pointer is the commit point: a directory newer than the pointer is a save that died
before committing and is never restored. Loading walks the committed checkpoints
newest first and takes the first whose manifest and checksums verify, emitting a
``reject`` for each one it skips.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from trainwreck.trainer import hooks as fp
from trainwreck.trainer.events import EventLog
from trainwreck.trainer.hooks import Hooks
from trainwreck.trainer.rundir import RunDir, iter_events
from trainwreck.trainer.storage import Storage, UnsafePathError, check_relative

CKPT_FORMAT = "trainwreck-ckpt/1"
POINTER = "latest"
MANIFEST = "manifest.json"
_NAME = re.compile(r"^step-(\d{8})$")


class CheckpointRejected(Exception):
    """This checkpoint cannot be used (missing, torn, tampered); an older one may be."""


class IncompatibleCheckpoint(RuntimeError):
    """An intact checkpoint from a different configuration: resuming would be wrong."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_step(name: str) -> int | None:
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def to_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> Any:
    # weights_only: a checkpoint is data, never code to run.
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


@dataclass(frozen=True)
class Verified:
    """A checkpoint whose manifest and every file's size and sha256 checked out."""

    name: str
    manifest: dict[str, Any]
    files: dict[str, bytes]
    payloads: dict[str, Any] = field(default_factory=dict)
    """Decoded files, filled by the loader's `decode` before the choice is final."""


Decode = Callable[[Verified], dict[str, Any]]
"""Turns a verified checkpoint into loadable objects; raises CheckpointRejected if it cannot."""

# Any of these while reading a checkpoint or the pointer means "unusable", never "crash":
# OSError (a file where a directory should be, a link loop), ValueError (NUL bytes, a
# symlink out of the store), RecursionError (JSON nested deep enough to break the parser).
UNUSABLE = (OSError, ValueError, RecursionError, UnicodeDecodeError, KeyError, TypeError)


def _step_dirs(storage: Storage) -> list[str]:
    names = [n for n in storage.list(".") if checkpoint_step(n) is not None]
    return sorted(names, key=lambda n: checkpoint_step(n) or 0, reverse=True)


def read_pointer(storage: Storage) -> int | None | str:
    """The committed step; None when nothing was ever committed; an error text when torn."""
    try:
        if not storage.exists(POINTER):
            return None
        record = json.loads(storage.read(POINTER))
        step = record["step"]
        if not isinstance(step, int) or checkpoint_name(step) != record["checkpoint"]:
            raise ValueError("fields do not agree")
        return step
    except UNUSABLE as exc:
        return f"commit pointer {POINTER!r} is unreadable ({type(exc).__name__}: {str(exc)[:200]})"


def committed_names(storage: Storage) -> list[str]:
    """THE rule for which checkpoints count as committed (the store and faults/corrupt.py
    both use it), newest first; docs/TRAINER.md explains it.

    - A readable pointer whose directory exists: the directories at or below it.
    - No pointer and at most one directory: nothing. That directory is the first save,
      dead between its rename and its pointer write; it was never committed.
    - Otherwise the pointer was damaged from outside (torn, deleted, a directory, or
      naming a step whose directory is gone; the writer never does any of these): every
      step directory counts, and verification decides which is intact. Losing the
      pointer must not make committed checkpoints vanish."""
    names = _step_dirs(storage)
    pointer = read_pointer(storage)
    if isinstance(pointer, int) and checkpoint_name(pointer) in names:
        return [n for n in names if (checkpoint_step(n) or 0) <= pointer]
    if pointer is None and len(names) <= 1:
        return []
    return names


class CheckpointStore:
    decode: Decode | None = None
    """Set by the trainer: what "loadable" means is the loader's business, not the store's."""

    def __init__(self, storage: Storage, events: EventLog, hooks: Hooks, keep_last: int) -> None:
        self.storage = storage
        self.events = events
        self.hooks = hooks
        self.keep_last = keep_last

    # ----- save -------------------------------------------------------------------------

    def save(self, step: int, files: dict[str, bytes], meta: dict[str, Any]) -> str:
        """Write and commit the checkpoint of the state after update `step`; returns its name."""
        started = time.perf_counter()
        return self.commit(step, self.stage(step, files, meta), meta, started)

    def commit(self, step: int, tmp: str, meta: dict[str, Any], started: float) -> str:
        """Rename a durably staged directory into place and commit it with the pointer
        (also the sharded writer's commit: trainer/sharded.py stages, this commits)."""
        name = checkpoint_name(step)
        self._move_aside(name)
        self.hooks.point(fp.SAVE_BEFORE_RENAME, step, checkpoint=name)
        self.storage.rename(tmp, name)
        self.storage.fsync_dir(".")
        self.hooks.point(fp.SAVE_AFTER_RENAME, step, checkpoint=name)
        self.hooks.point(fp.SAVE_BEFORE_POINTER, step, checkpoint=name)
        self._write_pointer(step, name)
        self.events.emit("save", step=step, checkpoint=name, digest=meta.get("digest"),
                         seconds=round(time.perf_counter() - started, 6))
        self.hooks.point(fp.SAVE_AFTER_POINTER, step, checkpoint=name)
        self.retain()
        return name

    def stage(self, step: int, files: dict[str, bytes], meta: dict[str, Any]) -> str:
        """Write every file and the manifest into a fresh temporary directory, durably;
        returns the directory. Nothing is visible to a loader yet."""
        name = checkpoint_name(step)
        tmp = f".tmp-{name}-{os.getpid()}"
        self.storage.remove(tmp)
        self.storage.mkdir(tmp)
        entries = {}
        for file_name, data in files.items():
            self._write_file(step, name, f"{tmp}/{file_name}", file_name, data)
            entries[file_name] = {"size": len(data), "sha256": sha256(data)}
        self.write_manifest(step, tmp, entries, meta)
        return tmp

    def write_manifest(self, step: int, tmp: str, entries: dict[str, Any], meta: dict[str, Any]) -> None:
        """The manifest (every file's size and sha256) last, then the directory made durable."""
        manifest = {"format": CKPT_FORMAT, "step": step, "files": entries, **meta}
        self._write_file(step, checkpoint_name(step), f"{tmp}/{MANIFEST}", MANIFEST,
                         json.dumps(manifest, indent=1, sort_keys=True).encode())
        self.storage.fsync_dir(tmp)

    def _write_file(self, step: int, name: str, path: str, file_name: str, data: bytes) -> None:
        self.hooks.point(fp.SAVE_BEFORE_FILE, step, checkpoint=name, file=file_name)
        self.storage.write(path, data)
        self.hooks.point(fp.SAVE_AFTER_FILE, step, checkpoint=name, file=file_name)

    def _move_aside(self, name: str) -> None:
        """Clear a directory of the same step left by a save that never committed
        (or one the loader rejected), so the rename below can land."""
        if self.storage.exists(name):
            trash = f".trash-{name}-{os.getpid()}"
            self.storage.rename(name, trash)
            self.storage.remove(trash)

    def _write_pointer(self, step: int, name: str) -> None:
        self.storage.write(f"{POINTER}.tmp", json.dumps({"step": step, "checkpoint": name}).encode())
        try:
            self.storage.rename(f"{POINTER}.tmp", POINTER)
        except IsADirectoryError:
            # A directory planted as `latest` (the loader rejected it): clear it so
            # the commit can land; it never held a commit record.
            self._move_aside(POINTER)
            self.storage.rename(f"{POINTER}.tmp", POINTER)
        self.storage.fsync_dir(".")

    # ----- retention --------------------------------------------------------------------

    def retain(self) -> None:
        """Keep the newest `keep_last` committed checkpoints; drop leftovers of dead saves."""
        committed = self.committed_names()
        for name in committed[self.keep_last:]:
            trash = f".trash-{name}-{os.getpid()}"
            self.storage.rename(name, trash)  # gone from the loader's view in one step
            self.events.emit("prune", checkpoint=name)
            self.storage.remove(trash)
        self.remove_stale()

    def remove_stale(self) -> None:
        for entry in self.storage.list("."):
            if entry.startswith((".tmp-", ".trash-")) or entry == f"{POINTER}.tmp":
                self.storage.remove(entry)

    def committed_names(self) -> list[str]:
        return committed_names(self.storage)

    def _step_dirs(self) -> list[str]:
        return _step_dirs(self.storage)

    def read_pointer(self) -> int | None | str:
        return read_pointer(self.storage)

    # ----- commit announcements ---------------------------------------------------------

    def announce_if_unannounced(self, verified: Verified) -> None:
        """Write the `save` event of a committed checkpoint whose writer died between the
        pointer rename (the commit) and its `save` event: two durable records cannot be
        written atomically, so the next attempt completes the log on the writer's behalf.

        Only a checkpoint the pointer proves committed is announced, so a loader that
        restores an uncommitted directory is never covered up."""
        pointer = self.read_pointer()
        step = checkpoint_step(verified.name)
        attempt = verified.manifest.get("attempt")
        if not isinstance(pointer, int) or step is None or step > pointer or not isinstance(attempt, int):
            return
        if self._announced(verified.name, attempt):
            return
        self.events.emit("save", attempt=attempt, step=step, checkpoint=verified.name,
                         digest=verified.manifest.get("digest"), recovered=True)

    def _announced(self, name: str, attempt: int) -> bool:
        """Whether attempt `attempt` or a later one already logged this checkpoint's `save`."""
        run_dir = RunDir.of_events_file(self.events.path).root
        return any(e["kind"] == "save" and e.get("checkpoint") == name and isinstance(e.get("attempt"), int)
                   and e["attempt"] >= attempt for e in iter_events(run_dir, batches=False))

    # ----- load -------------------------------------------------------------------------

    def select(self, identity: str) -> Verified | None:
        """The newest committed checkpoint that verifies and decodes (rank 0 decides for
        everyone, so a payload that cannot be decoded is found here, before the choice)."""
        pointer = self.read_pointer()
        if isinstance(pointer, str):
            self.events.emit("reject", checkpoint=POINTER, reason=pointer)
        committed = set(self.committed_names())
        for name in self._step_dirs():
            if name not in committed:
                self.events.emit("reject", checkpoint=name, reason=self._uncommitted_reason(pointer))
                continue
            try:
                verified = self.verify(name)
            except CheckpointRejected as exc:
                self.events.emit("reject", checkpoint=name, reason=str(exc))
                continue
            self.check_identity(verified, identity)
            return verified
        return None

    @staticmethod
    def _uncommitted_reason(pointer: int | None | str) -> str:
        if isinstance(pointer, int):
            return "never committed: newer than the commit pointer"
        return "never committed: no commit pointer, and no older checkpoint proves a commit happened"

    def verify(self, name: str) -> Verified:
        """Manifest, sizes, sha256, then `self.decode`; every failure is a CheckpointRejected."""
        try:
            verified = self._verify(name)
            if self.decode is None:
                return verified
            return Verified(name, verified.manifest, verified.files, self.decode(verified))
        except CheckpointRejected:
            raise
        except UNUSABLE as exc:
            raise CheckpointRejected(f"{name} is unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None

    def _verify(self, name: str) -> Verified:
        try:
            raw = self.storage.read(f"{name}/{MANIFEST}")
        except (FileNotFoundError, IsADirectoryError):
            raise CheckpointRejected(f"{name}/{MANIFEST} is missing") from None
        try:
            manifest = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise CheckpointRejected(f"{name}/{MANIFEST} is not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != CKPT_FORMAT:
            raise CheckpointRejected(f"{name}/{MANIFEST} is not a {CKPT_FORMAT} manifest")
        if manifest.get("step") != checkpoint_step(name):
            raise CheckpointRejected(f"{name}/{MANIFEST} names step {manifest.get('step')!r}")
        files = {}
        entries = manifest.get("files")
        if not isinstance(entries, dict) or not entries:
            raise CheckpointRejected(f"{name}/{MANIFEST} lists no files")
        for file_name, entry in entries.items():
            files[file_name] = self._verified_file(name, file_name, entry)
        return Verified(name=name, manifest=manifest, files=files)

    def _verified_file(self, name: str, file_name: str, entry: Any) -> bytes:
        try:
            relative = check_relative(file_name)
        except UnsafePathError as exc:
            raise CheckpointRejected(f"{name}/{MANIFEST}: {exc}") from None
        if len(relative.parts) != 1:
            raise CheckpointRejected(f"{name}/{MANIFEST} names {file_name!r}, not a file of the checkpoint")
        try:
            data = self.storage.read(f"{name}/{file_name}")
        except (FileNotFoundError, IsADirectoryError):
            raise CheckpointRejected(f"{name}/{file_name} is missing") from None
        if not isinstance(entry, dict) or len(data) != entry.get("size"):
            raise CheckpointRejected(
                f"{name}/{file_name} has {len(data)} bytes, the manifest says {entry.get('size') if isinstance(entry, dict) else entry!r}")
        if sha256(data) != entry.get("sha256"):
            raise CheckpointRejected(f"{name}/{file_name} fails its sha256 check")
        return data

    @staticmethod
    def check_identity(verified: Verified, identity: str) -> None:
        found = verified.manifest.get("config_identity")
        if found != identity:
            raise IncompatibleCheckpoint(
                f"checkpoint {verified.name} was written by config identity {found}, this run has "
                f"{identity}: resume with the configuration that wrote it, or start in a new run directory"
            )
