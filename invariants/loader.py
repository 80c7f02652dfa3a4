"""Reading a run directory (format `trainwreck-run/1`) into a History.

Tolerant where a crash can legitimately leave marks (a torn last line, event
kinds from a newer writer: skipped with a note), strict where the input cannot
be trusted (a bad line in the middle of a file, a missing or mistyped field:
InputError naming file, line and field). A checker that guessed over broken
input would pass runs it never saw.

Speed and memory: each file is streamed in blocks of whole lines (files.py
opens it without trusting it). A block of one process's events (one attempt,
one rank: the normal case) is decoded by msgspec into typed structs when it is
installed (`_ingest_typed`), else parsed by orjson (several times faster than
the stdlib on these small objects, `_ingest_columns`), and split into compact
columns with C-level map/compress passes. A block that does not fit - a torn or
bad line, a mixed file, a field of the wrong type - goes to the next path and at
last is parsed again by the stdlib through the per-event path, which is the
reference: every message about bad input comes from it, so all parsers judge
the same input the same way. A big run's files are parsed by forked workers
(`_load_parallel`); the rank logs of one attempt share their equal columns
(`_share_columns`).
"""

from __future__ import annotations

import functools
import gc
import json
import json.scanner
import multiprocessing
import os
import re
import signal
import threading
from array import array
from bisect import bisect_left
from collections import deque
from itertools import accumulate, chain, compress, islice, repeat
from operator import attrgetter, is_, itemgetter, not_
from typing import Annotated, Any, BinaryIO, Iterable, Iterator, Literal, Sequence, Union

import orjson

try:  # optional (extra `fast`): typed decoding of the bulk kinds, no dict per event
    import msgspec
except ImportError:  # pragma: no cover - the orjson path reads everything alone
    msgspec = None

from trainwreck.invariants.files import open_regular, read_bounded
from trainwreck.invariants import spill
from trainwreck.invariants.history import (FORMAT, SAMPLINGS, History, InputError, RankLog, extend_digests,
                                               extend_ints, extend_losses)

_INT = "a non-negative integer"
# Reading bounds (files.py refuses what is not a regular file). run.json is a small spec;
# an events file is streamed in blocks of BLOCK bytes, so memory is bounded by a block
# and the columns, never by the file; one event line is bounded by MAX_LINE.
MAX_SPEC_BYTES = 16 << 20
MAX_LINE = 64 << 20
BLOCK = 1 << 20
# Bounds no real run comes near. A number past them (a flipped or forged field) would make
# a checker allocate a range that size; it is refused as input instead.
MAX_COUNT = 2**40
MAX_STEPS = 10**9
MAX_RANKS = 2**20
_STR = "a string"
_INTS = "a list of integers"
_ANY = "present"

# Fields the checkers read, per kind: (field, expected type). `kind` and `t`
# are required on every event. Other fields are optional; extra fields are fine.
REQUIRED: dict[str, tuple[tuple[str, str], ...]] = {
    "start": (("attempt", _INT), ("rank", _INT)),
    "restore": (("attempt", _INT), ("rank", _INT), ("step", _INT), ("checkpoint", _STR)),
    "reject": (("attempt", _INT), ("checkpoint", _STR)),
    "batch": (("attempt", _INT), ("rank", _INT), ("world_size", _INT), ("step", _INT), ("epoch", _INT), ("samples", _INTS)),
    "step": (("attempt", _INT), ("rank", _INT), ("world_size", _INT), ("step", _INT)),
    "save": (("attempt", _INT), ("step", _INT), ("checkpoint", _STR)),
    # run.json's fault ids are strings, so an event naming one is too; a list
    # or object here could not be matched to a planned fault (or hashed).
    "fault": (("fault_id", _STR),),
    "prune": (("attempt", _INT), ("checkpoint", _STR)),
    "hang": (("ranks", _INTS),),
    "exit": (),
    "end": (("status", _STR), ("final_step", _INT)),
    # Informational kinds no checker reads (docs/DESIGN.md, "extension kinds").
    "attempt": (),
    "save_ops": (),
    "seed": (),  # the probe's one-call seeding (trainer/probe.py Probe.seed): which seed a rank used
    "leftover": (),  # a process that outlived its attempt and was ended by the harness (harness/supervise/supervisor.py)
    "exit_overdue": (),  # ranks that said "done" but did not exit in time, killed by the harness (watchdog.py)
    "fault_skip": (("fault_id", _STR),),  # a planned fault that could not act, and `reason` why (faults/corrupt.py)
}
_DENSE = frozenset(["step", "batch"])
# A line that is certainly a batch or step event (every writer puts `kind` first): the report's
# reader skips them (rundir/layout.py), so History.lines need not keep them.
_DENSE_LINE = re.compile(rb'\{\s*"kind"\s*:\s*"(?:batch|step)"')
# Harness events: DESIGN.md asks no `attempt` of them; one without it is
# placed by its time `t` (see _place_by_time).
_HARNESS = frozenset(["fault", "hang", "exit", "end"])

def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON does not, and a non-finite
    # time or step would compare false with everything and judge silently.
    raise ValueError(f"{name} is not a JSON number; write a finite number")


# Called only for the literals NaN/Infinity/-Infinity, so the fast path keeps its speed.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
# A time beyond this is no clock reading; it also keeps float(t) from overflowing.
_T_LIMIT = 1e300
_SCAN = json.scanner.make_scanner(_DECODER)  # type: ignore[attr-defined]
_TIME_TYPES = frozenset([int, float])
_INT_TYPE = frozenset([int])
_LIST_TYPE = frozenset([list])


def load_history(run_dir: str | os.PathLike[str], report: bool = False) -> History:
    """Read RUN_DIR/run.json and every RUN_DIR/events/*.jsonl into a History.
    report=True also keeps what the report reads and the checkers do not: each `step`
    event's `phases` (RankLog.phases) and the text of the other lines (History.lines).

    Raises InputError when the directory cannot be judged."""
    run_dir = os.fspath(run_dir)
    history = History(run_dir=run_dir, spec=load_spec(run_dir))
    if report:
        history.__dict__["_keep_phases"] = True
        history.lines = {}
    events_dir = os.path.join(run_dir, "events")
    if not os.path.isdir(events_dir):
        history.notes.append("no events/ directory: the run left no events")
        return history
    names = sorted(n for n in os.listdir(events_dir) if n.endswith(".jsonl"))
    unknown: dict[str, int] = {}
    # Millions of parsed events pass through here and hold no reference
    # cycles; the cyclic GC would rescan the growing heap again and again for
    # nothing (it tripled load time on a 1.6M-event run).
    enabled = gc.isenabled()
    gc.disable()
    try:
        _load_files(history, run_dir, events_dir, names, unknown)
    except spill.SpillError as exc:
        raise InputError(str(exc)) from None
    finally:
        if enabled:
            gc.enable()
    for kind, count in sorted(unknown.items()):
        history.notes.append(f"ignored {count} event(s) of unknown kind {kind!r}")
    history.__dict__.pop("_first_log", None)
    history.events.sort(key=itemgetter("_pos"))
    for log in history.logs.values():
        _finish(history, log)
    for log in history.logs.values():
        log.__dict__.pop("_borrowed", None)  # loaded: no column grows any more
    history.__dict__.pop("_in_order", None)
    _check_steps(history)
    _place_by_time(history)
    return history


def _load_files(history: History, run_dir: str, events_dir: str, names: list[str], unknown: dict[str, int]) -> None:
    """Every events file into `history`: in parallel workers when worth it, else one by one; the
    columns on disk (invariants/spill.py) when the files hold SPILL_MIN_BYTES or more."""
    files = [(os.path.join(events_dir, name), "events/" + name) for name in names]
    sizes = [os.stat(path).st_size if os.path.isfile(path) else 0 for path, _ in files]
    if sum(sizes) >= spill.SPILL_MIN_BYTES:
        scratch = history.__dict__["_scratch"] = spill.Scratch()
        history.__dict__["_spill"] = scratch.path()
    if not _load_parallel(history, files, sizes, unknown):
        for path, src in files:
            _load_file(history, run_dir, path, src, unknown)
            _share_columns(history, history.__dict__.pop("_touched", {}).values())


# Parsing is most of a big run's cost and each file parses alone, so files are
# parsed in worker processes when the run is big enough to pay for them and this
# process may fork (one thread: a harness with threads loads sequentially).
PARALLEL_MIN_BYTES = 64 << 20
WORKERS = min(2, os.cpu_count() or 1)


def _load_parallel(history: History, files: list[tuple[str, str]], sizes: list[int], unknown: dict[str, int]) -> bool:
    """Parse `files` in WORKERS forked processes, one file per task, and merge
    each as it arrives, in file order - what the sequential loop would build;
    digests are shared with the attempt's first rank log on arrival, so the
    duplicates of one file at most are held at a time. False, having changed
    nothing, when not worth it or when a merge would differ (two files writing
    one rank log, or one attempt with two world sizes): then the caller loads
    sequentially."""
    if WORKERS < 2 or len(files) < 2 or sum(sizes) < PARALLEL_MIN_BYTES or not _may_fork():
        return False
    merged = History(run_dir=history.run_dir, spec=history.spec)
    if _on_disk(history):
        merged.__dict__["_spill"] = history.__dict__["_spill"]
    counts: dict[str, int] = {}
    scratch = history.__dict__.get("_scratch")
    keep = _keeps_phases(history)
    jobs = [(history.run_dir, history.spec, path, src, scratch and scratch.dir, keep) for path, src in files]
    with multiprocessing.get_context("fork").Pool(WORKERS, initializer=_worker_signals) as pool:
        # At most WORKERS + 1 files in flight: parsed files waiting for a busy (or
        # starved) merger would otherwise pile up in this process, unshared.
        queued = iter(jobs)
        pending = deque(pool.apply_async(_load_one, (job,)) for job in islice(queued, WORKERS + 1))
        while pending:
            part, part_unknown = pending.popleft().get()
            following = next(queued, None)
            if following is not None:
                pending.append(pool.apply_async(_load_one, (following,)))
            if part.logs.keys() & merged.logs.keys() or any(
                    merged.world_sizes.get(a, ws) != ws for a, ws in part.world_sizes.items()):
                return False
            for log in part.logs.values():
                _share_digests(merged, log)
            merged.logs.update(part.logs)
            _share_columns(merged, part.logs.values())
            merged.world_sizes.update(part.world_sizes)
            merged.events.extend(part.events)
            if part.lines is not None:
                merged.lines = {**(merged.lines or {}), **part.lines}
            merged.notes.extend(part.notes)
            merged.event_count += part.event_count
            for kind, n in part_unknown.items():
                counts[kind] = counts.get(kind, 0) + n
        pool.close()  # the workers take their end-of-work sentinels and exit: no signal needed
        pool.join()
    history.logs, history.world_sizes, history.events = merged.logs, merged.world_sizes, merged.events
    if history.lines is not None:
        history.lines.update(merged.lines or {})
    history.notes.extend(merged.notes)
    history.event_count += merged.event_count
    for kind, n in counts.items():
        unknown[kind] = unknown.get(kind, 0) + n
    return True


def _worker_signals() -> None:
    """In each worker: SIGTERM kills it and Ctrl-C is left to the process that forked it.

    Inherited through the fork, the harness's handlers (harness/supervise/interrupts.py) run only
    between bytecodes, so a SIGTERM from Pool.terminate that landed just before a worker blocked on
    the task queue's lock was never acted on, and terminate() waited for that worker forever: 1 load
    in about 10 of a 1.6 M-event run hung so. The kernel's default action has no such window."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _may_fork() -> bool:
    """Forking a process that runs other threads can copy a lock held mid-operation."""
    return threading.active_count() == 1


def _load_one(job: tuple[str, dict[str, Any], str, str, str | None, bool]) -> tuple[History, dict[str, int]]:
    """In a worker: one file into a History of its own (its columns in a file of its own, when on disk)."""
    run_dir, spec, path, src, folder, keep_phases = job
    part = History(run_dir=run_dir, spec=spec)
    if keep_phases:
        part.__dict__["_keep_phases"] = True
        part.lines = {}
    if folder is not None:
        part.__dict__["_spill"] = os.path.join(folder, f"columns-{os.getpid()}.bin")
    unknown: dict[str, int] = {}
    _load_file(part, run_dir, path, src, unknown)
    part.__dict__.pop("_first_log", None)
    part.__dict__.pop("_odd_world_sizes", None)
    part.__dict__.pop("_touched", None)
    for log in part.logs.values():  # digests travel as one string: no object per event on arrival
        spill.seal(vars(log).values())
        if isinstance(log.digests, list) and log.digests and set(map(type, log.digests)) == {str}:
            joined = "\n".join(log.digests)
            if joined.count("\n") == len(log.digests) - 1:
                log.__dict__["_joined"], log.digests = joined, []
    return part, unknown


def _share_digests(history: History, log: RankLog) -> None:
    """A whole log's digests as the objects of the attempt's first rank log, when equal
    (compared as joined strings when they came that way, never split then)."""
    joined = log.__dict__.pop("_joined", None)
    if _on_disk(history):
        if joined is not None:
            log.digests = joined.split("\n")
        return  # on disk: sharing would save no memory
    n = len(log.digests) if joined is None else joined.count("\n") + 1
    ref = next((other for (a, _), other in history.logs.items() if a == log.attempt), None)
    if ref is not None and log.steps:
        i = bisect_left(ref.steps, log.steps[0])
        candidate = ref.digests[i : i + n]
        if (candidate == log.digests) if joined is None else (
                len(candidate) == n and set(map(type, candidate)) == {str} and "\n".join(candidate) == joined):
            log.digests = candidate
            return
    if joined is not None:
        log.digests = joined.split("\n")


def _check_steps(history: History) -> None:
    """No update is numbered beyond total_steps (docs/DESIGN.md, step numbering)."""
    total = history.spec["total_steps"]
    for log in history.logs.values():
        for steps, kind in ((log.steps, "step"), (log.batch_steps, "batch")):
            if steps and steps[-1] > total:
                raise InputError(f"attempt {log.attempt} rank {log.rank}: a {kind} event names update {steps[-1]}, "
                                 f"beyond total_steps={total} in run.json; the run directory is inconsistent")
    for ev in history.events:
        if type(ev.get("step")) is int and ev["step"] > total:
            raise InputError(f"{ev.get('_src', 'an event')}: {ev.get('kind')} event names update {ev['step']}, "
                             f"beyond total_steps={total} in run.json; the run directory is inconsistent")


def _place_by_time(history: History) -> None:
    """Give harness events the attempt their time `t` puts them in (docs/DESIGN.md:
    harness events are ordered against rank events by `t`; `attempt` only where
    `t` cannot decide).

    An attempt begins at its first rank event. A hang, an exit or a fault on a
    rank without `attempt` belongs to the latest attempt begun by its time.
    Damage to a checkpoint from outside training (rank null) belongs to no
    running attempt, so it is placed before the first attempt that had not yet
    looked at a checkpoint by its time - the first that could restore it -
    whichever attempt it names (harnesses differ: the one that ended or the one
    it affects); atomicity carries it to every later attempt that considers it.
    An attempt looks at its first restore, reject or trained step, not at its
    first event: rank 0 writes in-rank corruption (faults/corrupt.py) after its
    own `start`, before any rank can read a checkpoint, and that is damage the
    attempt must see. Equal times count as not yet looked. Only when no attempt
    looks after it does its own `attempt` (if any) decide."""
    starts: dict[int, float] = {}
    for ev in history.events:
        if ev["kind"] not in _HARNESS and "attempt" in ev:
            starts[ev["attempt"]] = min(starts.get(ev["attempt"], ev["t"]), ev["t"])
    for (attempt, _), log in history.logs.items():
        if log.first_pos is not None:
            starts[attempt] = min(starts.get(attempt, log.first_pos[0]), log.first_pos[0])
    order = sorted(starts, key=lambda a: (starts[a], a))
    looks = _first_looks(history)
    for ev in history.events:
        if ev["kind"] not in _HARNESS or not order:
            continue
        if ev["kind"] == "fault" and ev.get("rank") is None and isinstance(ev.get("checkpoint"), str):
            later = sorted((looks[a], a) for a in looks if looks[a] >= ev["t"])
            if later:
                ev["attempt"] = later[0][1]
            elif "attempt" not in ev:
                ev["attempt"] = order[-1]
        elif "attempt" not in ev:
            begun = [a for a in order if starts[a] <= ev["t"]]
            ev["attempt"] = begun[-1] if begun else order[0]


def _first_looks(history: History) -> dict[int, float]:
    """When each attempt first looked at a checkpoint: its first restore, reject or
    trained step on any rank (an attempt that did none of them never looked)."""
    looks: dict[int, float] = {}
    for ev in history.events:
        if ev["kind"] in ("restore", "reject") and "attempt" in ev:
            looks[ev["attempt"]] = min(looks.get(ev["attempt"], ev["t"]), ev["t"])
    for (attempt, _), log in history.logs.items():
        if log.first_pos is not None:
            looks[attempt] = min(looks.get(attempt, log.first_pos[0]), log.first_pos[0])
    return looks


# ---------------------------------------------------------------- run.json


def load_spec(run_dir: str) -> dict[str, Any]:
    """Read and validate run.json; an InputError names the field and the fix."""
    if not os.path.isdir(run_dir):
        raise InputError(f"{run_dir}: not a directory")
    path = os.path.join(run_dir, "run.json")
    try:
        raw = read_bounded(run_dir, path, MAX_SPEC_BYTES, "run.json is a small spec; this is not one")
    except InputError as exc:
        raise InputError(f"{run_dir}/{exc}") from None
    except FileNotFoundError:
        raise InputError(f"{path}: missing; a run directory needs run.json (format {FORMAT!r})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    try:
        spec = _DECODER.decode(raw if isinstance(raw, str) else raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to read; run.json holds a flat spec") from None
    except ValueError as exc:  # not UTF-8
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(spec, dict):
        raise InputError(f"{path}: line 1: expected a JSON object, got {type(spec).__name__}")
    if spec.get("format") != FORMAT:
        raise InputError(f"{path}: field 'format' is {spec.get('format')!r}; this checker reads {FORMAT!r} only")
    pos_int = (lambda v: type(v) is int and 0 < v <= MAX_COUNT, f"a positive integer up to {MAX_COUNT}")
    nonneg_int = (lambda v: type(v) is int and 0 <= v <= MAX_COUNT, f"a non-negative integer up to {MAX_COUNT}")
    nonneg_num = (lambda v: type(v) in (int, float) and v >= 0, "a non-negative number")
    rules: list[tuple[str, bool, Any]] = [
        ("dataset_size", True, pos_int),
        ("global_batch", True, pos_int),
        ("drop_last", True, (lambda v: isinstance(v, bool), "true or false")),
        ("total_steps", True, (lambda v: type(v) is int and 0 <= v <= MAX_STEPS,
                               f"a non-negative integer up to {MAX_STEPS}")),
        ("hang_timeout_s", True, (lambda v: type(v) in (int, float) and v > 0, "a positive number")),
        ("faults", True, (lambda v: isinstance(v, list), "a list")),
        ("world_sizes", False, (lambda v: isinstance(v, list) and all(type(x) is int and 0 < x <= MAX_RANKS for x in v),
                                f"a list of positive integers up to {MAX_RANKS}")),
        ("max_restarts", False, nonneg_int),
        ("hang_slack_s", False, nonneg_num),
        ("loss_tolerance", False, nonneg_num),
        ("sampling", False, (lambda v: v in SAMPLINGS, " or ".join(map(repr, SAMPLINGS)))),
    ]
    for key, required, (ok, what) in rules:
        if key not in spec or spec[key] is None:
            if required:
                raise InputError(f"{path}: missing field {key!r} ({what})")
        elif not ok(spec[key]):
            raise InputError(f"{path}: field {key!r} must be {what}, got {spec[key]!r}")
    ids: set[Any] = set()
    for i, fault in enumerate(spec["faults"]):
        where = f"{path}: faults[{i}]"
        if not isinstance(fault, dict):
            raise InputError(f"{where}: expected an object")
        for key in ("id", "kind"):
            if key not in fault:
                raise InputError(f"{where}: missing field {key!r}")
        if type(fault["id"]) not in (str, int):
            raise InputError(f"{where}: field 'id' must be a string, got {fault['id']!r}")
        if fault["id"] in ids:
            raise InputError(f"{where}: duplicate fault id {fault['id']!r}")
        ids.add(fault["id"])
    return spec


# ---------------------------------------------------------------- parsing


def _bad(src: str, line: int, message: str) -> InputError:
    return InputError(f"{src} line {line}: {message}")


def _load_file(history: History, root: str, path: str, src: str, unknown: dict[str, int]) -> None:
    """Stream one events file block by block; each block of whole lines is judged
    alone (fast path, else the reference path), the last one with the torn-line
    allowance. A block is held back until the next arrives, so the final block
    always holds the file's last line."""
    held: tuple[int, bytes, int | None] | None = None
    try:
        for first, block, newlines in _blocks(history, root, path, src):
            if held is not None and block is not None and not block.strip():
                continue  # blank lines carry nothing; the held block may still end the file
            if held is not None:
                _load_block(history, held[1], held[0], src, unknown, final=False, newlines=held[2])
            held = None if block is None else (first, block, newlines)
    except FileNotFoundError:
        raise InputError(f"{src}: vanished while being read") from None
    except OSError as exc:
        raise InputError(f"{src}: cannot read: {exc}") from None
    if held is not None:
        _load_block(history, held[1], held[0], src, unknown, final=True, newlines=held[2])


def _blocks(history: History, root: str, path: str, src: str) -> Iterator[tuple[int, bytes | None, int | None]]:
    """(first line number, whole lines without the final newline, the newlines among
    them) of about BLOCK bytes each, the last one holding what follows the last newline
    (None: the rest of the file was a torn tail, already noted; its newlines are not
    counted, None). A line longer
    than MAX_LINE is refused, or skipped as torn when nothing follows it (a NUL
    tail a crash left): it is skimmed in blocks, holes skipped, never held."""
    number, pending = 1, b""
    with open_regular(root, path) as f:
        while chunk := f.read(BLOCK):
            data = pending + chunk if pending else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                pending = data
                if len(pending) > MAX_LINE:
                    _skim_overlong(history, f, src, number, len(pending))
                    yield number, None, None  # the block held before the torn tail is not the last
                    return
                continue
            newlines = data.count(b"\n", 0, cut)
            yield number, data[:cut], newlines
            number += newlines + 1
            pending = data[cut + 1 :]
    yield number, pending, None


def _skim_overlong(history: History, f: BinaryIO, src: str, number: int, length: int) -> None:
    """Read past a line longer than MAX_LINE without keeping it: an error if
    anything but blanks follows a newline (a line in the middle), else a torn
    last line. Holes of a sparse file (NULs, no newline) are jumped over."""
    fd, pos = f.fileno(), f.tell()  # raw reads from here on: no buffer to fall out of step
    size = os.fstat(fd).st_size
    seek_data = getattr(os, "SEEK_DATA", None)
    broken = False
    while pos < size:
        if seek_data is not None:
            try:
                nxt = os.lseek(fd, pos, seek_data)  # jump over a hole: it holds only NULs
            except OSError:  # ENXIO: nothing but a hole up to the end
                nxt = size
            length, pos = length + nxt - pos, nxt
        chunk = os.pread(fd, BLOCK, pos)
        if not chunk:
            break
        if broken and chunk.strip() or b"\n" in chunk and chunk[chunk.index(b"\n") :].strip():
            raise _bad(src, number, f"a line longer than {MAX_LINE} bytes; an event is one small JSON object")
        broken = broken or b"\n" in chunk
        length, pos = length + len(chunk), pos + len(chunk)
    history.notes.append(f"{src} line {number}: skipped a torn last line ({length} bytes, longer than any event)")


def _load_block(history: History, data: bytes, first: int, src: str, unknown: dict[str, int], final: bool,
                newlines: int | None = None) -> None:
    if history.lines is not None and final:  # the report's reader parses every file's last line itself
        text = data.rstrip()
        history.lines.setdefault(src, {})[first + text.count(b"\n")] = text.rpartition(b"\n")[2]
    try:
        if _ingest_typed(history, data, first, src, unknown, newlines):
            return
    except InputError:
        pass  # _ingest_typed changed nothing; the reference path names the line
    if history.lines is not None:  # a block of the slower paths: every line that may not be dense
        kept = history.lines.setdefault(src, {})
        for number, line in enumerate(data.split(b"\n"), first):
            if not _DENSE_LINE.match(line):
                kept[number] = line
    fast = _parse_fast(data)
    if fast is not None:
        try:
            if _ingest_columns(history, fast, range(first, first + len(fast)), src, unknown):
                history.event_count += len(fast)
                return
        except InputError:
            pass  # _ingest_columns changed nothing; the reference path names the line
    parsed, numbers = _parse(history, data, src, first, final)
    if not parsed:
        return
    if not _ingest_columns(history, parsed, numbers, src, unknown):
        _ingest_events(history, parsed, numbers, src, unknown)
    history.event_count += len(parsed)


def _parse_fast(data: bytes) -> list[Any] | None:
    """Every line of a clean file, each parsed by orjson on its own (so one
    line is exactly one value); None when a line is blank or orjson refuses
    it (NaN, a torn line, too deep, bad UTF-8), so that the reference path
    decides and names the line.

    orjson reads an integer beyond 64 bits as a float where the stdlib keeps
    an int; a checked integer field that comes back a float fails the column
    checks or `_validate`, and the file is read again by the reference path."""
    text = data.rstrip()
    if not text:
        return None
    try:
        return list(map(orjson.loads, text.split(b"\n")))
    except orjson.JSONDecodeError:
        return None


def _parse(history: History, data: bytes, src: str, first: int = 1, final: bool = True) -> tuple[list[Any], Sequence[int]]:
    """The JSON values of a block's lines and their line numbers (the block
    starts at line `first`; only the `final` block may end in a torn line).

    Fast path: one C-level parse of the whole block turned into a JSON array,
    used only when every line is one object - each newline sits between a "}"
    and a "{" - and the element count equals the line count; otherwise line
    by line, which also finds the line to blame."""
    text = _decode(history, data, src, first, final).rstrip()
    if not text:
        return [], []
    head, _, last = text.rpartition("\n")
    if final and not _parses(last):
        history.notes.append(f"{src} line {first - 1 + (head.count(chr(10)) + 2 if head else 1)}: skipped a torn last line ({len(last)} characters)")
        text = head.rstrip()
        if not text:
            return [], []
    breaks = text.count("\n")
    if text[0] == "{" and text[-1] == "}" and text.count("}\n") == breaks and text.count("\n{") == breaks:
        try:
            parsed = _SCAN("[" + text.replace("\n", ",") + "]", 0)[0]
        except (ValueError, StopIteration, RecursionError):
            parsed = None  # the line-by-line pass names the line
        if parsed is not None and len(parsed) == breaks + 1:
            return parsed, range(first, first + breaks + 1)
    return _parse_lines(text.split("\n"), src, first)


def _decode(history: History, data: bytes, src: str, first: int = 1, final: bool = True) -> str:
    """UTF-8 text of a block; a cut inside a character is allowed only in the
    file's last line, which a killed writer can leave torn."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        end = data.find(b"\n", exc.start)
        line = first + data.count(b"\n", 0, exc.start)
        if not final or (end != -1 and data[end:].strip()):
            raise _bad(src, line, "bytes that are not UTF-8; only a file's last line may be torn") from None
        history.notes.append(f"{src} line {line}: skipped a torn last line (cut inside a UTF-8 character)")
        return _decode(history, data[:start], src, first, final)


def _parses(line: str) -> bool:
    try:
        _DECODER.decode(line)
    except (ValueError, RecursionError):
        return False
    return True


def _parse_lines(lines: list[str], src: str, first: int = 1) -> tuple[list[Any], list[int]]:
    parsed: list[Any] = []
    numbers: Sequence[int] = []
    decode = _DECODER.decode
    for index, line in enumerate(lines):
        if not line.strip():
            continue  # a blank line carries nothing
        try:
            parsed.append(decode(line))
        except ValueError as exc:
            raise _bad(src, index + first, f"not valid JSON ({exc}); only a file's last line may be torn") from None
        except RecursionError:
            raise _bad(src, index + first, "JSON nested too deeply to read; an event is a flat object") from None
        numbers.append(index + first)
    return parsed, numbers


# ---------------------------------------------------------------- events


def _validate(ev: Any, src: str, line: int) -> str:
    """The kind of a well-formed event; an InputError naming the field otherwise."""
    if type(ev) is not dict:
        raise _bad(src, line, f"expected a JSON object, got {type(ev).__name__}")
    if None in ev.values():  # JSON null means the field is absent (docs/DESIGN.md)
        for name in [k for k, v in ev.items() if v is None and k not in ("kind", "t")]:
            del ev[name]
    for name in ("kind", "t"):
        if name not in ev:
            raise _bad(src, line, f"missing field {name!r}")
    kind = ev["kind"]
    if type(kind) is not str:
        raise _bad(src, line, f"field 'kind' must be a string, got {kind!r}")
    t = ev["t"]
    if type(t) not in _TIME_TYPES or not -_T_LIMIT < t < _T_LIMIT:  # exact for huge ints; false for NaN
        raise _bad(src, line, f"field 't' must be a finite number of seconds, got {str(t)[:40]!r}")
    if kind in _HARNESS and "attempt" in ev and not (type(ev["attempt"]) is int and ev["attempt"] >= 0):
        raise _bad(src, line, f"{kind} event: field 'attempt' must be {_INT}, got {ev['attempt']!r} (or leave it out: the time places it)")
    for name, what in REQUIRED.get(kind, ()):
        if name not in ev:
            raise _bad(src, line, f"{kind} event: missing field {name!r}")
        value = ev[name]
        if what == _INT:
            ok = type(value) is int and 0 <= value <= (MAX_RANKS if name in ("rank", "world_size") else MAX_COUNT)
        elif what == _STR:
            ok = type(value) is str
        elif what == _INTS:
            ok = type(value) is list and all(type(x) is int for x in value)
        else:
            ok = value is not None
        if not ok:
            raise _bad(src, line, f"{kind} event: field {name!r} must be {what}, got {value!r}")
    return kind


def _keep_sparse(history: History, ev: dict[str, Any], src: str, line: int) -> None:
    t = ev["t"] = float(ev["t"])
    ev["_src"] = f"{src}:{line}"
    ev["_pos"] = (t, src, line)
    history.events.append(ev)


def _log_for(history: History, attempt: int, rank: int, ws: int, src: str, line: int) -> RankLog:
    """The rank log to extend (its own columns, never ones it shares: see _share_columns)."""
    log = history.logs.get((attempt, rank))
    if log is None:
        log = history.logs[(attempt, rank)] = _new_log(history, attempt, rank, ws)
    elif log.__dict__.get("_borrowed"):
        _own(log)
    history.__dict__.setdefault("_touched", {})[(attempt, rank)] = log
    known = history.world_sizes.setdefault(attempt, ws)
    noted = history.__dict__.setdefault("_odd_world_sizes", set())
    if ws != known and (attempt, ws) not in noted:
        noted.add((attempt, ws))
        history.notes.append(f"{src} line {line}: attempt {attempt} reports world_size {ws}, earlier {known}; using {known}")
    return log


def _keeps_phases(history: History) -> bool:
    """Whether this history keeps each step's `phases` (load_history(report=True))."""
    return "_keep_phases" in history.__dict__


def _on_disk(history: History) -> bool:
    """Whether this history's columns go to a scratch file (`_spill`: this process's file in it)."""
    return "_spill" in history.__dict__


def _new_log(history: History, attempt: int, rank: int, ws: int) -> RankLog:
    """A rank log with columns in memory, or on disk when the history spills (invariants/spill.py)."""
    path = history.__dict__.get("_spill")
    phases = [] if _keeps_phases(history) else None
    if path is None:
        return RankLog(attempt, rank, ws, phases=phases)
    offsets = spill.DiskNumbers(path, "q")
    offsets.extend([0])
    return RankLog(attempt, rank, ws, steps=spill.DiskNumbers(path, "q"), losses=spill.DiskNumbers(path, "d"),
                   digests=spill.DiskStrings(path), times=spill.DiskNumbers(path, "d"), phases=phases,
                   batch_steps=spill.DiskNumbers(path, "q"), epochs=spill.DiskNumbers(path, "q"), offsets=offsets,
                   ids=spill.DiskNumbers(path, "q"))


def _ingest_events(history: History, parsed: list[Any], numbers: Sequence[int], src: str, unknown: dict[str, int]) -> None:
    """The reference path: one event at a time, fully validated."""
    for ev, line in zip(parsed, numbers):
        kind = _validate(ev, src, line)
        if kind in _DENSE:
            log = _log_for(history, ev["attempt"], ev["rank"], ev["world_size"], src, line)
            pos = (float(ev["t"]), src, line)
            if log.first_pos is None or pos < log.first_pos:
                log.first_pos = pos
            if kind == "step":
                log.steps = extend_ints(log.steps, [ev["step"]])
                log.losses = extend_losses(log.losses, [ev.get("loss")])
                log.digests = extend_digests(log.digests, [ev.get("digest")])
                log.times.extend([pos[0]])
                if log.phases is not None:
                    log.phases.append(ev.get("phases"))
            else:
                log.batch_t0 = pos[0] if log.batch_t0 is None else min(log.batch_t0, pos[0])
                log.batch_steps = extend_ints(log.batch_steps, [ev["step"]])
                log.epochs = extend_ints(log.epochs, [ev["epoch"]])
                log.ids = extend_ints(log.ids, ev["samples"])
                log.offsets = extend_ints(log.offsets, [len(log.ids)])
        elif kind in REQUIRED:
            _keep_sparse(history, ev, src, line)
        else:
            unknown[kind] = unknown.get(kind, 0) + 1


_STEP_COLUMNS = ("attempt", "rank", "world_size", "step", "loss", "digest")
_BATCH_COLUMNS = ("attempt", "rank", "world_size", "step", "epoch", "samples")
_GET = {name: itemgetter(name) for name in ("kind", "t") + _STEP_COLUMNS + _BATCH_COLUMNS}
_HEAD = itemgetter("attempt", "rank", "world_size")


def _phases_of(ev: dict[str, Any]) -> Any:
    return ev.get("phases")


def _batch_t0(log: RankLog, times: list[Any]) -> None:
    if times:
        first = float(min(times))
        log.batch_t0 = first if log.batch_t0 is None else min(log.batch_t0, first)


def _ingest_columns(history: History, parsed: list[Any], numbers: Sequence[int], src: str, unknown: dict[str, int]) -> bool:
    """The fast path for a file of one process: a few C-level passes build the
    columns (one itemgetter pass per field beats building and transposing
    row tuples). Returns False, having
    changed nothing, when the file does not fit - one attempt and rank, every
    field present and of its type - so that `_ingest_events` handles it and
    names any bad line."""
    try:
        kinds = list(map(_GET["kind"], parsed))
        times = list(map(_GET["t"], parsed))
        if not set(map(type, times)) <= _TIME_TYPES or not -_T_LIMIT < min(times) <= max(times) < _T_LIMIT:
            return False
        step_evs, batch_evs, sparse_at = _split_kinds(parsed, kinds)
        if not step_evs and not batch_evs:
            return False
        steps, losses, digests = (list(map(_GET[k], step_evs)) for k in ("step", "loss", "digest"))
        batch_steps, epochs, samples = (list(map(_GET[k], batch_evs)) for k in ("step", "epoch", "samples"))
        heads = set(map(_HEAD, step_evs)) | set(map(_HEAD, batch_evs))  # (attempt, rank, world_size)
        if len(heads) != 1:
            return False
        # Equal is not enough: 0.0 and false equal 0 in a set; the reference wants an int.
        if any(not set(map(type, map(_GET[k], evs))) <= _INT_TYPE
               for k in ("attempt", "rank", "world_size") for evs in (step_evs, batch_evs)):
            return False
        ((attempt, rank, ws),) = heads
        if type(attempt) is not int or type(rank) is not int or type(ws) is not int or attempt < 0 or rank < 0:
            return False
        if max(attempt, 0) > MAX_COUNT or rank > MAX_RANKS or not 0 <= ws <= MAX_RANKS:
            return False  # the slow path names the field that is out of bounds
        if not (
            set(map(type, steps)) <= _INT_TYPE
            and set(map(type, batch_steps)) <= _INT_TYPE
            and set(map(type, epochs)) <= _INT_TYPE
            and set(map(type, samples)) <= _LIST_TYPE
        ):
            return False
        ids = list(chain.from_iterable(samples))
        if not set(map(type, ids)) <= _INT_TYPE:
            return False
        if min(steps, default=0) < 0 or min(batch_steps, default=0) < 0 or min(epochs, default=0) < 0:
            return False
        if max(steps, default=0) > MAX_COUNT or max(batch_steps, default=0) > MAX_COUNT or max(epochs, default=0) > MAX_COUNT:
            return False  # the reference path names the field
        for i in sparse_at:  # few: validate them before touching the history
            _validate(parsed[i], src, numbers[i])
    except (KeyError, TypeError):
        return False
    first = next(i for i, kind in enumerate(kinds) if kind in _DENSE)
    log = _log_for(history, attempt, rank, ws, src, numbers[first])
    pos = (float(times[first]), src, numbers[first])
    if log.first_pos is None or pos < log.first_pos:
        log.first_pos = pos
    phases = list(map(_phases_of, step_evs)) if log.phases is not None else None
    _batch_t0(log, list(map(_GET["t"], batch_evs)))
    _extend_log(history, log, steps, losses, digests, list(map(_GET["t"], step_evs)), phases, batch_steps, epochs,
                list(map(len, samples)), ids)
    for i in sparse_at:
        kind = kinds[i]
        if kind in REQUIRED:
            _keep_sparse(history, parsed[i], src, numbers[i])
        else:
            unknown[kind] = unknown.get(kind, 0) + 1
    return True


def _typed_decoder(phases: bool = False, head: tuple[int, int, int] | None = None) -> Any:
    """A msgspec decoder of one event line: `batch` and `step` as typed structs (strict:
    an int field takes only a JSON integer - no bool, no 1.0 - of any size; repeated keys:
    the last one, as the standard library), every other kind this reader knows as an empty
    struct of that tag, fields unread (the line is parsed again as a dict, few are).
    An unknown kind, a missing field or a wrong type is an error: the block then takes
    the orjson path, which handles and names all of that. With `head` (attempt, rank,
    world_size) those three fields must hold exactly those values, so that the decoding
    itself checks that a block is one process's, with no pass over its events."""
    # The reference path's bounds, checked by msgspec as it decodes (no pass over a column).
    count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
    ranks = Annotated[int, msgspec.Meta(ge=0, le=MAX_RANKS)]
    time = Annotated[float, msgspec.Meta(gt=-_T_LIMIT, lt=_T_LIMIT)]
    fixed: list[Any] = [count, ranks, ranks] if head is None else [Literal[value] for value in head]  # type: ignore[valid-type]
    common = [("t", time), *zip(("attempt", "rank", "world_size"), fixed), ("step", count)]
    options = {"tag_field": "kind", "gc": False}
    batch = msgspec.defstruct("Batch", common + [("epoch", count), ("samples", list[int])], tag="batch", **options)
    extra = [("phases", Any, None)] if phases else []  # null reads as None, as for an absent field
    step = msgspec.defstruct("Step", common + [("loss", Any, None), ("digest", Any, None)] + extra, tag="step",
                             **options)
    others = [msgspec.defstruct(f"Other_{kind}", [], tag=kind, **options) for kind in REQUIRED if kind not in _DENSE]
    return batch, step, msgspec.json.Decoder(Union[tuple([batch, step] + others)])  # type: ignore[valid-type]


@functools.lru_cache(maxsize=64)  # a file is one process's: its blocks reuse one; a run's files rarely interleave
def _typed_for(head: tuple[int, int, int] | None, phases: bool) -> Any:
    """The typed decoder for one process's blocks (head None: any attempt, rank and world size)."""
    return _typed_decoder(phases, head)


_TYPED_HEAD = attrgetter("attempt", "rank", "world_size")
# How many of a block's first lines are read for its head; a block whose first batch or step
# lies deeper is decoded without one, its heads then compared in a pass.
_HEAD_PROBE = 8


def _block_head(text: bytes, generic: Any) -> tuple[int, int, int] | None:
    """(attempt, rank, world_size) of the first batch or step event among the first
    _HEAD_PROBE lines of `text`, decoded by the decoder for any head; None if none is there."""
    batch_type, step_type, decoder = generic
    start = 0
    for _ in range(_HEAD_PROBE):
        end = text.find(b"\n", start)
        try:
            ev = decoder.decode(text[start:] if end < 0 else text[start:end])
        except (msgspec.DecodeError, RecursionError):
            return None
        if type(ev) is batch_type or type(ev) is step_type:
            return _TYPED_HEAD(ev)
        if end < 0:
            return None
        start = end + 1
    return None


def _ingest_typed(history: History, data: bytes, first: int, src: str, unknown: dict[str, int],
                  newlines: int | None = None) -> bool:
    """The fastest path, when msgspec is installed: each line decoded straight into a
    typed struct (msgspec checks every field's type, so no pass over a column does), the
    columns taken by attribute. The same rules as `_ingest_columns` otherwise: one attempt,
    rank and world size, fields within bounds, the other events validated as dicts; False,
    having changed nothing, for anything else, and the orjson path decides. Bounds are
    part of the types (`_typed_decoder`), and so is the block's head when its first lines
    name it: a value beyond one fails the decoding."""
    if msgspec is None:
        return False
    text = data.rstrip()
    if not text:
        return False
    phases = _keeps_phases(history)
    head = _block_head(text, _typed_for(None, phases))
    batch_type, step_type, decoder = _typed_for(head, phases)
    try:
        decoded, lines = _decode_block(decoder, text, newlines)
    except (msgspec.DecodeError, RecursionError):  # ValidationError included; too deep a line
        return False
    types = list(map(type, decoded))
    step_evs, batch_evs, sparse_at = _split_typed(decoded, types, batch_type, step_type)
    if not step_evs and not batch_evs:
        return False
    if head is None:
        heads = set(map(_TYPED_HEAD, step_evs)) | set(map(_TYPED_HEAD, batch_evs))
        if len(heads) != 1:
            return False
        ((attempt, rank, ws),) = heads
    else:
        attempt, rank, ws = head
    steps, losses, digests = (list(map(attrgetter(k), step_evs)) for k in ("step", "loss", "digest"))
    batch_steps, epochs, samples = (list(map(attrgetter(k), batch_evs)) for k in ("step", "epoch", "samples"))
    numbers = range(first, first + len(decoded))
    if lines is None and sparse_at:
        lines = text.split(b"\n")  # the few other lines are read again, as text
    sparse = []
    for i in sparse_at:  # few: read again as dicts, validated before touching the history
        try:
            ev = orjson.loads(lines[i])
        except orjson.JSONDecodeError:
            return False
        sparse.append((_validate(ev, src, numbers[i]), ev, numbers[i]))
    at = next(i for i, kind in enumerate(types) if kind is batch_type or kind is step_type)
    log = _log_for(history, attempt, rank, ws, src, numbers[at])
    pos = (float(decoded[at].t), src, numbers[at])
    if log.first_pos is None or pos < log.first_pos:
        log.first_pos = pos
    phases_column = list(map(attrgetter("phases"), step_evs)) if log.phases is not None else None
    _batch_t0(log, list(map(attrgetter("t"), batch_evs)))
    _extend_log(history, log, steps, losses, digests, list(map(attrgetter("t"), step_evs)), phases_column,
                batch_steps, epochs, list(map(len, samples)), list(chain.from_iterable(samples)))
    if history.lines is not None:
        history.lines.setdefault(src, {}).update((numbers[i], lines[i]) for i in sparse_at)
    for kind, ev, line in sparse:
        if kind in REQUIRED:
            _keep_sparse(history, ev, src, line)
        else:
            unknown[kind] = unknown.get(kind, 0) + 1
    history.event_count += len(decoded)
    return True


def _decode_block(decoder: Any, text: bytes, newlines: int | None) -> tuple[list[Any], list[bytes] | None]:
    """(each line of `text` decoded, the lines - None when they were not split); raises what
    the decoder raises. `decode_lines` takes whitespace-separated values in one call, not
    lines, so it is used only when each line is certainly one value: every one of the block's
    `newlines` (counted as it was cut, `_blocks`) sits between "}" and "{" - no blank line, no
    value across lines, since a JSON string holds no raw newline - and the values number the
    lines. Otherwise the lines are split and decoded one by one."""
    if newlines is not None and text.count(b"}\n{") == newlines:
        decoded = decoder.decode_lines(text)
        if len(decoded) == newlines + 1:
            return decoded, None
    lines = text.split(b"\n")
    return list(map(decoder.decode, lines)), lines


def _split_typed(decoded: list[Any], types: list[type], batch_type: type, step_type: type
                 ) -> tuple[list[Any], list[Any], list[int]]:
    """(step structs, batch structs, indices of the other lines), as `_split_kinds`."""
    evens, odds = types[0::2], types[1::2]
    if evens and odds and {evens[0], odds[0]} == {batch_type, step_type} and evens.count(evens[0]) == len(evens) \
            and odds.count(odds[0]) == len(odds):
        return (decoded[0::2], decoded[1::2], []) if evens[0] is step_type else (decoded[1::2], decoded[0::2], [])
    step_evs = list(compress(decoded, map(is_, types, repeat(step_type))))
    batch_evs = list(compress(decoded, map(is_, types, repeat(batch_type))))
    dense = {batch_type, step_type}
    sparse_at = list(compress(range(len(decoded)), map(not_, map(dense.__contains__, types))))
    return step_evs, batch_evs, sparse_at


def _extend_log(history: History, log: RankLog, steps: list[int], losses: list[Any], digests: list[Any],
                times: list[float], phases: list[Any] | None, batch_steps: list[int], epochs: list[int],
                lengths: list[int], ids: list[int]) -> None:
    log.steps = extend_ints(log.steps, steps)
    log.losses = extend_losses(log.losses, losses)
    log.digests = extend_digests(log.digests, _shared(history, log, steps, digests))
    spill.extend_column(log.times, times)
    if log.phases is not None and phases is not None:
        log.phases.extend(phases)
    log.batch_steps = extend_ints(log.batch_steps, batch_steps)
    log.epochs = extend_ints(log.epochs, epochs)
    log.offsets = extend_ints(log.offsets, list(islice(accumulate(lengths, initial=len(log.ids)), 1, None)))
    log.ids = extend_ints(log.ids, ids)


def _split_kinds(parsed: list[Any], kinds: list[Any]) -> tuple[list[Any], list[Any], list[int]]:
    """(step events, batch events, indices of the other events). A trainer writes batch k,
    step k, batch k+1...: when a block alternates and holds nothing else, two slices
    split it; otherwise C-level compress passes do."""
    evens, odds = kinds[0::2], kinds[1::2]
    if evens and odds and {evens[0], odds[0]} == _DENSE and evens.count(evens[0]) == len(evens) \
            and odds.count(odds[0]) == len(odds):
        return (parsed[0::2], parsed[1::2], []) if evens[0] == "step" else (parsed[1::2], parsed[0::2], [])
    step_evs = list(compress(parsed, map("step".__eq__, kinds)))
    batch_evs = list(compress(parsed, map("batch".__eq__, kinds)))
    sparse_at = list(compress(range(len(parsed)), map(not_, map(_DENSE.__contains__, kinds))))
    return step_evs, batch_evs, sparse_at


def _shared(history: History, log: RankLog, steps: list[int], digests: list[Any]) -> list[Any]:
    """The block's digests as the objects the attempt's first rank log already
    holds for the same updates, when they are equal: all replicas report the same
    digest for a step, so a run keeps about one string per update, not one per
    event. Equal values only, so sharing never changes what a checker sees."""
    first = history.__dict__.setdefault("_first_log", {}).setdefault(log.attempt, log)
    if first is log or not steps or _on_disk(history):
        return digests
    i = bisect_left(first.steps, steps[0])
    candidate = first.digests[i : i + len(digests)]
    return candidate if candidate == digests else digests


# Columns that the ranks of one attempt normally report alike: all replicas apply the
# same updates (steps, digests; losses too where the loss is the global one) from batches
# of the same shape (batch_steps, epochs, offsets). Only the sample ids differ by rank.
_SHAREABLE = ("steps", "losses", "digests", "batch_steps", "epochs", "offsets")


def _share_columns(history: History, logs: Iterable[RankLog]) -> None:
    """Each column of `logs` equal to the one of the attempt's first rank log becomes that
    very object: memory for those columns is then per update, not per (update, rank).
    Equal values only, so no checker can see a difference; a log that grows afterwards
    (a second file for one rank) copies its columns first (_own)."""
    if _on_disk(history):  # on disk: write out what the files left in memory, share nothing
        for log in logs:
            spill.seal(vars(log).values())
        return
    firsts: dict[int, RankLog] = {}
    for log in history.logs.values():
        firsts.setdefault(log.attempt, log)
    for log in logs:
        ref = firsts.get(log.attempt)
        if ref is None or ref is log:
            continue
        for name in _SHAREABLE:
            mine, theirs = getattr(log, name), getattr(ref, name)
            if mine is not theirs and len(mine) == len(theirs) and type(mine) is type(theirs) and mine == theirs:
                setattr(log, name, theirs)
                log.__dict__["_borrowed"] = ref.__dict__["_borrowed"] = True


def _own(log: RankLog) -> None:
    """Give a log copies of the columns it may share, before it grows."""
    log.__dict__.pop("_borrowed", None)
    for name in _SHAREABLE:
        column = getattr(log, name)
        setattr(log, name, array(column.typecode, column) if isinstance(column, array) else list(column))


def _finish(history: History, log: RankLog) -> None:
    """Put a rank log in update order (files may come in any order) and move
    repeated `step` events aside, so that each column has one row per update."""
    # Shared columns (_share_columns) known to be in order, by id (held, so no id is reused).
    in_order: dict[int, Any] = history.__dict__.setdefault("_in_order", {})
    if id(log.steps) in in_order:
        pass
    elif spill.ascending(log.steps, strict=True):
        in_order[id(log.steps)] = log.steps
    else:  # out of order or repeated (no set of every step)
        order = sorted(range(len(log.steps)), key=log.steps.__getitem__)
        steps, losses, digests, times, phases = [], [], [], [], []
        for i in order:
            if steps and steps[-1] == log.steps[i]:
                history.duplicate_steps.append(
                    (log.attempt, log.steps[i], log.rank, log.losses[i], log.digests[i], f"attempt {log.attempt} rank {log.rank}")
                )
                continue
            steps.append(log.steps[i])
            losses.append(log.losses[i])
            digests.append(log.digests[i])
            times.append(log.times[i])
            if log.phases is not None:
                phases.append(log.phases[i])
        log.steps = extend_ints(log.steps[:0], steps)
        log.losses = extend_losses(log.losses[:0], losses)
        log.digests = digests
        log.times = array("d", times)
        if log.phases is not None:
            log.phases = phases
    if id(log.batch_steps) in in_order:
        pass
    elif spill.ascending(log.batch_steps, strict=False):
        in_order[id(log.batch_steps)] = log.batch_steps
    else:
        order = sorted(range(len(log.batch_steps)), key=log.batch_steps.__getitem__)
        chunks = [log.ids[log.offsets[i] : log.offsets[i + 1]] for i in order]
        log.batch_steps = extend_ints(log.batch_steps[:0], [log.batch_steps[i] for i in order])
        log.epochs = extend_ints(log.epochs[:0], [log.epochs[i] for i in order])
        log.ids = extend_ints(log.ids[:0], list(chain.from_iterable(chunks)))
        log.offsets = extend_ints(log.offsets[:0], list(accumulate(map(len, chunks), initial=0)))
