"""Disk contention: a background writer on the run directory's disk, on a period.

    {"id": "up", "kind": "disk_contention", "rank": 0, "step": 3, "every": 6, "steps": 1, "block_mb": 4}

What an upload staging its copy, a data-loading job or a log shipper does to a job's
checkpoints when they share a disk: for `steps` updates every `every` updates (faults/periodic.py)
a child process rewrites a scratch file of SCRATCH_BLOCKS blocks of `block_mb` MB under
RUN_DIR/contention/, one block after another, without pause. The writes bypass the page cache
(O_DIRECT, from a page-aligned buffer), so each one occupies the device queue for as long as the
device takes; the checkpoint's fsyncs then queue behind them. Where O_DIRECT is refused (tmpfs)
the writes are O_DSYNC instead, and the fault event says which (a tmpfs takes O_DIRECT since Linux 6.6).

Why uncached: buffered writes with an fsync now and then reach the disk in bursts of writeback,
so what a save meets depends on where in that cycle it lands. On this project's 2-core VM a
writer fsyncing every 64 MB moved one save's fsyncs from 12-15 ms to anywhere in 4-104 ms; with
one uncached 4 MB writer, the fsync of an 8 MB file went from 3.4-6.0 ms to 7.7-18 ms in 20
of 20 tries (2026-11-26), the slowest alone below the fastest under contention.

The scratch file is bounded (SCRATCH_BLOCKS x `block_mb`) and removed when the burst ends.
"""
from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path
from typing import Any

from trainwreck.faults.periodic import PeriodicChild

SCRATCH_BLOCKS = 16
"""Blocks in the scratch file, rewritten in turn: the disk holds at most 16 x `block_mb` MB of it."""
FOLDER = "contention"

_CHILD = r"""
import mmap, os, signal, sys
path, block, blocks, parent, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
done = False
def stop(*_):
    global done
    done = True
signal.signal(signal.SIGTERM, stop)
buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT asks
buf.write(os.urandom(1 << 20) * (block >> 20))  # not zeros: a device may compress or skip those
flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
fd = os.open(path, flags | (os.O_DIRECT if mode == "O_DIRECT" else os.O_DSYNC), 0o600)
try:
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    n = 0
    while not done and os.getppid() == parent:
        os.pwrite(fd, buf, (n % blocks) * block)
        n += 1
except OSError:
    pass  # a full disk ends the contention, not the rank
finally:
    os.close(fd)
    try:
        os.unlink(path)
    except OSError:
        pass
"""


def write_mode(folder: Path) -> str:
    """O_DIRECT where this folder's filesystem takes an aligned uncached write, else O_DSYNC."""
    if not hasattr(os, "O_DIRECT"):
        return "O_DSYNC"
    probe = folder / f".direct-{os.getpid()}"
    page = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
        try:
            os.pwrite(fd, page, 0)
        finally:
            os.close(fd)
            probe.unlink()
    except OSError:
        return "O_DSYNC"
    return "O_DIRECT"


class DiskContention(PeriodicChild):
    """One rank's `disk_contention` faults (a faults/inrank.py `StepInjector`)."""

    def prepare(self, fault: dict[str, Any], step: int, first: bool) -> list[str]:
        folder = self.root / FOLDER
        folder.mkdir(exist_ok=True)
        path = folder / f"{fault['id']}-r{self.rank}.bin"
        block = int(fault["block_mb"]) << 20
        mode = write_mode(folder)
        if first:
            self.record(fault, f"rank {self.rank}: a background writer rewrites {fault['block_mb']} MB blocks "
                               f"({mode}) of {path.relative_to(self.root)} for {fault['steps']} update(s) every "
                               f"{fault['every']} from update {step}", step=step, mode=mode)
        return [sys.executable, "-S", "-c", _CHILD, str(path), str(block), str(SCRATCH_BLOCKS), str(os.getpid()), mode]
