"""The checkpoint store: atomic saves, verified loads, retention.

Layout under the storage root (``RUN_DIR/checkpoints``)::

    step-00000012/            one committed checkpoint: *.pt files + manifest.json
    step-00000012.1/          the same step saved again while a rejected step-00000012/
                              could not be moved aside (left in place, named once)
    .tmp-step-00000016-PID/   a save in progress (stale if its writer died)
    .trash-step-00000004-PID/ a checkpoint being removed by retention
    latest                    the commit record: {"step": 12, "checkpoint": "step-00000012"}

A save streams every file into a temporary directory (``torch.save`` through the checksum
straight into the file: one pass, no copy of the file in memory) and fsyncs it, writes the
manifest (sizes, checksums, step, config identity, state digest), renames the directory into
place, and then commits by replacing ``latest`` atomically and fsyncing the parent once
(both renames are in it, and one directory's entries persist in order). The
pointer is the commit point: a directory newer than the pointer is a save that died
before committing and is never restored. Loading walks the committed checkpoints
newest first and takes the first whose manifest and checksums verify, emitting a
``reject`` for each one it skips. Which checksum (BLAKE3; sha256 in older manifests) is
trainer/checksum.py's rule.
"""
from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import torch
import torch.serialization as torch_serialization_impl

try:  # torch >= 2.5; on older torch every save computes the crc32 (slower, same bytes kept)
    import torch.utils.serialization.config as torch_serialization
except ImportError:
    torch_serialization = None  # type: ignore[assignment]

# The zero-copy decode below uses torch's own weights-only loader, a private API; where a
# torch lacks it (the code runs on torch >= 2.4), decoding takes the public, copying path.
_ZERO_COPY_DECODE = all(hasattr(torch_serialization_impl, name) for name in
                        ("_load", "_open_zipfile_reader", "_weights_only_unpickler"))

from trainwreck.trainer import checksum
from trainwreck.trainer import hooks as fp
from trainwreck.rundir.events import EventLog
from trainwreck.rundir.files import SMALL_LIMIT, NotRegularFile, TooLarge
from trainwreck.trainer.hooks import Hooks
from trainwreck.rundir.layout import RunDir, iter_events
from trainwreck.trainer.storage import Sink, Storage, UnsafePathError, check_relative

CKPT_FORMAT = "trainwreck-ckpt/1"
POINTER = "latest"
MANIFEST = "manifest.json"
_NAME = re.compile(r"^step-(\d{8})(?:\.([1-9]\d{0,5}))?$")


class CheckpointRejected(Exception):
    """This checkpoint cannot be used (missing, torn, tampered); an older one may be."""


class IncompatibleCheckpoint(RuntimeError):
    """An intact checkpoint from a different configuration: resuming would be wrong."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_step(name: str) -> int | None:
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def checkpoint_order(name: str) -> tuple[int, int]:
    """(step, save number): a step saved again under a fresh name (`step-N.1`, because a
    rejected `step-N` could not be moved aside) sorts after the one it replaces."""
    match = _NAME.match(name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else (-1, 0)


def to_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> Any:
    """Decode a payload weights-only (a checkpoint is data, never code to run).

    A verified read returns a writable buffer (a memoryview of an anonymous mapping); its
    tensors are then views of that buffer (what `torch.load(mmap=True)` does with a file, done with the bytes that were
    hashed), so decoding copies nothing. This calls torch's own weights-only loader,
    `torch.serialization._load`, with the buffer as the backing storage: private API,
    pinned by the torch version and by tests/trainer/test_streaming_checkpoint.py."""
    if _ZERO_COPY_DECODE and isinstance(data, (bytearray, memoryview)) and not memoryview(data).readonly:
        backing = torch.frombuffer(data, dtype=torch.uint8).untyped_storage() if data else None
        with torch_serialization_impl._open_zipfile_reader(_ReadOnlyView(data)) as archive:
            return torch_serialization_impl._load(archive, "cpu", torch_serialization_impl._weights_only_unpickler,
                                                  overall_storage=backing, encoding="utf-8")
    return torch.load(_ReadOnlyView(data), map_location="cpu", weights_only=True)


class _ReadOnlyView(io.RawIOBase):
    """A seekable file over any bytes-like buffer without copying it (io.BytesIO copies
    anything but bytes): torch's zip reader reads the verified buffer in place."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.view = memoryview(data).cast("B")
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        count = max(0, min(len(out), len(self.view) - self.pos))
        out[:count] = self.view[self.pos:self.pos + count]
        self.pos += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.view)}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos


@dataclass(frozen=True)
class Payload:
    """A checkpoint file given as the object to serialize: the store streams `torch.save`
    of it through the checksum straight into the file. Files given as bytes are written as is
    (planted defects craft some)."""

    obj: Any


FileContent = Union[bytes, Payload]


def payload_object(content: FileContent) -> Any:
    """The object a checkpoint file holds, whichever way it was given."""
    return content.obj if isinstance(content, Payload) else from_bytes(content)


PARALLEL_HASH_MIN = 1 << 20
"""Chunks at least this big are hashed on a second thread while they are written (or
read); smaller ones are not worth the hand-off."""
_CRC32_LOCK = threading.Lock()
HASH_LAG = 1
"""Chunks a verified read may have read but not yet hashed: the next chunk is read while
this one is hashed, no further ahead, so the hash reads what the read has just written,
still in the cache. Further ahead the hash reads chunks the cache has already let go
(100 MB in 256 KB chunks: 61 ms of sha256 CPU at 1, 77 at 3, measured before BLAKE3)."""


class HashingSink:
    """Passes every chunk on to `inner` while the checksum consumes the same chunk on `pool`'s
    thread (the hash and os.write both release the GIL). A chunk from `torch.save` is only
    valid during the call, so the hash of each chunk is awaited before `write` returns."""

    def __init__(self, inner: Sink, pool: ThreadPoolExecutor) -> None:
        self.inner, self.pool = inner, pool
        self.digest = checksum.new_hasher()
        self.size = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        if len(view) < PARALLEL_HASH_MIN:
            self.digest.update(view)
            self.inner.write(view)
        else:
            hashed = self.pool.submit(self.digest.update, view)
            try:
                self.inner.write(view)
            finally:
                hashed.result()  # never return while the hash still reads the caller's buffer
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        self.inner.flush()


def save_payload(obj: Any, sink: Sink) -> None:
    """`torch.save` into a sink, without torch's per-record crc32: every file's checksum
    is in the manifest and is checked before anything is unpickled, so the crc32 would be
    a second, weaker pass over the same bytes. (torch reads the flag when the writer is
    created; the lock keeps two saving threads from restoring each other's value.)"""
    if torch_serialization is None:
        torch.save(obj, sink)  # type: ignore[arg-type]
        return
    with _CRC32_LOCK:
        previous = torch_serialization.save.compute_crc32
        torch_serialization.save.compute_crc32 = False
        try:
            torch.save(obj, sink)  # type: ignore[arg-type]  # a Sink is a binary file for torch
        finally:
            torch_serialization.save.compute_crc32 = previous


@dataclass(frozen=True)
class Verified:
    """A checkpoint whose manifest and every file's size and checksum checked out."""

    name: str
    manifest: dict[str, Any]
    files: dict[str, bytes]
    """The verified bytes of each file (a writable memoryview: read once, never copied)."""
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
    return sorted(names, key=checkpoint_order, reverse=True)


def read_pointer(storage: Storage) -> int | None | str:
    """The committed step; None when nothing was ever committed; an error text when torn."""
    record = _pointer_record(storage)
    return record[0] if isinstance(record, tuple) else record


def _pointer_record(storage: Storage) -> tuple[int, str] | None | str:
    """The committed (step, checkpoint name); None when nothing was ever committed; an error text when torn."""
    try:
        if not storage.exists(POINTER):
            return None
        record = json.loads(storage.read(POINTER, limit=SMALL_LIMIT))
        step, name = record["step"], record["checkpoint"]
        if not isinstance(step, int) or not isinstance(name, str) or checkpoint_step(name) != step:
            raise ValueError("fields do not agree")
        return step, name
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
    pointer = _pointer_record(storage)
    if isinstance(pointer, tuple) and pointer[1] in names:
        return [n for n in names if checkpoint_order(n) <= checkpoint_order(pointer[1])]
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
        self._left_in_place: set[str] = set()

    # ----- save -------------------------------------------------------------------------

    def save(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> str:
        """Write and commit the checkpoint of the state after update `step`; returns its name."""
        started = time.perf_counter()
        return self.commit(step, self.stage(step, files, meta), meta, started)

    def commit(self, step: int, tmp: str, meta: dict[str, Any], started: float) -> str:
        """Rename a durably staged directory into place and commit it with the pointer
        (also the sharded writer's commit: trainer/sharded.py stages, this commits)."""
        name = self._free_name(step)
        self.hooks.point(fp.SAVE_BEFORE_RENAME, step, checkpoint=name)
        # No fsync of the store between this rename and the pointer's: entry operations of one
        # directory persist in order (a power cut keeps a prefix of them, faults/powerloss.py
        # rule 3), so the one fsync after the pointer's rename makes both durable, and a
        # pointer that survived names a directory that did.
        self.storage.rename(tmp, name)
        self.hooks.point(fp.SAVE_AFTER_RENAME, step, checkpoint=name)
        self.hooks.point(fp.SAVE_BEFORE_POINTER, step, checkpoint=name)
        self._write_pointer(step, name)
        self.events.emit("save", step=step, checkpoint=name, digest=meta.get("digest"),
                         seconds=round(time.perf_counter() - started, 6))
        self.hooks.point(fp.SAVE_AFTER_POINTER, step, checkpoint=name)
        self.retain()
        return name

    def stage(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> str:
        """Write every file and the manifest into a fresh temporary directory, durably;
        returns the directory. Nothing is visible to a loader yet."""
        name = checkpoint_name(step)
        tmp = f".tmp-{name}-{os.getpid()}"
        self.storage.remove(tmp)
        self.storage.mkdir(tmp)
        entries = {}
        with ThreadPoolExecutor(1, thread_name_prefix="ckpt-hash") as pool:
            for file_name, content in files.items():
                entries[file_name] = self._write_file(step, name, f"{tmp}/{file_name}", file_name, content, pool)
        self.write_manifest(step, tmp, entries, meta)
        return tmp

    def write_manifest(self, step: int, tmp: str, entries: dict[str, Any], meta: dict[str, Any]) -> None:
        """The manifest (every file's size and checksum) last, then the directory made durable."""
        manifest = {"format": CKPT_FORMAT, "step": step, "files": entries, **meta}
        self._write_file(step, checkpoint_name(step), f"{tmp}/{MANIFEST}", MANIFEST,
                         json.dumps(manifest, indent=1, sort_keys=True).encode())
        self.storage.fsync_dir(tmp)

    def _write_file(self, step: int, name: str, path: str, file_name: str, content: FileContent,
                    pool: ThreadPoolExecutor | None = None) -> dict[str, Any]:
        """Write one file durably (a Payload streamed and hashed in the same pass); its manifest entry."""
        self.hooks.point(fp.SAVE_BEFORE_FILE, step, checkpoint=name, file=file_name)
        if isinstance(content, Payload) and pool is not None:
            hashed: list[HashingSink] = []

            def produce(sink: Sink) -> None:
                hashed.append(HashingSink(sink, pool))
                save_payload(content.obj, hashed[-1])

            self.storage.write_stream(path, produce)
            entry = checksum.entry(hashed[-1].size, hashed[-1].digest.hexdigest())
        else:
            data = content if isinstance(content, bytes) else to_bytes(content.obj)
            self.storage.write(path, data)
            entry = checksum.entry_of(data)
        self.hooks.point(fp.SAVE_AFTER_FILE, step, checkpoint=name, file=file_name)
        return entry

    def _free_name(self, step: int) -> str:
        """`step-N`, cleared of a directory left by a save that never committed (or one the
        loader rejected). One that cannot be moved aside (no permission, immutable) stays
        where it is, named once, and this save takes the next fresh name, `step-N.1`, ...:
        the pointer then names the fresh one, so the loader tries it first and retention
        never counts what was left in place."""
        name, number = checkpoint_name(step), 0
        while not self._move_aside(name):
            number += 1
            name = f"{checkpoint_name(step)}.{number}"
        return name

    def _move_aside(self, name: str) -> bool:
        """Clear `name` so a rename can land there; False when it cannot be moved."""
        if not self.storage.exists(name):
            return True
        trash = self._rename_aside(name)
        if trash is None:
            return False
        self.discard(trash)
        return True

    def _rename_aside(self, name: str) -> str | None:
        """Rename `name` to a fresh trash name (out of the loader's view in one step) and return
        that name; None when it cannot be renamed (it is then named once, left in place)."""
        trash = self._trash_name(name)
        try:
            self.storage.rename(name, trash)
        except OSError as exc:
            self._name_left_in_place(name, exc, "cannot be moved aside")
            return None
        return trash

    def _name_left_in_place(self, entry: str, exc: OSError, what: str) -> None:
        """One `reject` event per entry the store had to leave where it is."""
        if entry not in self._left_in_place:
            self._left_in_place.add(entry)
            self.events.emit("reject", checkpoint=entry, reason=(
                f"{what} ({exc.strerror or type(exc).__name__}); left in place: "
                f"fix its permissions or delete it by hand"))

    def _trash_name(self, name: str) -> str:
        """A fresh `.trash-NAME-PID` (numbered when an undeletable one of ours is still there)."""
        trash, number = f".trash-{name}-{os.getpid()}", 0
        while self.storage.exists(trash):
            number += 1
            trash = f".trash-{name}-{os.getpid()}-{number}"
        return trash

    def discard(self, entry: str) -> None:
        """Remove a leftover (a pruned or rejected checkpoint, a dead save's temporary).
        One that cannot be removed (no permission, a read-only folder) is left in place and
        named once in a `reject` event: it is out of the loader's view already, and dying
        here would make every later attempt die the same way before it restores."""
        try:
            self.storage.remove(entry)
        except OSError as exc:
            self._name_left_in_place(entry, exc, "cannot be removed")

    def _write_pointer(self, step: int, name: str) -> None:
        self.storage.write(f"{POINTER}.tmp", json.dumps({"step": step, "checkpoint": name}).encode())
        try:
            self.storage.rename(f"{POINTER}.tmp", POINTER)
        except IsADirectoryError:
            # A directory planted as `latest` (the loader rejected it): clear it so
            # the commit can land; it never held a commit record.
            if not self._move_aside(POINTER):
                raise
            self.storage.rename(f"{POINTER}.tmp", POINTER)
        self.storage.fsync_dir(".")

    # ----- retention --------------------------------------------------------------------

    def retain(self) -> None:
        """Keep the newest `keep_last` committed checkpoints; drop leftovers of dead saves.
        A step saved again (`step-N.1` beside an immovable `step-N`) counts once, by its
        newest save: what was left in place never takes an intact checkpoint's slot."""
        committed = self.committed_names()
        newest: dict[int | None, str] = {}
        current = [n for n in committed if newest.setdefault(checkpoint_step(n), n) == n]
        for name in committed:
            if name in current[:self.keep_last]:
                continue
            trash = self._rename_aside(name)
            if trash is not None:
                self.events.emit("prune", checkpoint=name)
                self.discard(trash)
        self.remove_stale()

    def remove_stale(self) -> None:
        for entry in self.storage.list("."):
            if entry.startswith((".tmp-", ".trash-")) or entry == f"{POINTER}.tmp":
                self.discard(entry)

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
        """Manifest, sizes, checksums, then `self.decode`; every failure is a CheckpointRejected."""
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
            raw = self.storage.read(f"{name}/{MANIFEST}", limit=SMALL_LIMIT)
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
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise CheckpointRejected(f"{name}/{MANIFEST} gives {file_name!r} no size (found {entry!r:.200})")
        try:  # before reading: a damaged entry costs no read of the file
            algorithm, expected = checksum.expected(entry)
        except checksum.UnknownChecksum as exc:
            raise CheckpointRejected(f"{name}/{MANIFEST} gives {file_name!r} {exc}") from None
        try:  # bounded by the manifest: a 2 GiB sparse file is refused by its size, unread
            data, digest = self._read_hashed(f"{name}/{file_name}", checksum.new_hasher(algorithm), limit=size)
        except (FileNotFoundError, IsADirectoryError):
            raise CheckpointRejected(f"{name}/{file_name} is missing") from None
        except TooLarge as exc:
            raise CheckpointRejected(f"{name}/{file_name}: {exc}, the manifest says {size}") from None
        except NotRegularFile as exc:
            raise CheckpointRejected(str(exc)) from None
        if len(data) != size:
            raise CheckpointRejected(
                f"{name}/{file_name} has {len(data)} bytes, the manifest says {entry.get('size') if isinstance(entry, dict) else entry!r}")
        if digest != expected:
            raise CheckpointRejected(f"{name}/{file_name} fails its {algorithm} check")
        return data

    def _read_hashed(self, path: str, digest: checksum.Hasher, limit: int | None = None) -> tuple[bytes, str]:
        """The file's bytes and their hex digest by `digest`, in one read: each chunk is hashed
        on a second thread while the next is read. The bytes returned are the bytes hashed, so
        what is later unpickled is exactly what was verified (the file is never read twice)."""
        pending: deque[Future[None]] = deque()
        with ThreadPoolExecutor(1, thread_name_prefix="ckpt-hash") as pool:

            def hash_chunk(chunk: memoryview) -> None:
                pending.append(pool.submit(digest.update, chunk))
                if len(pending) > HASH_LAG:
                    pending.popleft().result()

            try:
                data = self.storage.read(path, on_chunk=hash_chunk, limit=limit)
            finally:
                while pending:  # one worker: the chunks are hashed in file order
                    pending.popleft().result()
        return data, digest.hexdigest()

    @staticmethod
    def check_identity(verified: Verified, identity: str) -> None:
        found = verified.manifest.get("config_identity")
        if found != identity:
            raise IncompatibleCheckpoint(
                f"checkpoint {verified.name} was written by config identity {found}, this run has "
                f"{identity}: resume with the configuration that wrote it, or start in a new run directory"
            )
