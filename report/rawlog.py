"""A forgiving read of a run's raw events, for pictures and figures.

The invariants' loader keeps what the checkers need (steps and batches as
columns) and is strict on purpose. A report also needs what the checkers drop:
the time of every `step`, its `phases`, a save's `seconds`, a hang's stack files.
And it must still draw something for a run whose events the checkers refuse, so
this reader skips what it cannot parse and says so instead of raising.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwreck.trainer.progress import TIMED_PHASES  # noqa: F401 - the report reads it from here
from trainwreck.rundir.layout import RunDirError, read_events, read_run_json

"""The trainer's step phases, in the order they happen (docs/DESIGN.md `step` event)."""


@dataclass
class LaneLog:
    """One rank of one attempt: the updates it reported applied, when, and how long each phase took."""

    attempt: int
    rank: int
    world_size: int | None = None
    steps: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)  # per step, None where it was not a number
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


def read_raw(run_dir: Path, batches: bool = True) -> RawRun:
    """Every event of the run (the trainer's forgiving reader). batches=False skips `batch` lines
    unparsed (they are most of the bytes) when the caller gets the sample counts elsewhere."""
    raw = RawRun(spec=read_spec(run_dir))
    for events_file in read_events(run_dir, batches):
        if events_file.error:
            raw.notes.append(f"events/{events_file.name}: {events_file.error}")
        for ev in events_file.events:
            _ingest(raw, ev)
        if events_file.skipped:
            raw.notes.append(f"events/{events_file.name}: skipped {events_file.skipped} line(s) that were not "
                             "events (a torn last line is normal after a kill)")
    raw.events.sort(key=lambda ev: ev["t"])
    for lane in raw.lanes.values():
        if any(a > b for a, b in zip(lane.steps, lane.steps[1:])):  # hand-written logs may be out of order
            order = sorted(range(len(lane.steps)), key=lambda i: (lane.steps[i], lane.times[i]))
            lane.steps = [lane.steps[i] for i in order]
            lane.times = [lane.times[i] for i in order]
            lane.losses = [lane.losses[i] for i in order]
    return raw


def _ingest(raw: RawRun, ev: dict[str, Any]) -> None:
    t = float(ev["t"])
    if raw.t0 is None or t < raw.t0:
        raw.t0 = t
    if raw.t_end is None or t > raw.t_end:
        raw.t_end = t
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
    phases = ev.get("phases")
    if not isinstance(phases, dict):
        return
    try:
        totals = lane.phase_totals
        for name, seconds in phases.items():
            totals[name] = totals.get(name, 0.0) + seconds
        lane.work.append(sum(phases.values()) - phases.get("checkpoint", 0.0))
        lane.phase_steps += 1
        lane.checkpoint_steps += phases.get("checkpoint", 0.0) > 0
        lane.step_phases[ev["step"]] = (t, {k: float(v) for k, v in phases.items()})
    except TypeError:  # a phase that is not a number: that step's phases are not trusted
        pass
