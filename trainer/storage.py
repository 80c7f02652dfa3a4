"""The storage seam: every byte of checkpoint I/O goes through one ``Storage``.

Paths are relative, '/'-separated, and must stay inside the storage root; anything
else is refused before touching the disk. Faults (stalls, ENOSPC, torn writes, crash
points) wrap a ``Storage``; the crash-point sweep records the calls made on it, so
each method is one file-system operation a crash can land before or after.
"""
from __future__ import annotations

import errno
import io
import mmap
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Protocol, TypeVar

from trainwreck.rundir import files

T = TypeVar("T")

READ_CHUNK = 4 << 20
"""Bytes per read where a file is gathered whole without a verifier (`_read_fd`)."""
STREAM_CHUNK = 256 << 10
"""Bytes per read while streaming a file to `on_chunk`: small enough that the chunk is
still in the cache (2 MB of L2 per core here) when a hash reads it just after the read
wrote it. The hash of a 100 MB file took 88 ms of CPU in 4 MB chunks (read back from
memory) and 61 ms in 256 KB chunks; 400 reads cost the reader about 15 ms more, on the
other thread."""


class Sink(Protocol):
    """Where a streamed write puts its bytes (`torch.save` writes into one of these)."""

    def write(self, data: bytes | memoryview) -> int: ...
    def flush(self) -> None: ...


Produce = Callable[[Sink], None]
"""Writes a file's content into the sink it is given, in one pass."""
OnChunk = Callable[[memoryview], None]
"""Sees each chunk of a file as it is read; the chunk stays valid after the call (it is a
slice of the buffer `read` returns), so a hash may consume it on another thread."""


class UnsafePathError(ValueError):
    """A path would leave the storage root (absolute, '..', or a symlink outside)."""


class Storage(Protocol):
    def exists(self, path: str) -> bool: ...
    def read(self, path: str, on_chunk: OnChunk | None = None, limit: int | None = None) -> bytes:
        """The whole file; `on_chunk` sees its bytes while they are read, so a verifier
        hashes in the same pass (the result is then a writable memoryview: same bytes, no copy).
        Only a regular file is read, never blocking on a FIFO or a device (files.NotRegularFile);
        one larger than `limit` bytes is refused by its size before it is read (files.TooLarge)."""
    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        """Create or replace the file with `data` and fsync it (durable on return);
        `durable=False` skips the fsync, as writers that forget it do (power-loss model)."""
    def write_stream(self, path: str, produce: Produce, durable: bool = True) -> int:
        """`write`, with the content streamed by `produce` instead of held in memory:
        one file-system write of one file (faults and recorders treat it as a `write`);
        returns the bytes written."""
    def mkdir(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None:
        """Atomic rename; `dst` must not be a non-empty directory."""
    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creations, renames, removals) durable."""
    def list(self, path: str) -> list[str]:
        """Names directly inside `path` (sorted); [] when it does not exist."""
    def remove(self, path: str) -> None:
        """Remove a file or a whole directory tree; missing is not an error."""


def check_relative(path: str) -> PurePosixPath:
    """Refuse absolute paths and '..' so a manifest cannot point outside the store."""
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\\" in path:
        raise UnsafePathError(
            f"path {path!r} escapes the checkpoint directory: use a relative path without '..'"
        )
    return p


class LocalStorage:
    """POSIX files under `root`."""

    def __init__(self, root: Path, within: Path | None = None) -> None:
        """`within`: the folder `root` must stay inside (the run directory): a `checkpoints/`
        that is a link out of it is refused (files.OutsideRoot), so the store never reads,
        writes or cleans up in whatever folder the link names."""
        self.root = files.inside(within, root) if within is not None else Path(root).resolve()

    def _abs(self, path: str) -> Path:
        full = (self.root / check_relative(path)).resolve()
        if full != self.root and self.root not in full.parents:
            raise UnsafePathError(f"path {path!r} resolves outside {self.root} (a symlink?)")
        return full

    def _entry(self, path: str) -> Path:
        """The entry `path` itself, never what it links to: only its parent is resolved,
        so a symlink is renamed, replaced or unlinked as a link and its target is untouched."""
        relative = check_relative(path)
        parent = self._abs(str(relative.parent)) if len(relative.parts) > 1 else self.root
        return parent / relative.name

    def exists(self, path: str) -> bool:
        return os.path.lexists(self._entry(path))

    def read(self, path: str, on_chunk: OnChunk | None = None, limit: int | None = None) -> bytes:
        fd = files.open_regular(self._abs(path), label=path)
        with open(fd, "rb", buffering=0) as file:
            size = os.fstat(fd).st_size
            if limit is not None:
                files.check_size(path, size, limit)
            if on_chunk is None:  # plain bytes (a caller may json.loads them), at most limit + 1
                data = file.readall() if limit is None else file.read(limit + 1)
                if limit is not None:
                    files.check_size(path, len(data), limit)
                return data
            return _read_chunked(file, on_chunk, size, limit)

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        self.write_stream(path, lambda sink: _write_all(sink, data), durable=durable)

    def write_stream(self, path: str, produce: Produce, durable: bool = True) -> int:
        # O_NOFOLLOW: a planted link at the destination is an error, never a way out.
        fd = os.open(self._entry(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            sink = FdSink(fd, writeback=durable)
            produce(sink)
            if durable:
                os.fsync(fd)
            return sink.size
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> None:
        self._abs(path).mkdir(parents=True, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        os.rename(self._entry(src), self._entry(dst))

    def fsync_dir(self, path: str) -> None:
        fd = os.open(self._abs(path) if path not in ("", ".") else self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def list(self, path: str) -> list[str]:
        target = self.root if path in ("", ".") else self._abs(path)
        try:
            return sorted(os.listdir(target))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            return []

    def remove(self, path: str) -> None:
        full = self._entry(path)
        if full.is_dir() and not full.is_symlink():
            shutil.rmtree(full, ignore_errors=False, onerror=_ignore_missing)
        else:
            try:
                full.unlink()
            except FileNotFoundError:
                pass


WRITEBACK_EVERY = 8 << 20
"""A durable streamed write starts the disk writing every this many bytes (see FdSink)."""


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux), or None where there is none."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function  # type: ignore[no-any-return]


_START_WRITEBACK = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


class FdSink:
    """A Sink straight onto a file descriptor: no user-space buffer, so the producer's
    chunks (a tensor's whole storage from `torch.save`) go to the kernel as they are.

    With `writeback`, every WRITEBACK_EVERY bytes it asks the kernel to start writing
    what it has so far (sync_file_range WRITE: start, do not wait), so the disk works
    while the producer serializes and hashes the rest, and the final fsync waits for the
    tail only. Durability still comes from that fsync alone."""

    def __init__(self, fd: int, writeback: bool = False) -> None:
        self.fd = fd
        self.size = 0
        self._started = 0
        self._writeback = writeback and _START_WRITEBACK is not None

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            view = view[os.write(self.fd, view):]
        self.size += total
        if self._writeback and self.size - self._started >= WRITEBACK_EVERY:
            _START_WRITEBACK(self.fd, self._started, self.size - self._started, _SYNC_FILE_RANGE_WRITE)  # type: ignore[misc]
            self._started = self.size
        return total

    def flush(self) -> None:
        pass  # nothing is buffered here; durability is the fsync after `produce`


def gather(produce: Produce) -> bytes:
    """The bytes a streamed write would write, in memory: for wrappers that must hold a
    file's whole content (a fault that tears it at half, the power-loss recorder)."""
    buffer = io.BytesIO()
    produce(buffer)
    return buffer.getvalue()


def _write_all(sink: Sink, data: bytes) -> None:
    sink.write(data)


def _read_chunked(file: "io.RawIOBase", on_chunk: OnChunk, size: int, limit: int | None = None) -> bytes:
    """Read the whole file into one buffer, handing each chunk to `on_chunk` as it lands.

    The buffer is an anonymous mapping, not a bytearray: a bytearray is zeroed (every page
    touched) before the first byte is read, while a mapping's pages are touched by the
    read itself, chunk by chunk, overlapping `on_chunk`'s hashing of the previous chunk.
    The result is a writable memoryview of it. A file whose size changed since fstat
    (never one of ours) is returned as a copy of what was read instead, at most `limit` + 1
    bytes of it (the caller's size check then refuses it)."""
    more = -1 if limit is None else limit + 1 - size
    if size == 0:
        rest = file.read(more)
        if rest:
            on_chunk(memoryview(rest))
        return rest
    view, got = memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)), 0
    while got < size:
        count = file.readinto(view[got:got + STREAM_CHUNK])
        if not count:
            return bytes(view[:got])  # shorter than it was: the size check rejects it
        on_chunk(view[got:got + count])
        got += count
    rest = file.read(more) if more else b""
    if rest:  # longer than it was
        on_chunk(memoryview(rest))
        return bytes(view) + rest
    return view  # type: ignore[return-value]  # a writable memoryview reads as bytes everywhere here


def _ignore_missing(func, path, exc_info) -> None:  # type: ignore[no-untyped-def]
    if not (isinstance(exc_info[1], OSError) and exc_info[1].errno == errno.ENOENT):
        raise exc_info[1]


class Heartbeat:
    """Calls `beat` after every operation of the storage it wraps.

    The checkpoint writer republishes its progress this way, so a save that is slow
    but moving keeps the watchdog's clock fresh; only one operation that itself
    outlasts the budget (a stalled write, a huge fsync) looks like silence."""

    def __init__(self, inner: Storage, beat: Callable[[], None]) -> None:
        self.inner = inner
        self.beat = beat

    def _after(self, result: T) -> T:
        self.beat()
        return result

    def exists(self, path: str) -> bool:
        return self._after(self.inner.exists(path))

    def read(self, path: str, on_chunk: OnChunk | None = None, limit: int | None = None) -> bytes:
        return self._after(self.inner.read(path, on_chunk, limit))

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        self._after(self.inner.write(path, data, durable=durable))

    def write_stream(self, path: str, produce: Produce, durable: bool = True) -> int:
        return self._after(self.inner.write_stream(path, produce, durable=durable))

    def mkdir(self, path: str) -> None:
        self._after(self.inner.mkdir(path))

    def rename(self, src: str, dst: str) -> None:
        self._after(self.inner.rename(src, dst))

    def fsync_dir(self, path: str) -> None:
        self._after(self.inner.fsync_dir(path))

    def list(self, path: str) -> list[str]:
        return self._after(self.inner.list(path))

    def remove(self, path: str) -> None:
        self._after(self.inner.remove(path))


# ----- torch.distributed.checkpoint through the seam --------------------------------------


def storage_fs(storage: Storage, root: Path, sync_files: bool = True) -> Any:
    """torch.distributed.checkpoint's FileSystem with every call routed through `storage`:
    a DCP FileSystemWriter or FileSystemReader given it (``writer.fs = storage_fs(...)``)
    writes and reads through the same seam as our own stores, so storage faults, the
    crash-point sweep's recorder and the power-loss recorder see DCP's files too.

    Each stream DCP writes becomes one ``Storage.write`` of the whole file when DCP closes
    it, durable (fsynced by the Storage) when `sync_files`. DCP's own `sync_files` only
    fsyncs the scratch file below: a writer that wants the Storage to decide durability
    (the trainer) sets DCP's to False and this one to True, so nothing is fsynced twice.
    Paths are taken relative to `root` (the Storage's root); one outside it is refused
    by the Storage like any other."""
    from contextlib import contextmanager

    from torch.distributed.checkpoint.filesystem import FileSystem

    def rel(path: str | os.PathLike[str]) -> str:
        return os.path.relpath(Path(path), root).replace(os.sep, "/")

    class StorageFS(FileSystem):  # type: ignore[misc]
        @contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
            if "r" in mode:
                yield io.BytesIO(storage.read(rel(path)))
                return
            # A real descriptor, so DCP's os.fsync(stream.fileno()) works as it does on disk,
            # but one with no name in any folder: a rank killed mid-write leaves nothing behind
            # (a named scratch file in $TMPDIR outlived every killed rank).
            fd = _anonymous_fd()
            try:
                with open(os.dup(fd), "w+b") as stream:  # DCP closes it; `fd` keeps the content
                    yield stream
                storage.write(rel(path), _read_fd(fd), durable=sync_files)
            finally:
                os.close(fd)

        def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
            storage.rename(rel(path), rel(new_path))

        def mkdir(self, path: str | os.PathLike[str]) -> None:
            if rel(path) != ".":
                storage.mkdir(rel(path))

        def exists(self, path: str | os.PathLike[str]) -> bool:
            return rel(path) == "." or storage.exists(rel(path))

        def rm_file(self, path: str | os.PathLike[str]) -> None:
            storage.remove(rel(path))

    return StorageFS()



def _anonymous_fd() -> int:
    """A read-write descriptor of a file with no name in any folder (memfd: nothing on disk,
    gone with the process; elsewhere an unnamed temporary file)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("trainwreck-dcp-stream", os.MFD_CLOEXEC)
    import tempfile

    with tempfile.TemporaryFile() as unnamed:
        return os.dup(unnamed.fileno())


def _read_fd(fd: int) -> bytes:
    size, parts, offset = os.fstat(fd).st_size, [], 0
    while offset < size:
        parts.append(os.pread(fd, min(READ_CHUNK, size - offset), offset))
        if not parts[-1]:
            break
        offset += len(parts[-1])
    return b"".join(parts)
