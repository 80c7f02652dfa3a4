"""The run directory (format `trainwreck-run/1`): every path in it, run.json, and the one
forgiving reader of its event logs. Everything else (harness, faults, reports) asks here;
only `invariants/` keeps its own loader, to stay standard-library-only and separate.

Its other kind, the measurement directory (format `trainwreck-measurement/1`): a benchmark
job's figures in one measurement.json and no events, which the handbook quotes beside judged
runs. It is written and read here too, through the same bounded file layer, so a command
handed one can say what it is instead of "no run.json".

Standard library only, and nothing of ours but rundir/: every layer may import it.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import stat
from itertools import compress, repeat
from operator import not_
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from trainwreck.rundir import files
from trainwreck.rundir.errors import InputError
from trainwreck.rundir.events import FORMAT


class RunDirError(InputError):
    """The run directory cannot be used; the message says why and what to do."""


SAMPLINGS = ("without_replacement", "with_replacement")
"""run.json's optional `sampling` (the first when absent), as invariants/history.py reads it: ids
drawn once per epoch (a permutation), or independently at each draw (random windows)."""

MEASUREMENT_FORMAT = "trainwreck-measurement/1"
"""measurement.json's `format`: a benchmark job's figures (docs/DESIGN.md, "Measurement directories")."""
MEASUREMENT_FIELDS = ("command", "measure")
"""Strings every measurement.json carries: the command that measured (its reproduce line), and its name."""


@dataclass(frozen=True)
class RunDir:
    """Every path of one run directory, spelled once."""

    root: Path

    SUBDIRS = ("events", "checkpoints", "stacks", "progress", "logs")

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def events(self) -> Path:
        return self.root / "events"

    @property
    def harness_events(self) -> Path:
        return self.events / "harness.jsonl"

    def rank_events(self, attempt: int, rank: int, pid: int) -> Path:
        return self.events / f"a{attempt:03d}-r{rank:03d}-p{pid}.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    def rank_stacks(self, attempt: int, rank: int, pid: int) -> Path:
        return self.stacks / f"a{attempt:03d}-r{rank:03d}-p{pid}.txt"

    def attempt_stacks(self, attempt: int) -> list[Path]:
        return sorted(self.stacks.glob(f"a{attempt:03d}-*.txt"))

    @property
    def progress(self) -> Path:
        return self.root / "progress"

    def rank_progress(self, attempt: int, rank: int) -> Path:
        return self.progress / f"a{attempt:03d}-r{rank:03d}.bin"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def rank_log(self, attempt: int, rank: int) -> Path:
        return self.logs / f"a{attempt:03d}-r{rank:03d}.log"

    @property
    def torchrun_log(self) -> Path:
        return self.logs / "torchrun.log"

    @property
    def measurement_json(self) -> Path:
        """A measurement directory's one file (it has no run.json and no events)."""
        return self.root / "measurement.json"

    @property
    def verdicts(self) -> Path:
        return self.root / "verdicts.json"

    @property
    def report(self) -> Path:
        return self.root / "report"

    def report_file(self, name: str) -> Path:
        return self.report / name

    @classmethod
    def of_events_file(cls, path: Path) -> RunDir:
        """The run directory an events file (events/*.jsonl) belongs to."""
        return cls(Path(path).parent.parent)

    @property
    def plan_json(self) -> Path:
        return self.root / "plan.json"

    @property
    def attempts_record(self) -> Path:
        """Standalone runs: invocation -> its first attempt number (see standalone_attempt)."""
        return self.root / ".attempts.json"

    @property
    def attempts_lock(self) -> Path:
        return self.root / ".attempts.lock"


_RANK_EVENTS = re.compile(r"^a(\d{3})-r\d{3}-p\d+\.jsonl$")


def events_file_attempt(name: str) -> int | None:
    """The attempt a rank's events file belongs to, from its name; None for other files."""
    match = _RANK_EVENTS.match(name)
    return int(match.group(1)) if match else None


def read_run_json(run_dir: Path, check_format: bool = True) -> dict[str, Any]:
    """run.json of a run directory; RunDirError (saying what to do) when it is missing or
    unreadable. check_format=False takes any JSON object (a report still draws a run whose
    format it does not know, and says so)."""
    path = RunDir(run_dir).run_json
    try:
        data = files.read_json(path, files.SMALL_LIMIT, root=run_dir)
    except FileNotFoundError:
        if files.is_regular(RunDir(run_dir).measurement_json):
            raise RunDirError(f"{run_dir} is a measurement directory ({MEASUREMENT_FORMAT}): it holds a benchmark's "
                              "figures in measurement.json, not a run to judge or report") from None
        raise RunDirError(f"{run_dir} has no run.json: is it a trainwreck run directory?") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise RunDirError(f"{path} is unreadable ({type(exc).__name__}: {exc}); use a new run directory") from None
    if not isinstance(data, dict) or (check_format and data.get("format") != FORMAT):
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise RunDirError(f"{path}: format {found!r} is not {FORMAT!r}")
    return data


def write_measurement(run_dir: Path, measured: dict[str, Any]) -> None:
    """Make `run_dir` a measurement directory holding `measured` (stamped with MEASUREMENT_FORMAT)."""
    data = {"format": MEASUREMENT_FORMAT, **measured}
    _check_measurement(RunDir(run_dir).measurement_json, data)
    ensure_writable(run_dir)
    files.write_atomic(RunDir(run_dir).measurement_json, json.dumps(data, indent=1) + "\n", root=run_dir)


def read_measurement(run_dir: Path) -> dict[str, Any]:
    """measurement.json of a measurement directory, bounded and checked; RunDirError saying why otherwise."""
    path = RunDir(run_dir).measurement_json
    try:
        data = files.read_json(path, files.SMALL_LIMIT, root=run_dir)
    except FileNotFoundError:
        raise RunDirError(f"{run_dir} has no measurement.json: is it a measurement directory?") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise RunDirError(f"{path} is unreadable ({type(exc).__name__}: {exc}); measure again") from None
    _check_measurement(path, data)
    return data  # type: ignore[no-any-return] - _check_measurement made sure it is an object


def _check_measurement(path: Path, data: Any) -> None:
    if not isinstance(data, dict) or data.get("format") != MEASUREMENT_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise RunDirError(f"{path}: format {found!r} is not {MEASUREMENT_FORMAT!r}")
    missing = [f for f in MEASUREMENT_FIELDS if not isinstance(data.get(f), str)]
    if missing:
        raise RunDirError(f"{path} lacks {', '.join(missing)} (a string each); measure again")


# A line that is certainly a batch (or step) event: every writer puts `kind` first. Lines that
# are such events written otherwise are simply parsed.
_BATCH_LINE = re.compile(r'\{\s*"kind"\s*:\s*"batch"')
_STEP_LINE = re.compile(r'\{\s*"kind"\s*:\s*"step"')


@dataclass
class EventsFile:
    """The events of one file of events/, and what could not be read of it."""

    name: str
    events: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    """Lines that were not events (a torn last line is normal after a kill)."""
    error: str | None = None
    """Why the file could not be read at all."""


def read_events(run_dir: Path, batches: bool = True, steps: bool = True) -> list[EventsFile]:
    """Every events file of the run, forgivingly: unreadable lines are counted, never raised.
    batches=False skips `batch` lines unparsed (most of the bytes) for readers that do not
    need the sample ids; steps=False (with batches=False) skips `step` lines too, for a reader
    that has them already (the report, from the checker's columns). A file's last line is
    always parsed, so a torn one is still counted in `skipped`; a step event among the parsed
    lines is still returned, the caller drops it."""
    directory = RunDir(run_dir).events
    try:
        names = sorted(os.listdir(files.inside(run_dir, directory)))
    except OSError:  # missing, not a folder, unreadable, or linked out of the run directory
        names = []
    return [_read_events_file(directory / name, batches, steps) for name in names if name.endswith(".jsonl")]


def iter_events(run_dir: Path, batches: bool = True) -> Iterator[dict[str, Any]]:
    """Every event of the run, file by file; lines that are not events are skipped."""
    for events_file in read_events(run_dir, batches):
        yield from events_file.events


def _read_events_file(path: Path, batches: bool, steps: bool = True) -> EventsFile:
    try:  # a regular file inside events/, bounded: a FIFO or /dev/zero here is damage, not a wait
        text = files.read_text(path, files.EVENTS_LIMIT, root=path.parent)
    except OSError as exc:
        return EventsFile(path.name, error=f"cannot read ({exc.strerror or exc})")
    return events_of_text(path.name, text, batches, steps)


def events_of_text(name: str, text: str, batches: bool = True, steps: bool = True) -> EventsFile:
    """The events of one file's text (or of the lines of it that a caller kept), as read_events
    reads them."""
    result = EventsFile(name)
    lines = list(filter(str.strip, text.splitlines()))
    if not batches:
        lines = _drop(lines, ('{"kind":"batch"', '{"kind": "batch"'), _BATCH_LINE)
    if not steps:
        lines = _drop(lines[:-1], ('{"kind":"step"', '{"kind": "step"'), _STEP_LINE) + lines[-1:]
    parsed, result.skipped = _parse_lines(lines)
    for event in parsed:
        if isinstance(event, dict) and isinstance(event.get("t"), (int, float)) and isinstance(event.get("kind"), str):
            result.events.append(event)
        else:
            result.skipped += 1
    return result


def _drop(lines: list[str], prefix: tuple[str, ...], pattern: re.Pattern[str]) -> list[str]:
    """`lines` without those `pattern` matches; C-level passes, since a big run has millions: the
    lines that start with a `prefix` (what the writers write: rundir/events.py, compact) go first, the pattern looks at the rest."""
    rest = list(compress(lines, map(not_, map(str.startswith, lines, repeat(prefix)))))
    return list(compress(rest, map(not_, map(pattern.match, rest))))


def _parse_lines(lines: list[str]) -> tuple[list[Any], int]:
    """All lines in one C-level parse when they are all JSON (the normal case); else line by line."""
    try:
        return json.loads("[" + ",".join(lines) + "]"), 0
    except (ValueError, RecursionError):
        pass
    parsed, skipped = [], 0
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except (ValueError, RecursionError):
            skipped += 1
    return parsed, skipped


def ensure_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create run directory {run_dir}: {exc.strerror}; choose another --run-dir") from None
    # A real write, not os.access: root passes every permission check, read-only mounts do not.
    probe = run_dir / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise RunDirError(
            f"run directory {run_dir} is not writable ({exc.strerror}); fix its permissions or choose another --run-dir"
        ) from None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    files.write_atomic(path, json.dumps(data, indent=1) + "\n")


def foreign_leftovers(run_dir: Path) -> list[str]:
    """What makes a directory somebody else's run: checkpoints/ or events/ holding anything
    (or not being a plain directory) while there is no run.json. Resuming such a directory
    would mix its events into ours and load its checkpoints."""
    paths = RunDir(run_dir)
    if paths.run_json.exists():
        return []
    return [p.name for p in (paths.checkpoints, paths.events) if os.path.lexists(p)
            and (p.is_symlink() or not p.is_dir() or any(p.iterdir()))]


def make_subdirs(run_dir: Path) -> None:
    """Create the run directory's folders (RunDir.SUBDIRS), refusing one that is a symlink or
    not a directory: a resumed run writes its events, checkpoints and logs into them, and a
    planted `events -> /elsewhere` would carry those writes out of the run directory."""
    for name in RunDir.SUBDIRS:
        path = Path(run_dir) / name
        if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
            mode = path.lstat().st_mode
            what = "a symlink" if path.is_symlink() else "a file" if stat.S_ISREG(mode) else files.kind_of(mode)
            raise RunDirError(f"{path} is {what}, not a folder; a run directory's {name}/ must be a plain "
                              "folder inside it: remove it or pick another --out")
        path.mkdir(exist_ok=True)


def refuse_foreign(run_dir: Path) -> None:
    """The trainer's --run-dir must not be somebody else's run (see foreign_leftovers)."""
    found = foreign_leftovers(run_dir)
    if found:
        raise RunDirError(
            f"--run-dir {run_dir} holds {' and '.join(found)}/ but no run.json, so it is not a "
            "trainwreck run directory; choose an empty or new --run-dir")



def next_attempt(run_dir: Path) -> int:
    """One past the highest attempt the run directory records; 0 for a new one.

    An attempt is recorded by a rank's events file (a standalone or torchrun rank writes
    no harness log) or by the harness's `attempt` event (written before any rank starts, so
    an attempt whose ranks all died before opening their files still counts). The harness's
    attempt loop and a standalone rank both ask here, so neither reuses a number."""
    run = RunDir(run_dir)
    used = [a for name in _listdir(run.events) if (a := events_file_attempt(name)) is not None]
    if run.harness_events.is_file():
        used += [e["attempt"] for e in _read_events_file(run.harness_events, batches=False).events
                 if e["kind"] == "attempt" and "rank" not in e and isinstance(e.get("attempt"), int)]
    return max(used) + 1 if used else 0


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def standalone_attempt(run_dir: Path, restart_count: int, invocation: str | None) -> int:
    """The attempt number of a standalone rank: each new invocation in the same run
    directory continues after the attempts already logged, and torchrun restarts count
    up from there.

    `invocation` names one launcher process (None for a lone `python -m trainer`). Its
    ranks start at different times, and one may already have written attempt N's event
    file when another looks; so the first rank of an invocation records its base under
    a lock, and the others (and later restarts) read it back."""
    if invocation is None:
        return next_attempt(run_dir) + restart_count
    ensure_writable(run_dir)
    with open(RunDir(run_dir).attempts_lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        path = RunDir(run_dir).attempts_record
        try:
            bases = json.loads(path.read_text())
        except (OSError, ValueError):
            bases = {}
        if not isinstance(bases, dict) or not isinstance(bases.get(invocation), int):
            bases = bases if isinstance(bases, dict) else {}
            bases[invocation] = max(0, next_attempt(run_dir) - restart_count)
            write_json_atomic(path, bases)
        return bases[invocation] + restart_count


def launcher_identity() -> str:
    """The parent process (torchrun's agent, shared by its workers and all their restarts)
    by pid and start time, so a reused pid is a different invocation."""
    ppid = os.getppid()
    try:
        start = open(f"/proc/{ppid}/stat").read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{ppid}@{start}"
