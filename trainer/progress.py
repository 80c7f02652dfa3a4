"""Progress board: each rank publishes (step, phase, time) for the harness watchdog.

One small file per rank per attempt, overwritten in place with ``os.pwrite``: one
syscall per phase change, no fsync (the reader is on the same machine and reads the
page cache), and it works the same under every launcher. The harness reads these
files; a rank never reads them.
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from trainwreck.rundir.layout import RunDir

# Phases in the order they happen inside one update; the watchdog ranks "furthest
# behind" by (step, phase index), so the order is part of this format.
# "checkpoint" is only the writer while it writes (it republishes after every storage
# operation); ranks gathering state for a save or waiting for it to finish are in
# "checkpoint_wait", so the watchdog's longer checkpoint budget covers slow storage,
# not a rank that hung while the others waited for the save.
BOARD_PHASES = ("start", "data", "forward", "backward", "sync", "optimizer", "checkpoint", "checkpoint_wait", "done")
PHASE_INDEX = {name: i for i, name in enumerate(BOARD_PHASES)}
TIMED_PHASES = BOARD_PHASES[BOARD_PHASES.index("data"):BOARD_PHASES.index("checkpoint") + 1]
"""The phases a `step` event times (its `phases`), in order (docs/DESIGN.md): the one list
the report and the handbook read (tests/trainer/test_vocabulary.py holds them to it)."""

_RECORD = struct.Struct("<qqdq")  # step, phase index, unix time, pid


@dataclass(frozen=True)
class BoardEntry:
    step: int
    phase: str
    t: float
    pid: int

    @property
    def position(self) -> tuple[int, int]:
        """Sort key: larger means further along."""
        return (self.step, PHASE_INDEX[self.phase])


class ProgressBoard:
    """The writer side, owned by one rank."""

    def __init__(self, run_dir: Path, attempt: int, rank: int) -> None:
        path = RunDir(run_dir).rank_progress(attempt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pid = os.getpid()

    def publish(self, step: int, phase: str) -> None:
        os.pwrite(self._fd, _RECORD.pack(step, PHASE_INDEX[phase], time.time(), self._pid), 0)

    def close(self) -> None:
        os.close(self._fd)


def read_progress(path: Path) -> BoardEntry | None:
    """The last published progress of one rank, or None if it has published nothing."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _RECORD.size:
        return None
    step, phase, t, pid = _RECORD.unpack_from(data)
    if not 0 <= phase < len(BOARD_PHASES):
        return None
    return BoardEntry(step=step, phase=BOARD_PHASES[phase], t=t, pid=pid)
