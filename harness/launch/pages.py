"""Huge pages under a fork server's heap, so that each fork copies less of it.

A fork copies the parent's page tables, and a child's exit tears its copy down: for the
~220 MB a server holds after importing torch (its heap and Python's object arenas) that is
~55 000 entries each way, per rank, per attempt. Backed by 2 MiB pages, the same memory is
~110 entries. A rank that writes into a shared huge page (a reference count) gets its own
copy of that 4 KiB only: the kernel splits the huge page's entry in the writer (Linux 5.8 and
later; MADV_COLLAPSE, which this uses, exists from 6.1, so no kernel that collapses copies
2 MiB on a write).

What it saves and costs, measured: docs/GUIDE.md ("Then the page tables"). The collapse costs
~1.6 ms of CPU per MB, once (~0.3 s for torch's imports), once the server has forked 16 ranks
(forkserver.py `COLLAPSE_AFTER_FORKS`, `Server.settle`).

Best effort by design: a kernel without MADV_COLLAPSE, with transparent huge pages off, or
with no 2 MiB free, refuses, and the server forks as before, only slower.
"""
from __future__ import annotations

import ctypes
import sys

MADV_COLLAPSE = 25
"""linux/mman.h (Linux 6.1): make a range huge now, synchronously. Python's mmap module names it
only for its own mappings, and these are the interpreter's."""

MAPS_FILE = "/proc/self/maps"
PMD_SIZE_FILE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
DEFAULT_HUGE = 2 << 20
"""x86-64's and 4 KiB-page arm64's huge page; read from the kernel where it says."""


def huge_page_size() -> int:
    """The size of one transparent huge page on this machine (bytes)."""
    try:
        with open(PMD_SIZE_FILE, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return DEFAULT_HUGE


def collapsible(maps: str, huge: int) -> list[tuple[int, int]]:
    """(start, length) of every whole `huge`-aligned stretch of the private anonymous read-write
    mappings in `maps` (the text of /proc/PID/maps): the heap and the anonymous mappings Python's
    arenas and torch's buffers live in. File mappings, stacks and the kernel's own are left out."""
    ranges = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3:4] != "p":
            continue
        name = fields[5].strip() if len(fields) > 5 else ""
        if name not in ("", "[heap]") and not name.startswith("[anon:"):  # named by its allocator (Linux 5.17)
            continue
        low, _, high = fields[0].partition("-")
        start, end = -(-int(low, 16) // huge) * huge, int(high, 16) // huge * huge
        if end > start:
            ranges.append((start, end - start))
    return ranges


def collapse_heap() -> int:
    """Back this process's heap and anonymous mappings with huge pages now (MADV_COLLAPSE);
    the bytes that were, 0 where the kernel does none of it (not Linux, before 6.1, THP off).
    Never raises: the server forks as before whatever this finds."""
    if not sys.platform.startswith("linux"):
        return 0  # MADV_COLLAPSE's number means something else, or nothing, elsewhere
    try:
        # A mapped file's name may be any bytes; only the anonymous mappings are read.
        with open(MAPS_FILE, encoding="utf-8", errors="replace") as f:
            maps = f.read()
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    # Each range alone: the kernel refuses some (EINVAL: a thread's stack or malloc arena it will
    # not make huge) and takes the rest; a kernel without MADV_COLLAPSE refuses all, at once each.
    return sum(length for start, length in collapsible(maps, huge_page_size())
               if madvise(start, length, MADV_COLLAPSE) == 0)
