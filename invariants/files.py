"""Opening a run directory's files without trusting them.

`trainwreck check` is pointed at directories other programs wrote, some of them
hostile or broken: a FIFO blocks `open()` and `read()` forever, `/dev/zero`
never ends, a symlink can lead anywhere on the machine. The trainer and the
harness have their own file-access layer; `invariants/` stays standard-library
only and imports nothing of ours, so it keeps this small one, which refuses the
same things:

- anything that is not a regular file (FIFO, device, socket, directory), found
  without blocking (`O_NONBLOCK` on open, then `fstat`);
- a path whose real location leaves the run directory (a symlink out of it);
- more bytes than a stated bound: `read_bounded` stops at its limit, and the
  events reader (loader.py) streams in blocks, bounding one line.

Every refusal is an `InputError` naming the file and the fix (exit 2 for `check`).
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from trainwreck.invariants.history import InputError

_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_TYPES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def inside(root: str, path: str) -> str:
    """The real path of `path`; an InputError when it lies outside the real `root`."""
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        rel = os.path.relpath(path, root)
        raise InputError(f"{rel}: a symlink leading out of the run directory (to {real}); "
                         "copy the file into the run directory instead")
    return real


def open_regular(root: str, path: str) -> BinaryIO:
    """Open `path` (inside `root`) for reading; refuse what is not a regular file
    before reading a byte. FileNotFoundError passes through for the caller to word."""
    real = inside(root, path)
    rel = os.path.relpath(path, root)
    try:
        fd = os.open(real, _FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ENXIO for a socket, ELOOP, EACCES...
        raise InputError(f"{rel}: cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = next((name for test, name in _TYPES if test(mode)), "not a plain file")
            raise InputError(f"{rel}: not a regular file ({what}); a run directory holds plain files only")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(root: str, path: str, limit: int, what: str) -> bytes:
    """The whole of a regular file of at most `limit` bytes; an InputError beyond it."""
    with open_regular(root, path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{os.path.relpath(path, root)}: larger than {limit} bytes; {what}")
    return data
