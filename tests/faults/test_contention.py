"""The disk_contention injector on its own: the child writes while a burst lasts and leaves nothing."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from trainwreck.faults.contention import FOLDER, SCRATCH_BLOCKS, DiskContention, write_mode

FAULT = {"id": "up", "kind": "disk_contention", "rank": 0, "step": 3, "every": 4, "steps": 2, "block_mb": 1}


def _grown(path: Path, size: int, timeout_s: float = 30.0) -> int:
    """The scratch file's size once it holds `size` bytes (the child has written); 0 on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size >= size:
            return path.stat().st_size
        time.sleep(0.01)  # polling a file the child writes: the condition is checked, not slept on
    return 0


def test_the_writer_runs_only_inside_its_bursts_by_its_own_pid_and_removes_its_scratch_file(tmp_path: Path) -> None:
    recorded: list[tuple[dict[str, Any], str, dict[str, Any]]] = []
    injector = DiskContention([FAULT], lambda f, detail, **kw: recorded.append((f, detail, kw)), 0, tmp_path)
    scratch = tmp_path / FOLDER / "up-r0.bin"
    try:
        injector.at_step(2)
        assert injector.child is None and not recorded
        injector.at_step(3)
        child = injector.child
        assert child is not None and _grown(scratch, 2 << 20) >= 2 << 20, "the child writes block after block"
        assert scratch.stat().st_size <= SCRATCH_BLOCKS << 20, "the scratch file stays bounded"
        injector.at_step(4)  # the same burst: the same child
        assert injector.child is child
        injector.at_step(5)  # outside: ended by its pid, the file gone
        assert injector.child is None and child.returncode is not None and not scratch.exists()
        injector.at_step(7)  # the next burst: a new child, and no second fault event
        assert injector.child is not None and injector.child.pid != child.pid
    finally:
        injector.end()
    [(fault, detail, extra)] = recorded
    assert fault["id"] == "up" and extra == {"step": 3, "mode": write_mode(tmp_path / FOLDER)}
    assert f"rewrites 1 MB blocks ({extra['mode']}) of contention/up-r0.bin for 2 update(s) every 4" in detail
    assert not os.listdir(tmp_path / FOLDER)
