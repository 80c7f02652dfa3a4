"""Why a run's ranks died when no planned fault killed them: the first crash, its last line, its log.

Modelled on torchelastic's error files: of every rank that failed, name the first
one, the last line of its exception and the file that holds the whole traceback.
It reads only the run directory (events/*.jsonl and logs/aNNN-rNNN.log, which
harness/launch/launchers.py `log_path` writes) and the standard library.

What counts as an unplanned crash: a rank whose `exit` code is not 0, that no
fault event aimed at, in an attempt where no rank-aimed fault and no hang came
before it (a peer's "connection closed" after a planned kill is that kill's
consequence, and the watchdog's kills of a hung attempt are not crashes).
Of those, a rank killed by a signal without a traceback counts only in an attempt
where no rank died on its own: the harness kills the rest of an attempt that lost a rank.
Where the harness marks each `exit` with `stopped_by_harness` (docs/DESIGN.md), it says
which: a rank it killed is never a crash, and a signal it did not send (the kernel's
out-of-memory killer, an operator) is the attempt's first death, so the peers' errors
that follow ("connection closed by peer") are its consequence, whatever their timestamps.
"""
from __future__ import annotations

import os
import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainwreck.report.rawlog import RawRun, read_raw
from trainwreck.rundir.files import open_regular
from trainwreck.rundir.layout import RunDir

TAIL_BYTES = 256 * 1024
"""How much of a log's end is read: the traceback that killed a rank is at the end; logs can be huge."""
LINE_CHARS = 300
"""A quoted exception line is cut to this: one line in a CLI, not a page of a repr."""
_LOG_NAME = re.compile(r"a(\d{3,})-r(\d{3,})\.log$")
_TRACEBACK = "Traceback (most recent call last):"
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}


@dataclass(frozen=True)
class Crash:
    """One rank's unplanned death."""

    attempt: int
    rank: int
    code: int | None
    how: str  # "exception" (traceback in its log), "signal" or "exit" (no traceback)
    line: str  # the exception's last line, or what the exit code says
    log: str | None  # relative to the run directory; None when the rank left no log
    t: float  # wall time it died (the traceback's write, else the exit event)


@dataclass(frozen=True)
class RootCause:
    first: Crash
    crashes: tuple[Crash, ...]
    before_faults: bool
    """The plan has faults and none ever fired: the run tested nothing."""
    every_rank: bool
    """Every rank that exited died of the first crash's error (not of its peer's death)."""

    def where(self) -> str:
        log = f", {self.first.log}" if self.first.log else ", no log file"
        return f"rank {self.first.rank} of attempt {self.first.attempt}{log}"

    def sentence(self) -> str:
        """The plain-words line a CLI, a report and a casebook all print."""
        more = f" ({len(self.crashes) - 1} more crash(es) after it)" if len(self.crashes) > 1 else ""
        if self.before_faults:
            who = "every rank" if self.every_rank else f"rank {self.first.rank}"
            said = (f"{who} crashed before any planned fault fired: {self.first.line} ({self.where()}); "
                    "the verdicts below judge a run that never tested anything")
        elif self.first.how == "signal":  # "killed by SIGKILL": sent from outside, or the rank's own SIGSEGV
            said = f"rank {self.first.rank} was {self.first.line}, a signal no planned fault sent ({self.where()}){more}"
        else:
            said = (f"rank {self.first.rank} crashed with an error no planned fault caused: {self.first.line} "
                    f"({self.where()}){more}")
        return said + self._sender()

    def _sender(self) -> str:
        """Who commonly sends the first crash's signal, when it is one only something outside sends."""
        if self.first.how != "signal" or self.first.code != -signal.SIGKILL:
            return ""
        return ("; an unplanned SIGKILL most often comes from the kernel's out-of-memory killer (dmesg names its "
                "victims), else from an operator or a scheduler")

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.first.rank, "attempt": self.first.attempt, "line": self.first.line,
                "log": self.first.log, "how": self.first.how, "code": self.first.code,
                "before_faults": self.before_faults, "every_rank": self.every_rank,
                "sentence": self.sentence(), "crashes": [asdict(c) for c in self.crashes]}


def root_cause(run_dir: Path, raw: RawRun | None = None) -> RootCause | None:
    """The first unplanned crash of the run in RUN_DIR, or None when every death was planned (or none)."""
    run_dir = Path(run_dir)
    raw = raw if raw is not None else read_raw(run_dir, batches=False)
    exits = [ev for ev in raw.of_kind("exit") if type(ev.get("rank")) is int and type(ev.get("attempt")) is int]
    crashes = [c for ev in exits if ev.get("code") not in (0, None)
               for c in [_crash(run_dir, raw, ev)] if c is not None]
    crashes = _drop_collateral(raw, crashes, exits)
    # An agent between the harness and the ranks (torchrun) reaps them: their exit codes and
    # errors are in its log, which the run directory holds only when such an agent ran.
    if not crashes:
        crashes = [c for c in [torchrun_crash(run_dir, raw)] if c is not None]
    if not crashes:
        return None
    crashes.sort(key=lambda c: (c.t, c.attempt, c.rank))
    planned = [f for f in raw.spec.get("faults", []) if isinstance(f, dict)]
    # Every rank died of the same error (a missing dependency), not of a peer's death: a rank
    # killed by the harness, or failing with "connection closed" after its peer, does not count.
    every = {(c.attempt, c.rank) for c in crashes if c.line == crashes[0].line} == \
        {(ev["attempt"], ev["rank"]) for ev in exits}
    if every:  # the same error everywhere: whose traceback landed first is a race; name the lowest rank
        lead = min((c for c in crashes if c.line == crashes[0].line), key=lambda c: (c.attempt, c.rank))
        crashes = [lead, *(c for c in crashes if c is not lead)]
    before = bool(planned) and not raw.of_kind("fault")
    return RootCause(crashes[0], tuple(crashes), before, every)


def _crash(run_dir: Path, raw: RawRun, ev: dict[str, Any]) -> Crash | None:
    attempt, rank, code, t = ev["attempt"], ev["rank"], ev.get("code"), float(ev["t"])
    if ev.get("stopped_by_harness") is True or _excused(raw, attempt, rank, t):
        return None
    path = RunDir(run_dir).rank_log(attempt, rank)
    rel = path.relative_to(run_dir).as_posix()
    line, written = last_exception(path)
    log = rel if path.is_file() and not path.is_symlink() else None
    if line is not None:
        return Crash(attempt, rank, code, "exception", line, log, min(t, written or t))
    if type(code) is int and code < 0:
        return Crash(attempt, rank, code, "signal", f"killed by {_SIGNALS.get(-code, f'signal {-code}')}", log, t)
    return Crash(attempt, rank, code, "exit", f"exited with code {code} and no traceback in its log", log, t)


def _excused(raw: RawRun, attempt: int, rank: int, t: float) -> bool:
    """A planned fault aimed at this rank, or a rank-aimed fault or a hang earlier in its attempt."""
    for ev in raw.events:
        if ev.get("attempt") != attempt or ev.get("kind") not in ("fault", "hang"):
            continue
        ranks = ev.get("ranks") or ([ev["rank"]] if type(ev.get("rank")) is int else [])
        if ev["kind"] == "fault" and rank in ranks:
            return True
        if ranks and ev["t"] <= t:
            return True
    return False


def _drop_collateral(raw: RawRun, crashes: list[Crash], exits: list[dict[str, Any]]) -> list[Crash]:
    """The harness kills the rest of an attempt that lost a rank. Where every exit of the
    attempt says whether the harness stopped it, those it stopped are gone already (_crash),
    and a signal death left is one nobody in the job sent: the peers' errors are its
    consequence. Elsewhere (older run directories) the exit events of one teardown share a
    poll's timestamp: a signal death without a traceback is such a kill when the attempt has a
    rank that died on its own (an exception or an exit code), else only the earliest counts."""
    marked = {ev["attempt"] for ev in exits if isinstance(ev.get("stopped_by_harness"), bool)} - \
        {ev["attempt"] for ev in exits if not isinstance(ev.get("stopped_by_harness"), bool)}
    signalled = {c.attempt for c in crashes if c.how == "signal" and c.attempt in marked}
    crashes = [c for c in crashes if c.attempt not in signalled or c.how == "signal"]
    own = {c.attempt for c in crashes if c.how != "signal" and c.attempt not in marked}
    first: dict[int, float] = {}
    for c in crashes:
        first[c.attempt] = min(first.get(c.attempt, c.t), c.t)
    return [c for c in crashes if c.how != "signal" or c.attempt in marked
            or (c.attempt not in own and c.t <= first[c.attempt])]


def last_exception(path: Path) -> tuple[str | None, float | None]:
    """(the exception line of the log's last traceback, when the log was last written).

    A torn traceback (cut off before its exception line) says so; a missing,
    unreadable, symlinked or traceback-free log gives (None, None)."""
    text, written = _tail(path)
    line = exception_in(text)
    return (line, written) if line is not None else (None, None)


def exception_in(text: str, skip: str | None = None) -> str | None:
    """The exception line of the last traceback in `text` whose line does not contain `skip`."""
    end = len(text)
    while True:
        start = text.rfind(_TRACEBACK, 0, end)
        if start < 0:
            return None
        line = _exception_line(text[start + len(_TRACEBACK):end])
        if skip is None or skip not in line:
            return line
        end = start


def _tail(path: Path) -> tuple[str, float | None]:
    try:
        if path.is_symlink():  # never follow a link out of the run directory
            return "", None
        with os.fdopen(open_regular(path), "rb") as f:  # a FIFO or device here is skipped, never waited on
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
        return data.replace(b"\x00", b"").decode("utf-8", errors="replace"), path.stat().st_mtime
    except OSError:
        return "", None


def _exception_line(block: str) -> str:
    """The first line after a traceback's header that is not an indented frame or a caret marker."""
    for line in block.splitlines():
        line = _RANK_PREFIX.sub("", line, count=1)  # torch's excepthook under a process group
        if line.strip() and not line[0].isspace() and not line.startswith(("^", "~")):
            return _short(line.strip())
    return "a traceback cut off before its exception line"


_TORCHRUN_ROOT = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
                            re.DOTALL)


def torchrun_crash(run_dir: Path, raw: RawRun) -> Crash | None:
    """Under torchrun the ranks write to logs/torchrun.log and the harness sees no exit codes: read
    the agent's own "Root Cause (first observed failure)" summary (rank, exit code) and the last
    worker traceback before it. Only when the agent gave up: its summary is printed then."""
    path = RunDir(run_dir).torchrun_log
    text, written = _tail(path)
    match = _TORCHRUN_ROOT.search(text)
    if match is None:
        return None
    rank, code = int(match.group(1)), int(match.group(2))
    attempts = [ev["attempt"] for ev in raw.events if type(ev.get("attempt")) is int] or [0]
    attempt, t = max(attempts), raw.t_end or written or 0.0
    if code == 0 or _excused(raw, attempt, rank, t):
        return None
    # torch prefixes a worker's uncaught-exception lines with [rankN]; else take the last
    # traceback that is not the agent's own ChildFailedError.
    prefix = f"[rank{rank}]: "
    mine = "\n".join(ln[len(prefix):] for ln in text.splitlines() if ln.startswith(prefix))
    line = exception_in(mine) or exception_in(text, skip="ChildFailedError")
    if line is None:
        line = f"killed by {_SIGNALS.get(-code, f'signal {-code}')}" if code < 0 else f"exited with code {code}"
    return Crash(attempt, rank, code, "exception" if code > 0 else "signal", line,
                 path.relative_to(run_dir).as_posix(), t)


def _short(line: str) -> str:
    printable = "".join(ch if ch.isprintable() else "?" for ch in line)
    return printable if len(printable) <= LINE_CHARS else printable[:LINE_CHARS - 3] + "..."
