"""The fork server's heap on huge pages (harness/launch/pages.py): which ranges, once, and that the
kernel did it where it can."""
from __future__ import annotations

import mmap
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.launch import forkserver, launchers, pages
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.trainer.config import TrainConfig
from tests.harness.conftest import assert_no_leftover_processes

MiB = 1 << 20
MAPS = """\
55d0c0000000-55d0c0200000 r--p 00000000 08:01 1234    /usr/bin/python3.11
55d0c0200000-55d0c0400000 rw-p 00200000 08:01 1234    /usr/bin/python3.11
55d0c1100000-55d0c8100000 rw-p 00000000 00:00 0       [heap]
7f0000100000-7f0000900000 rw-p 00000000 00:00 0
7f0001000000-7f0001100000 rw-p 00000000 00:00 0
7f0002000000-7f0002600000 r--p 00000000 00:00 0
7f0003000000-7f0003400000 rw-s 00000000 00:01 99      /dev/zero (deleted)
7f0004000000-7f0004400000 rw-p 00000000 00:00 0       [anon:cpython:pymalloc]
7f0005000000-7f0005400000 rw-p 00000000 00:00 0       [vvar]
7ffd00000000-7ffd00400000 rw-p 00000000 00:00 0       [stack]
"""


def test_only_the_heap_and_private_anonymous_writable_mappings_are_made_huge_in_whole_aligned_pages() -> None:
    assert pages.collapsible(MAPS, 2 * MiB) == [
        (0x55D0C1200000, 0x55D0C8000000 - 0x55D0C1200000),  # the heap, its ends rounded inwards
        (0x7F0000200000, 6 * MiB),  # 0x...100000-0x...900000: the whole 2 MiB pages inside it
        (0x7F0004000000, 4 * MiB),  # an anonymous mapping its allocator named
    ]
    # A mapping with no whole huge page inside, a read-only or shared one, a file's, the kernel's
    # and the stack are left alone; a larger page size leaves fewer whole pages.
    assert pages.collapsible(MAPS, 64 * MiB) == [(0x55D0C4000000, 64 * MiB)]


def test_the_huge_page_size_is_the_kernels_and_two_mib_where_it_does_not_say(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    said = tmp_path / "hpage_pmd_size"
    said.write_text("536870912\n")
    monkeypatch.setattr(pages, "PMD_SIZE_FILE", str(said))
    assert pages.huge_page_size() == 512 * MiB  # arm64 with 64 KiB pages
    said.write_text("never\n")
    assert pages.huge_page_size() == 2 * MiB
    monkeypatch.setattr(pages, "PMD_SIZE_FILE", str(tmp_path / "absent"))
    assert pages.huge_page_size() == 2 * MiB


def test_collapsing_reads_past_a_mapped_files_name_that_is_not_utf8_and_does_nothing_off_linux(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    maps = tmp_path / "maps"
    maps.write_bytes(b"7f0000000000-7f0000200000 r--p 00000000 08:01 7 /data/caf\xe9.bin\n")
    monkeypatch.setattr(pages, "MAPS_FILE", str(maps))
    monkeypatch.setattr(pages.sys, "platform", "linux")
    assert pages.collapse_heap() == 0  # read, nothing anonymous to move, no UnicodeDecodeError
    monkeypatch.setattr(pages, "MAPS_FILE", str(tmp_path / "absent"))
    assert pages.collapse_heap() == 0
    monkeypatch.setattr(pages, "MAPS_FILE", str(maps))
    monkeypatch.setattr(pages.sys, "platform", "darwin")
    monkeypatch.setattr(pages, "collapsible", lambda *_: pytest.fail("read the maps off Linux"))
    assert pages.collapse_heap() == 0


class _Said:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)


def test_the_server_collapses_its_heap_once_when_it_has_forked_enough_ranks_and_none_is_alive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Not through __init__ (that installs the server's signal handlers in this process): what settle reads.
    server = object.__new__(forkserver.Server)
    server.conn, server.settled, server.children = _Said(), False, set()  # type: ignore[assignment]
    calls: list[int] = []
    monkeypatch.setattr(forkserver, "collapse_heap", lambda: calls.append(1) or 6 * MiB)
    server.forked = forkserver.COLLAPSE_AFTER_FORKS - 1
    server.settle()
    assert calls == []  # fewer forks than the collapse saves: a short run never pays for it
    server.forked, server.children = forkserver.COLLAPSE_AFTER_FORKS, {4242}
    server.settle()
    assert calls == []  # a rank still runs: its writes hold the pages
    server.children = set()
    for _ in range(3):
        server.settle()
    assert calls == [1] and server.conn.messages == [{"op": "pages", "huge_bytes": 6 * MiB}]  # type: ignore[attr-defined]


PROBE = """
import mmap, sys
m = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.write(b"x" * (8 << 20))
try:
    m.madvise(25, 0, 8 << 20)  # MADV_COLLAPSE, linux/mman.h: written here apart from pages.py
except OSError:
    sys.exit(3)
"""


def _kernel_collapses() -> bool:
    """Whether this kernel makes huge pages on request, asked in a process of its own."""
    if not hasattr(mmap.mmap, "madvise"):
        return False
    return subprocess.run([sys.executable, "-c", PROBE], timeout=60).returncode == 0


def test_a_warm_run_leaves_its_fork_server_on_huge_pages_where_the_kernel_makes_them(tmp_path: Path) -> None:
    if not _kernel_collapses():
        pytest.skip("this kernel makes no huge page on request (MADV_COLLAPSE: Linux 6.1 and later, THP not off)")
    # Enough ranks that this process's server has forked COLLAPSE_AFTER_FORKS, then one attempt more.
    for run, ranks in (("wide", forkserver.COLLAPSE_AFTER_FORKS), ("after", 1)):
        record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=1), world_sizes=(ranks,),
                                 run_dir=tmp_path / run, launcher="warm"))
        assert record.outcome == "completed", record
    server = launchers.fork_server()
    assert server.huge_bytes is not None and server.huge_bytes >= 64 * MiB, server.huge_bytes  # torch's heap
    with open(f"/proc/{server.pid}/smaps_rollup", encoding="ascii") as f:
        huge_kb = next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))
    assert huge_kb > 0, "the server said it collapsed its heap, and the kernel counts no huge page in it"
    assert_no_leftover_processes()


OPTED_OUT = """
import ctypes, sys
from trainwreck.harness.launch import pages
held = bytearray(16 << 20)  # anonymous memory to move: 16 MB, every page written
if sys.argv[1] == "off":
    assert ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) == 0  # PR_SET_THP_DISABLE
print(pages.collapse_heap())
"""


def test_a_process_that_turned_huge_pages_off_for_itself_is_left_as_it_is() -> None:
    if not _kernel_collapses():
        pytest.skip("this kernel makes no huge page on request (MADV_COLLAPSE: Linux 6.1 and later, THP not off)")
    moved = {way: int(subprocess.run([sys.executable, "-c", OPTED_OUT, way], capture_output=True, text=True,
                                     check=True, timeout=60).stdout) for way in ("on", "off")}
    assert moved["on"] >= 8 * MiB and moved["off"] == 0, moved
