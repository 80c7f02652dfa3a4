"""The hang watchdog: reads every rank's progress board and declares a hang when
nothing has moved for the budget.

Rule: DDP ranks advance in lockstep, so one stuck rank freezes the others within one
collective. The job is hung when *no* rank's progress changed for `hang_timeout_s`
(the checkpoint budget while any rank is in the checkpoint phase). A straggler keeps
changing its own board, so a slow job is never a hung job. The suspects are the ranks
furthest behind in (step, phase index); the rest are "waiting" (usually blocked in a
collective for the suspects). A rank that has not published yet sits at (-1, -1):
it is behind everyone, and its silence counts from the attempt start.

The startup budget, not the hang timeout, holds while some rank is still setting up: it
has not published (a fresh interpreter spends seconds importing torch), or it published
only the probe's start, update 0, and has not entered its first update (joining the
process group, building the model, restoring a checkpoint; on a GPU, creating the CUDA
context, measured at up to 4.3 s from the start to the first update with many ranks
sharing one GPU). Updates count from 1, so update 0 is never training.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from trainwreck.rundir.events import EventLog
from trainwreck.trainer.progress import BoardEntry, read_progress
from trainwreck.rundir.layout import RunDir

NOT_STARTED = (-1, -1)


@dataclass(frozen=True)
class WatchdogConfig:
    hang_timeout_s: float
    """Seconds without any progress change before a hang is declared."""
    checkpoint_timeout_s: float
    """The same budget while any live rank is in the checkpoint phase (saves can be slow)."""
    startup_timeout_s: float
    """The budget while some rank is setting up (`setting_up`: interpreter start, imports, joining the
    group, building the model, restoring, a CUDA context)."""
    exit_timeout_s: float = 30.0
    """Seconds a rank may take from publishing "done" to exiting (its teardown) before it is
    called stuck: no hang (its training is over), but nothing else would ever end it."""
    stack_wait_s: float = 0.5
    """How long to wait for the SIGUSR1 stack dumps before killing the attempt."""


@dataclass(frozen=True)
class Hang:
    suspects: list[int]
    """Ranks furthest behind in (step, phase index)."""
    waiting: list[int]
    """The other live ranks."""
    last_step: int
    """The update the suspects were in (-1: they never published)."""
    detected_after_s: float
    """Seconds since the last progress change when the hang was declared."""
    detected_at: float
    """Unix time of detection."""


class Watchdog:
    """One attempt's view of the progress boards."""

    def __init__(self, config: WatchdogConfig, run_dir: Path, attempt: int, world_size: int) -> None:
        self.config = config
        self.paths = {r: RunDir(run_dir).rank_progress(attempt, r) for r in range(world_size)}
        self.board: dict[int, BoardEntry | None] = {r: None for r in self.paths}
        self.last_change = time.monotonic()  # a rank that never publishes counts from here
        self.done_since: dict[int, float] = {}  # when each rank was first seen "done"

    def observe(self) -> dict[int, BoardEntry | None]:
        """Read every board; any change restarts the hang clock."""
        for rank, path in self.paths.items():
            latest = read_progress(path)
            if latest != self.board[rank]:
                self.board[rank] = latest
                self.last_change = time.monotonic()
                if latest is not None and latest.phase == "done":
                    self.done_since.setdefault(rank, self.last_change)
                else:  # a board started again (a replica group's next incarnation writes the same file)
                    self.done_since.pop(rank, None)
        return dict(self.board)

    def done(self, rank: int) -> bool:
        """Whether `rank` has published "done": its training is over, whatever its exit is."""
        return rank in self.done_since

    def overdue(self, live: Iterable[int]) -> list[int]:
        """The live ranks that published "done" longer than the exit budget ago and are still
        running (a teardown deadlock: seen in torch's gloo destructor joining a worker thread
        that waits for the GIL the joining thread holds)."""
        return [r for r in sorted(live) if self.done_for(r) > self.config.exit_timeout_s]

    def done_for(self, rank: int) -> float:
        """Seconds since `rank` was first seen "done" (0 if it is not)."""
        return time.monotonic() - self.done_since[rank] if rank in self.done_since else 0.0

    def budget(self, live: Iterable[int]) -> float:
        if any(setting_up(self.board[r]) for r in live):
            return self.config.startup_timeout_s
        in_checkpoint = any((p := self.board[r]) is not None and p.phase == "checkpoint" for r in live)
        return self.config.checkpoint_timeout_s if in_checkpoint else self.config.hang_timeout_s

    def check(self, live: Iterable[int]) -> Hang | None:
        """A Hang if the live ranks have been silent for the budget, else None."""
        # A rank that published "done" has finished training and is only exiting; an
        # interpreter's teardown may take a while and is nobody's hang.
        live = sorted(r for r in live if (p := self.board[r]) is None or p.phase != "done")
        if not live:
            return None
        silent = time.monotonic() - self.last_change
        if silent < self.budget(live):
            return None
        position = {r: (p.position if (p := self.board[r]) is not None else NOT_STARTED) for r in live}
        behind = min(position.values())
        suspects = [r for r in live if position[r] == behind]
        return Hang(suspects=suspects, waiting=[r for r in live if r not in suspects],
                    last_step=behind[0], detected_after_s=round(silent, 3), detected_at=time.time())


def setting_up(entry: BoardEntry | None) -> bool:
    """The rank has not entered its first update: it published nothing, or only update 0, which
    the probe's start publishes before the rank joins its group, builds its model and restores."""
    return entry is None or entry.step < 1


def record_hang(events: EventLog, run_dir: Path, attempt: int, hang: Hang, pids: dict[int, int],
                stack_wait_s: float) -> None:
    """Dump every live rank's stacks, then write the `hang` event; its `t` is the
    detection time, not the time the dumps finished."""
    stacks = dump_stacks(run_dir, attempt, pids, stack_wait_s)
    events.emit("hang", t=hang.detected_at, attempt=attempt, ranks=hang.suspects, waiting=hang.waiting,
                last_step=hang.last_step, detected_after_s=hang.detected_after_s, stacks=stacks)


def record_overdue(events: EventLog, run_dir: Path, attempt: int, ranks: list[int], pids: dict[int, int],
                   after_s: float, config: WatchdogConfig) -> None:
    """Dump the stacks of ranks stuck after "done" (they show where the teardown waits), then write
    the `exit_overdue` event; the caller kills them. `after_s` is measured, the budget configured."""
    stacks = dump_stacks(run_dir, attempt, {r: pids[r] for r in ranks if r in pids}, config.stack_wait_s)
    events.emit("exit_overdue", attempt=attempt, ranks=ranks, after_s=round(after_s, 3),
                budget_s=config.exit_timeout_s, stacks=stacks)


def dump_stacks(run_dir: Path, attempt: int, pids: dict[int, int], wait_s: float) -> list[str]:
    """Dump every live rank's Python stacks without letting the attempt train on.

    The attempt is frozen first (SIGSTOP to every rank). Then one rank at a time gets
    SIGUSR1 (faulthandler dumps all threads from the signal handler) and SIGCONT, and
    is stopped again once its dump is written. Continuing all ranks at once, as a
    SIGSTOPped rank needs to run its handler, would let the whole attempt resume
    training, and even commit checkpoints, after the hang was declared; a rank running
    alone cannot complete a collective while its peers are frozen.

    Returns the stack files that hold a dump, relative to the run directory.
    """
    for pid in pids.values():
        _send(pid, signal.SIGSTOP)
    files = {r: RunDir(run_dir).rank_stacks(attempt, r, pid) for r, pid in pids.items()}
    deadline = time.monotonic() + wait_s
    for rank, pid in pids.items():
        if not _catches(pid, signal.SIGUSR1):
            continue  # no dump handler (a command that never built its probe): SIGUSR1 would kill it
        _send(pid, signal.SIGUSR1)  # pending until the rank runs again, then handled first
        _send(pid, signal.SIGCONT)
        _wait_for_dump(files[rank], deadline)
        _send(pid, signal.SIGSTOP)
    return [str(p.relative_to(run_dir)) for p in files.values() if _size(p)]


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (Linux: the SigCgt mask in /proc); True
    where that cannot be read, as before this check existed."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return True


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass  # the rank died meanwhile; its exit is reported separately


def _wait_for_dump(path: Path, deadline: float) -> None:
    """Until the file holds something and stopped growing, or the shared deadline passes."""
    size = -1
    while time.monotonic() < deadline:
        now = _size(path)
        if now and now == size:
            return
        size = now
        time.sleep(0.01)  # a poll with a deadline: a file write sends no notification


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
