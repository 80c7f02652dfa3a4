"""A forgiving read of a run's raw events, for pictures and figures.

The invariants' loader keeps what the checkers need (steps and batches as
columns) and is strict on purpose. A report also needs what the checkers drop:
the time of every `step`, its `phases`, a save's `seconds`, a hang's stack files.
And it must still draw something for a run whose events the checkers refuse, so
this reader skips what it cannot parse and says so instead of raising.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from trainwreck.invariants import spill
from trainwreck.invariants.spill import DiskNumbers
from trainwreck.trainer.progress import TIMED_PHASES  # noqa: F401 - the report reads it from here
from trainwreck.rundir.layout import EventsFile, RunDirError, events_of_text, read_events, read_run_json

if TYPE_CHECKING:
    from trainwreck.invariants.history import History

"""The trainer's step phases, in the order they happen (docs/DESIGN.md `step` event)."""


@dataclass
class LaneLog:
    """One rank of one attempt: the updates it reported applied, when, and how long each phase took."""

    attempt: int
    rank: int
    world_size: int | None = None
    # Lists, or the checker's arrays when the lane was taken from a History (read_raw(history=...)).
    steps: Sequence[int] = field(default_factory=list)
    times: Sequence[float] = field(default_factory=list)
    losses: Sequence[float | None] = field(default_factory=list)  # per step, None where it was not a number
    phase_totals: dict[str, float] = field(default_factory=dict)
    phase_steps: int = 0  # step events that carried `phases`
    checkpoint_steps: int = 0  # step events whose checkpoint phase was not zero: the steps that paid for a save
    work: list[float] = field(default_factory=list)  # per step: seconds in every phase but checkpoint
    started: float | None = None  # the `start` event's time
    step_phases: dict[int, tuple[float, dict[str, float]]] = field(default_factory=dict)
    """Per step: the step event's time and its phases (a redone step keeps its last timing)."""


@dataclass
class RawRun:
    """Everything the report draws, straight from events/*.jsonl."""

    spec: dict[str, Any]
    lanes: dict[tuple[int, int], LaneLog] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # every kind but step/batch, by time
    batch_sizes: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (attempt, rank, step) -> ids
    notes: list[str] = field(default_factory=list)
    t0: float | None = None
    t_end: float | None = None

    columns: bool = False
    """Whether the lanes were taken from the History's columns (its step lines not read)."""
    history: History | None = None
    """The History the lanes and sample counts were taken from (read_raw(history=...)), else None."""

    def samples(self, attempt: int, rank: int, step: int) -> int:
        """Sample ids that rank used for that update (0 when it reported no batch for it)."""
        if self.history is None:
            return self.batch_sizes.get((attempt, rank, step), 0)
        log = self.history.logs.get((attempt, rank))
        if log is None:
            return 0
        i, j = log.batch_range(step, step)
        return log.offsets[j] - log.offsets[i] if i < j else 0

    def first_batch(self, attempt: int, rank: int) -> int | None:
        """The first update that rank reported a batch for in that attempt."""
        if self.history is None:
            return min((k for (a, r, k) in self.batch_sizes if a == attempt and r == rank), default=None)
        log = self.history.logs.get((attempt, rank))
        return log.batch_steps[0] if log is not None and len(log.batch_steps) else None

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [ev for ev in self.events if ev.get("kind") == kind]

    def rel(self, t: float | None) -> float | None:
        """Seconds since the run's first event (what every figure in a report is measured in)."""
        if t is None or self.t0 is None:
            return None
        return round(t - self.t0, 4)


def read_spec(run_dir: Path) -> dict[str, Any]:
    """run.json as a dict; {} when it is missing or unreadable (the caller decides what that means)."""
    try:
        return read_run_json(run_dir, check_format=False)
    except RunDirError:
        return {}


def read_raw(run_dir: Path, batches: bool = True, history: History | None = None) -> RawRun:
    """Every event of the run (the trainer's forgiving reader). batches=False skips `batch` lines
    unparsed (they are most of the bytes) when the caller gets the sample counts elsewhere.
    With the run's `history` (loaded with report=True) the `step` lines are not read either: each
    lane is taken from the checker's columns (`lanes_from_history`), which hold the same values;
    where they cannot say the same (a repeated step, a world size that changed) the lines are read."""
    raw = RawRun(spec=read_spec(run_dir))
    if history is not None and not batches:
        raw.history = history  # the sample counts come from its columns
    history = history if history is not None and _lanes_agree(history) else None
    for events_file in (read_events(run_dir, batches) if history is None else _kept_lines(history)):
        if events_file.error:
            raw.notes.append(f"events/{events_file.name}: {events_file.error}")
        for ev in events_file.events:
            if history is None or ev.get("kind") != "step":
                _ingest(raw, ev)
        if events_file.skipped:
            raw.notes.append(f"events/{events_file.name}: skipped {events_file.skipped} line(s) that were not "
                             "events (a torn last line is normal after a kill)")
    if history is not None:
        lanes_from_history(raw, history)
        raw.columns = True
    raw.events.sort(key=lambda ev: ev["t"])
    for lane in raw.lanes.values():
        if not spill.ascending(lane.steps, strict=False):  # hand-written logs may be out of order
            order = sorted(range(len(lane.steps)), key=lambda i: (lane.steps[i], lane.times[i]))
            lane.steps = [lane.steps[i] for i in order]
            lane.times = [lane.times[i] for i in order]
            lane.losses = [lane.losses[i] for i in order]
    return raw


def _lanes_agree(history: History) -> bool:
    """Whether the History holds what reading the files would give (load_history(report=True)):
    the other lines' text kept, every step's phases kept, no step moved aside as a repeat, and one
    world size per attempt."""
    return (history.lines is not None and not history.duplicate_steps
            and all(log.phases is not None for log in history.logs.values())
            and not any("reports world_size" in note for note in history.notes))


def _kept_lines(history: History) -> list[EventsFile]:
    """The files' lines that are not batch or step events (and each file's last line, which may
    be torn), from the History: what read_events(batches=False) would parse of the files."""
    assert history.lines is not None
    return [events_of_text(src.removeprefix("events/"), "\n".join(
        line.decode("utf-8", errors="replace") for _, line in sorted(kept.items())), batches=False, steps=False)
        for src, kept in sorted(history.lines.items())]


def lanes_from_history(raw: RawRun, history: History) -> None:
    """Each rank's steps, times, losses and phases from the checker's columns, as `_ingest_step`
    would have taken them from the step lines (lanes in (attempt, rank) order: the order of the
    files, a000-r000-... first)."""
    for (attempt, rank), log in sorted(history.logs.items()):
        if not log.steps:
            continue
        lane = raw.lanes.get((attempt, rank)) or raw.lanes.setdefault((attempt, rank), LaneLog(attempt, rank))
        # The checker's columns themselves, on disk where they are (invariants/spill.py): a copy of
        # each step's step, time and loss held 24 bytes a step event of a 16 M-event run in memory.
        times = log.times if _column(log.times) else array("d", log.times)
        lane.steps, lane.times = log.steps if _column(log.steps) else array("q", log.steps), times
        lane.losses = _numbers(log.losses)
        lane.world_size = log.world_size
        if log.phases and log.phases.count(None) < len(log.phases):  # a run that times its phases
            for step, t, phases in zip(log.steps, times, log.phases):
                if phases is not None:
                    _add_phases(lane, step, t, phases)
        low, high = spill.extremes(times)  # not empty: steps and times are one length
        _span(raw, low)
        _span(raw, high)
    raw.lanes = dict(sorted(raw.lanes.items()))


def _column(values: Sequence[Any]) -> bool:
    """Whether a History's column can be a lane's as it is: an array, or numbers on disk."""
    return isinstance(values, (array, DiskNumbers))


def _numbers(losses: Sequence[Any]) -> Sequence[float | None]:
    """A lane's losses: the column itself when every loss is a float (on disk, its typecode "d"
    says so: invariants/spill.py), else floats and None."""
    if isinstance(losses, array) or getattr(losses, "typecode", None) == "d":
        return losses
    values = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in losses]
    return array("d", values) if None not in values else values


def _span(raw: RawRun, t: float) -> None:
    if raw.t0 is None or t < raw.t0:
        raw.t0 = t
    if raw.t_end is None or t > raw.t_end:
        raw.t_end = t


def _ingest(raw: RawRun, ev: dict[str, Any]) -> None:
    t = float(ev["t"])
    _span(raw, t)
    kind = ev.get("kind")
    attempt, rank = ev.get("attempt"), ev.get("rank")
    has_lane = type(attempt) is int and type(rank) is int
    if kind == "step" and has_lane and type(ev.get("step")) is int:
        lane = raw.lanes.get((attempt, rank)) or raw.lanes.setdefault((attempt, rank), LaneLog(attempt, rank))
        _ingest_step(lane, ev, t)
        return
    if kind == "batch":
        if has_lane and type(ev.get("step")) is int and isinstance(ev.get("samples"), list):
            key = (attempt, rank, ev["step"])
            raw.batch_sizes[key] = raw.batch_sizes.get(key, 0) + len(ev["samples"])
        return
    if kind == "start" and has_lane:
        lane = raw.lanes.setdefault((attempt, rank), LaneLog(attempt, rank))
        lane.started = t if lane.started is None else min(lane.started, t)
        lane.world_size = lane.world_size or ev.get("world_size")
    raw.events.append(ev)


def _ingest_step(lane: LaneLog, ev: dict[str, Any], t: float) -> None:
    lane.steps.append(ev["step"])
    lane.times.append(t)
    loss = ev.get("loss")  # null for a diverged loss (DESIGN.md: non-finite values are written as null)
    lane.losses.append(float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else None)
    lane.world_size = ev.get("world_size", lane.world_size)
    _add_phases(lane, ev["step"], t, ev.get("phases"))


def _add_phases(lane: LaneLog, step: int, t: float, phases: Any) -> None:
    """One step's `phases` into the lane's totals (a step without a dict of them adds nothing)."""
    if not isinstance(phases, dict):
        return
    try:
        totals = lane.phase_totals
        for name, seconds in phases.items():
            totals[name] = totals.get(name, 0.0) + seconds
        lane.work.append(sum(phases.values()) - phases.get("checkpoint", 0.0))
        lane.phase_steps += 1
        lane.checkpoint_steps += phases.get("checkpoint", 0.0) > 0
        lane.step_phases[step] = (t, {k: float(v) for k, v in phases.items()})
    except TypeError:  # a phase that is not a number: that step's phases are not trusted
        pass
