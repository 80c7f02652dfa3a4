"""The storage seam: every byte of checkpoint I/O goes through one ``Storage``.

Paths are relative, '/'-separated, and must stay inside the storage root; anything
else is refused before touching the disk. Faults (stalls, ENOSPC, torn writes, crash
points) wrap a ``Storage``; the crash-point sweep records the calls made on it, so
each method is one file-system operation a crash can land before or after.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Callable, Protocol, TypeVar

T = TypeVar("T")


class UnsafePathError(ValueError):
    """A path would leave the storage root (absolute, '..', or a symlink outside)."""


class Storage(Protocol):
    def exists(self, path: str) -> bool: ...
    def read(self, path: str) -> bytes: ...
    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        """Create or replace the file with `data` and fsync it (durable on return);
        `durable=False` skips the fsync, as writers that forget it do (power-loss model)."""
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

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

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

    def read(self, path: str) -> bytes:
        return self._abs(path).read_bytes()

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        # O_NOFOLLOW: a planted link at the destination is an error, never a way out.
        fd = os.open(self._entry(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
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

    def read(self, path: str) -> bytes:
        return self._after(self.inner.read(path))

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        self._after(self.inner.write(path, data, durable=durable))

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
