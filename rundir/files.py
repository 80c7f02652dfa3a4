"""The one way trainwreck touches a file of a run directory, a checkpoint store or the golden cache.

Every such file may have been planted by someone else, or broken by the machine: a FIFO
where a file should be blocks `open()` forever, `/dev/zero` never ends, a symlink leads
out of the directory, a sparse file claims 2 GiB, a planted `x.tmp` link turns a write
into an overwrite of something outside. So reads and writes here:

- open with O_NOFOLLOW | O_NONBLOCK and check `fstat` before reading: anything that is
  not a regular file (FIFO, device, socket, directory) is `NotRegularFile`, raised at
  once, never waited on;
- read at most a bound (the manifest's size, or one of the documented limits below) and
  refuse a larger file by its size before reading it (`TooLarge`);
- resolve a path and refuse one that leaves its root (`OutsideRoot`);
- write by creating a fresh temporary with O_EXCL in the target's own folder, then
  renaming it over the target (a link at the target is replaced, never followed); on
  failure only that temporary is removed.

All three errors are OSErrors, so every caller that already treats an unreadable file as
damage (a rejected checkpoint, a skipped events file, a rebuilt golden entry) treats these
the same way. Standard library only: the checkers' side and the harness import it too.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

SMALL_LIMIT = 16 << 20
"""Bytes: run.json, verdicts.json, golden.json, a plan file, a checkpoint manifest or `latest`."""
EVENTS_LIMIT = 1 << 30
"""Bytes: one events file (a 100k-step run with batch events writes tens of MB)."""
STACK_LIMIT = 1 << 20
"""Bytes: one stack dump in stacks/ (a report reads only its first thread)."""

ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                                errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.ENOTDIR, errno.EEXIST,
                                errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EMFILE, errno.ENFILE})
"""OSErrors that describe the machine (a full disk, a read-only folder, a taken port), not a bug."""


class HostileFile(OSError):
    """A file that must not be read or written as it stands; the message says which and why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)

    def __str__(self) -> str:
        return str(self.strerror)


class NotRegularFile(HostileFile):
    """A FIFO, device, socket or directory where a regular file was expected."""


class TooLarge(HostileFile):
    """A file larger than the bound its reader allows."""


class OutsideRoot(HostileFile):
    """A path that resolves outside the directory it must stay in (a symlink out, '..')."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return word
    return "not a regular file"


def inside(root: Path | str, path: Path | str) -> Path:
    """`path` with every symlink resolved, refused when that leaves `root` (also resolved)."""
    base = os.path.realpath(root)
    full = os.path.realpath(path)
    if full != base and not full.startswith(base.rstrip(os.sep) + os.sep):
        raise OutsideRoot(errno.EXDEV, f"{path} leads outside {root} (a symlink?); it is never followed")
    return Path(full)


def open_regular(path: Path | str, root: Path | str | None = None, label: str | None = None) -> int:
    """A read-only descriptor of the regular file `path`, never blocking: the open is
    non-blocking (a FIFO opens at once) and the file type is checked before any read.
    The final component is never a followed link; with `root`, the folders must stay inside it.
    Messages name the file as `label` (default: `path`)."""
    target = inside(root, path) if root is not None else Path(path)
    path = label or path
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutsideRoot(errno.ELOOP, f"{path} is a symlink; it is never followed") from None
        if exc.errno == errno.ENXIO:  # a socket
            raise NotRegularFile(errno.ENXIO, f"{path} is not a regular file (a socket)") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
                             f"{path} is not a regular file ({kind_of(mode)})")
    return fd


def check_size(path: Path | str, size: int, limit: int) -> None:
    if size > limit:
        raise TooLarge(errno.EFBIG, f"{path} has {size} bytes, more than the {limit} allowed")


def read_bytes(path: Path | str, limit: int, root: Path | str | None = None) -> bytes:
    """The content of the regular file `path`, refused by its size before it is read when
    it exceeds `limit` (and again if it grew while being read)."""
    fd = open_regular(path, root)
    try:
        check_size(path, os.fstat(fd).st_size, limit)
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(limit + 1)
        check_size(path, len(data), limit)
        return data
    finally:
        os.close(fd)


def read_text(path: Path | str, limit: int, root: Path | str | None = None) -> str:
    """`read_bytes` decoded as UTF-8; undecodable bytes become U+FFFD (a reader counts damage, never raises)."""
    return read_bytes(path, limit, root).decode("utf-8", errors="replace")


def read_json(path: Path | str, limit: int = SMALL_LIMIT, root: Path | str | None = None) -> Any:
    """JSON from a bounded read; ValueError/RecursionError for bad JSON, OSError for a bad file."""
    return json.loads(read_bytes(path, limit, root))


def is_regular(path: Path | str) -> bool:
    """Whether `path` itself (not what a link names) is a regular file; never opens it."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def write_atomic(path: Path | str, data: bytes | str | Iterable[str], root: Path | str | None = None,
                 durable: bool = False) -> None:
    """Replace `path` with `data`: a fresh temporary (O_EXCL, in `path`'s own folder) is
    written and renamed over it, so a reader never sees half a file and a link planted at
    `path` or at any guessable temporary name is replaced, never written through. With
    `root`, the folder must resolve inside it. Only the temporary created here is ever removed.
    `data` may be pieces of text, written as they come: a big document (a 16 M-event run's
    report.json) is then never held whole, nor as the list of its pieces."""
    path = Path(path)
    folder = inside(root, path.parent) if root is not None else path.parent
    batches = [data] if isinstance(data, bytes) else [_utf8(data)] if isinstance(data, str) else _batched(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)  # O_EXCL | O_NOFOLLOW
    try:
        with os.fdopen(fd, "wb") as file:
            for batch in batches:
                file.write(batch)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(tmp, folder / path.name)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _utf8(text: str) -> bytes:
    # A run directory's name may not be UTF-8 (a report quotes it): such bytes are written as \x escapes.
    return text.encode("utf-8", errors="backslashreplace")


def _batched(pieces: Iterable[str], size: int = 1 << 16) -> Iterator[bytes]:
    """Pieces of text as bytes, joined about `size` characters at a time (a JSON encoder's pieces are
    a few characters each)."""
    held: list[str] = []
    length = 0
    for piece in pieces:
        held.append(piece)
        length += len(piece)
        if length >= size:
            yield _utf8("".join(held))
            held, length = [], 0
    if held:
        yield _utf8("".join(held))


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def is_environment_failure(exc: BaseException) -> bool:
    """An OSError that is the machine's state (disk full, no permission, a taken port), which a
    command reports in one line with exit 2, rather than a bug that deserves a traceback."""
    return isinstance(exc, HostileFile) or (isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS)


FIXES = {
    errno.ENOSPC: "free space on that disk, or write to another one",
    errno.EDQUOT: "free space within your quota, or write to another disk",
    errno.EROFS: "it is on a read-only file system: use a writable folder",
    errno.EACCES: "give this user access to it (chmod/chown), or use a folder of your own",
    errno.EPERM: "give this user access to it (chmod/chown; lsattr shows an immutable flag), or use a folder of your own",
    errno.EADDRINUSE: "stop what holds that port, or pick another MASTER_PORT",
    errno.EMFILE: "raise the open-file limit (ulimit -n)",
    errno.ENFILE: "raise the system's open-file limit",
}
"""The fix an environment failure's one line names, by errno."""


FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errnos of a full disk: their line names the disk (its mount point and free space)."""


def describe(exc: OSError, near: str | os.PathLike[str] | None = None) -> str:
    """An OSError in one line: what failed, on which file, why, and what to do about it. A full
    disk is named by the failed file's mount point, or `near`'s when the error names no file
    (a write to an open descriptor), so "free space on that disk" says which disk."""
    if isinstance(exc, HostileFile):
        return str(exc)
    where = f" ({exc.filename}, {disk_of(exc.filename)})" if exc.filename and exc.errno in FULL else \
        f" ({exc.filename})" if exc.filename else ""
    if exc.errno in FULL and not exc.filename and near is not None:
        where = f" (it names no file; {near} is {disk_of(near)})"
    fix = FIXES.get(exc.errno or 0)
    return f"{exc.strerror or type(exc).__name__}{where}" + (f": {fix}" if fix else "")


def disk_of(path: str | os.PathLike[str]) -> str:
    """'on the disk mounted at M (F free of T)' for the file system that holds `path` (or would:
    its nearest existing folder)."""
    place = Path(os.path.abspath(os.fspath(path)))
    while not place.exists() and place != place.parent:
        place = place.parent
    mount = place
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        usage = shutil.disk_usage(place)
    except OSError:
        return f"on the disk mounted at {mount}"
    return f"on the disk mounted at {mount} ({_size(usage.free)} free of {_size(usage.total)})"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"
