"""Reading a rank's faulthandler dump: which of its thread blocks is the thread that trains.

Every rank arms `faulthandler.register(SIGUSR1, all_threads=True)` and the watchdog signals it on
a hang. faulthandler writes one block per Python thread, the newest thread first, and heads the
block of the thread that ran the handler "Current thread". Neither is the training thread: the
kernel hands a process-directed signal to any thread that does not block it (an async
checkpoint's worker, or a gloo thread with no Python state, and then no block is "Current"), and
the main thread, the oldest, comes last. The main thread is the one block whose outermost frame is
not threading's `_bootstrap`, where every thread `threading` starts begins.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

_HEADER = re.compile(r"^(?:(Current thread|Thread) (0x[0-9a-fA-F]+)|Stack) \(most recent call first\):$",
                     re.MULTILINE)
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


@dataclass(frozen=True)
class ThreadStack:
    """One thread block of a dump, its frames innermost first."""

    ident: str | None
    current: bool
    frames: tuple[dict[str, str], ...]

    @property
    def started_by_threading(self) -> bool:
        outermost = self.frames[-1] if self.frames else None
        return outermost is not None and outermost["func"] == "_bootstrap" \
            and PurePath(outermost["path"]).name == "threading.py"


def thread_stacks(text: str) -> list[ThreadStack]:
    """Every thread block in the order the dump lists them; text without a faulthandler header is one block."""
    heads = list(_HEADER.finditer(text))
    if not heads:
        return [ThreadStack(None, False, _frames(text))] if text.strip() else []
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return [ThreadStack(h.group(2), h.group(1) == "Current thread", _frames(text[h.end():end]))
            for h, end in zip(heads, ends)]


def by_faulthandler(text: str) -> bool:
    """Whether the dump has faulthandler's headers: written by its C signal handler, which runs with
    no GIL, so even a rank whose Python threads are all blocked (one holds the GIL in C) leaves one."""
    return _HEADER.search(text) is not None


def training_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The main thread's block (the last with frames that threading did not start); else the first
    block with frames, as a trainer that trains on a thread of its own leaves no other clue."""
    main = [t for t in threads if t.frames and not t.started_by_threading]
    if main:
        return main[-1]
    return next((t for t in threads if t.frames), threads[0] if threads else None)


def _frames(block: str) -> tuple[dict[str, str], ...]:
    return tuple(m.groupdict() for m in _FRAME.finditer(block))
