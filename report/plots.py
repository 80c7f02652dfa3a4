"""Self-contained SVG plots of one run, drawn from its run directory (standard library only).

Four pictures a reader would rather look at than read:

- loss_svg:     the run's loss per lineage step against its golden run, the first divergence marked;
- coverage_svg: which sample ids each update used, ids seen twice in an epoch in red, ids a
                finished epoch never used in amber;
- progress_svg: the furthest update each rank reached, over wall-clock time (a flat line is no
                forward progress; a gentler slope is a straggler);
- ckpt_age_svg: seconds since the newest committed checkpoint, over wall-clock time.

Each function returns an SVG string (no script, no external reference); every mark has a
<title> so a browser shows its value as a tooltip. The data comes from the event logs through
rundir.iter_events, the same events the invariants judge - or, for `trainwreck report`, from the
checker's columns that hold the same values (`Columns`), so a big run's events are not read again.
A line of more points than its plot has pixels keeps, per pixel column, its first, last, lowest
and highest point (`thin`): the same line drawn, without a coordinate per event.
"""
from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from html import escape
from itertools import chain, groupby, islice, repeat
from operator import itemgetter, le, lt, mul, sub
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from trainwreck.invariants import spill, vectors
from trainwreck.report.metrics import held_since
from trainwreck.report.rawlog import RawRun, read_spec
from trainwreck.rundir.layout import RunDir, iter_events

if TYPE_CHECKING:
    from trainwreck.invariants.history import History

W, H = 640, 240
L, R, T, B = 56, 16, 28, 36  # margins: axis labels left and below, the title above
INK, MUTED, GRID = "#1f2937", "#6b7280", "#d5dbe3"
RUN_COLOR, GOLDEN_COLOR, BAD, WARN, OK = "#2563eb", "#9ca3af", "#dc2626", "#d97706", "#16a34a"
RANK_COLORS = ("#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be123c", "#4d7c0f", "#7c2d12")
LOSS_RTOL = 1e-6
"""Relative loss difference above which a step counts as diverged: float noise is far below it."""


@dataclass(frozen=True)
class RunEvents:
    """The events of one run that the plots need, read once."""

    steps: list[dict[str, Any]]
    batches: list[dict[str, Any]]
    saves: list[dict[str, Any]]
    hangs: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    t0: float

    @classmethod
    def read(cls, run_dir: Path) -> RunEvents:
        events = [ev for ev in iter_events(Path(run_dir)) if isinstance(ev.get("t"), (int, float))]
        of = {k: [ev for ev in events if ev.get("kind") == k] for k in ("step", "batch", "save", "hang", "fault")}
        t0 = min((ev["t"] for ev in events), default=0.0)
        return cls(of["step"], of["batch"], of["save"], of["hang"], of["fault"], t0)

    def losses(self) -> dict[int, float]:
        """Step -> rank 0's loss in the attempt that last applied it (the one whose state lives on)."""
        return latest_losses((ev["step"], ev.get("attempt", 0), ev.get("loss")) for ev in self.steps
                             if ev.get("rank", 0) == 0 and type(ev.get("step")) is int)

    def by_step(self) -> dict[int, tuple[int, int, list[int]]]:
        """Step -> (attempt, epoch, ids) of the last attempt to apply it, every rank's ids in order."""
        by_step: dict[int, tuple[int, int, list[int]]] = {}
        for ev in self.batches:
            step, attempt, ids = ev.get("step"), ev.get("attempt", 0), ev.get("samples") or []
            if type(step) is not int:
                continue
            held = by_step.get(step)
            if held is None or attempt > held[0]:
                by_step[step] = (attempt, int(ev.get("epoch", 0)), list(ids))
            elif attempt == held[0]:
                held[2].extend(ids)  # another rank's share of the same update
        return by_step

    def lanes(self) -> dict[tuple[int, int], _LanePoints]:
        """(attempt, rank) -> (seconds since t0, step) of each step event."""
        columns: dict[tuple[int, int], tuple[list[float], list[int]]] = {}
        for s in self.steps:
            if type(s.get("step")) is int:
                times, steps = columns.setdefault((s.get("attempt", 0), s.get("rank", 0)), ([], []))
                times.append(s["t"])
                steps.append(s["step"])
        return {lane: _LanePoints(times, steps, self.t0) for lane, (times, steps) in columns.items()}

    def step_times(self) -> Iterable[float]:
        return (e["t"] for e in self.steps)

    def grid(self) -> list[tuple[int, int, list[int]]]:
        """[(step, epoch, ids)] for the lineage's updates (the last attempt to apply each step)."""
        return [(k, e, ids) for k, (_, e, ids) in sorted(self.by_step().items())]


def latest_losses(rows: Iterable[tuple[int, int, Any]]) -> dict[int, float]:
    """(step, attempt, loss) rows -> step -> the numeric loss of the last attempt to report one for it
    (of one attempt, the last row), in step order."""
    best: dict[int, tuple[int, float]] = {}
    for step, attempt, loss in rows:
        if isinstance(loss, (int, float)) and (step not in best or attempt >= best[step][0]):
            best[step] = (attempt, float(loss))
    return {k: v for k, (_, v) in sorted(best.items())}


def _outside(first: int, last: int, taken: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The stretches of first..last that no (a, b) of `taken` (sorted) covers."""
    at = first
    for a, b in taken:
        if b < at or a > last:
            continue
        if a > at:
            yield at, a - 1
        at = max(at, b + 1)
    if at <= last:
        yield at, last


def lanes_losses(lanes: Iterable[tuple[int, Sequence[int], Sequence[Any]]]) -> dict[int, float]:
    """`latest_losses` of rows given as one lane per attempt, (attempt, steps, losses), without a
    tuple per step: the lanes in attempt order, each overwriting the steps it reports."""
    lanes = sorted(lanes, key=itemgetter(0))
    fast = vectors.last_by_key([(steps, losses) for _, steps, losses in lanes])
    if fast is not None:  # columns of doubles: every loss a float, as the loop below keeps them
        return dict(zip(*fast))
    best: dict[int, float] = {}
    for _, steps, losses in lanes:
        best.update((step, float(loss)) for step, loss in zip(steps, losses) if isinstance(loss, (int, float)))
    return best if _ascending(best) else {step: best[step] for step in sorted(best)}


def _distinct(columns: Iterable[Any]) -> list[Any]:
    """Each column (or tuple of columns) once: ranks that report alike share their column objects
    (invariants/loader.py `_share_columns`), so 8 ranks' batch steps are often one array."""
    return list({tuple(map(id, c)) if isinstance(c, tuple) else id(c): c for c in columns}.values())


class ColumnGrid:
    """RunEvents.grid of a History, answering as the list does (len, [col] -> (step, epoch, ids))
    without a list of ids per update: `chained` gives a stretch of columns' ids as slices of the
    rank logs' columns. Each update is the last attempt's to report a batch for it; its ids are
    that attempt's ranks' in log order (the files' order), its epoch the first one reported."""

    def __init__(self, history: History) -> None:
        by_attempt: dict[int, list[Any]] = {}
        for log in history.logs.values():
            if len(log.batch_steps):
                by_attempt.setdefault(log.attempt, []).append(log)
        self.logs = by_attempt
        self.segments: list[tuple[int, int, int]] = []  # (first column, end column, attempt)
        if not self._from_runs():
            self._from_sets()

    def _from_runs(self) -> bool:
        """The usual run, built without a set or dict per update: each attempt's ranks reported
        batches for one run of consecutive updates, once each (their columns shared or equal). Each
        attempt keeps the updates no later attempt reported, a stretch of its columns each. False,
        having set nothing, for any other run."""
        runs: dict[int, tuple[Any, Any]] = {}
        for attempt, logs in self.logs.items():
            distinct = _distinct((log.batch_steps, log.epochs) for log in logs)
            steps = distinct[0][0]
            if steps[-1] - steps[0] + 1 != len(steps) or not spill.ascending(steps, True) or any(
                    len(other) != len(steps) or not spill.same_range(other, 0, steps, 0, len(steps))
                    for other, _ in distinct[1:]):
                return False
            runs[attempt] = steps, distinct[0][1]  # the first rank's epochs name each update's epoch
        claimed: list[tuple[int, int]] = []  # the updates of later attempts, as (first, last)
        pieces: list[tuple[int, int, int]] = []  # (first update, last update, attempt)
        for attempt in sorted(runs, reverse=True):
            steps, _ = runs[attempt]
            pieces.extend((a, b, attempt) for a, b in _outside(steps[0], steps[-1], claimed))
            claimed = sorted(claimed + [(steps[0], steps[-1])])
        pieces.sort()
        self.steps = list(chain.from_iterable(range(a, b + 1) for a, b, _ in pieces))
        self.epochs = []
        at = 0
        for attempt, group in groupby(pieces, key=itemgetter(2)):
            first = at
            for a, b, _ in group:
                steps, epochs = runs[attempt]
                self.epochs.extend(epochs[a - steps[0] : b - steps[0] + 1])
                at += b - a + 1
            self.segments.append((first, at, attempt))
        return True

    def _from_sets(self) -> None:
        by_attempt = self.logs
        top: dict[int, int] = {}  # step -> the last attempt that reported it
        for attempt in sorted(by_attempt, reverse=True):
            for steps in _distinct(log.batch_steps for log in by_attempt[attempt]):
                top.update(dict.fromkeys(set(steps) - top.keys(), attempt))
        self.steps = sorted(top)
        attempts = list(map(top.__getitem__, self.steps))
        at = 0
        for attempt, group in groupby(attempts):
            n = sum(1 for _ in group)
            self.segments.append((at, at + n, attempt))
            at += n
        self.epochs: list[int] = []
        for first, end, attempt in self.segments:
            epoch_of: dict[int, int] = {}
            # the first batch event of a step names its epoch
            for steps, epochs in _distinct((log.batch_steps, log.epochs) for log in by_attempt[attempt]):
                if not epoch_of.keys() >= set(steps):
                    mine = dict(zip(reversed(steps), reversed(epochs)))
                    epoch_of.update({k: mine[k] for k in mine.keys() - epoch_of.keys()})
            self.epochs.extend(map(epoch_of.__getitem__, self.steps[first:end]))

    def __len__(self) -> int:
        return len(self.steps)

    def id_bounds(self) -> tuple[int, int] | None:
        """(lowest, highest) sample id of every column; None when no column has one (read once)."""
        if "_bounds" not in self.__dict__:
            ranges = [r for r in self.ranges(0, len(self)) if r[2] > r[1]]
            self._bounds = vectors.bounds(ranges)
            if self._bounds is None and ranges:  # short, or a column of ints past 64 bits: a slice at a time
                extremes = [(min(part), max(part)) for part in (column[i:j] for column, i, j in ranges)]
                self._bounds = (min(map(itemgetter(0), extremes)), max(map(itemgetter(1), extremes)))
        return self._bounds

    def __getitem__(self, col: int) -> tuple[int, int, list[int]]:
        col = range(len(self.steps))[col]
        return self.steps[col], self.epochs[col], list(chain.from_iterable(self.chained(col, col + 1)))

    def chained(self, first: int, end: int) -> Iterator[Any]:
        """The ids of columns first..end-1, a slice of a rank log's ids at a time."""
        return (column[i:j] for column, i, j in self.ranges(first, end))

    def ranges(self, first: int, end: int) -> Iterator[tuple[Any, int, int]]:
        """The ids of columns first..end-1 as (a rank log's ids column, start, stop), unread."""
        for lo, hi, attempt in self.segments:
            a, b = max(first, lo), min(end, hi)
            if a >= b:
                continue
            for log in self.logs[attempt]:
                i, j = log.batch_range(self.steps[a], self.steps[b - 1])
                if i < j:
                    yield log.ids, log.offsets[i], log.offsets[j]


@dataclass(frozen=True)
class Columns(RunEvents):
    """The same answers as RunEvents, from a History's columns (load_history(report=True) of a
    run whose step lines it holds: rawlog._lanes_agree) and the report's sparse events."""

    history: Any = None

    @classmethod
    def of(cls, raw: RawRun, history: History) -> Columns:
        events = [ev for ev in raw.events if isinstance(ev.get("t"), (int, float))]
        of = {k: [ev for ev in events if ev.get("kind") == k] for k in ("save", "hang", "fault")}
        firsts = [t for t in (log.batch_t0 for log in history.logs.values()) if t is not None]
        t0 = min([ev["t"] for ev in events] + firsts + [spill.extremes(lane.times)[0] for lane in raw.lanes.values() if len(lane.times)],
                 default=0.0)
        return cls([], [], of["save"], of["hang"], of["fault"], t0, history)

    def _logs(self) -> Iterable[Any]:
        return self.history.logs.values()

    def losses(self) -> dict[int, float]:
        return lanes_losses((log.attempt, log.steps, log.losses) for log in self._logs() if log.rank == 0)

    def grid(self) -> ColumnGrid:
        return ColumnGrid(self.history)

    def lanes(self) -> dict[tuple[int, int], _LanePoints]:
        """Each lane's points made as they are read (`_LanePoints`): a long run's lanes are not all
        held as tuples at once; the progress plot sorts and thins one lane at a time."""
        return {(log.attempt, log.rank): _LanePoints(log.times, log.steps, self.t0)
                for log in self._logs() if len(log.steps)}

    def step_times(self) -> Iterable[float]:
        """Every step event's time, or, for a long run, each distinct time once (numpy's sort,
        invariants/vectors.py): the one reader, the checkpoint-age plot, takes a set of them."""
        columns = [log.times for log in self._logs()]
        distinct = vectors.distinct_floats(columns)
        return chain.from_iterable(columns) if distinct is None else distinct


class _LanePoints:
    """(seconds since t0, step) of each step event of one rank log, made on iteration; a lane whose
    times and steps never decrease (a rank's log, written as it trains) is already sorted, and is
    thinned by bisection (`thin_ordered`) instead of point by point."""

    def __init__(self, times: Sequence[float], steps: Sequence[int], t0: float) -> None:
        self.times, self.steps, self.t0 = times, steps, t0
        self.ordered = spill.ascending(times, strict=False) and spill.ascending(steps, strict=False)

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[tuple[float, int]]:
        return zip(map(sub, self.times, repeat(self.t0)), self.steps)

    def x_max(self) -> float:
        return self.times[-1] - self.t0 if self.ordered else max(map(sub, self.times, repeat(self.t0)))

    def y_max(self) -> int:
        return self.steps[-1] if self.ordered else max(self.steps)

    def sorted(self) -> _LanePoints | list[tuple[float, int]]:
        return self if self.ordered else sorted(self)

    def thinned(self, x0: float, scale: float) -> list[tuple[float, int]]:
        if not self.ordered:
            return thin(list(self), x0, scale)
        return thin_ordered(self.times, self.steps, self.t0, x0, scale)


def _ascending(mapping: dict[int, Any]) -> bool:
    """Whether the keys come in ascending order already (a later attempt redoes steps the earlier
    one reported, in place, and adds the next ones after them), so no sorted copy is needed."""
    return all(map(lt, mapping, islice(mapping, 1, None)))


def lineage_losses(run_dir: Path, data: RunEvents | None = None) -> dict[int, float]:
    """Step -> rank 0's loss in the attempt that last applied it (the one whose state lives on)."""
    return (data or RunEvents.read(run_dir)).losses()


def first_divergence(run: dict[int, float], golden: dict[int, float]) -> int | None:
    """The first step whose loss differs from the golden run's by more than LOSS_RTOL (relative)."""
    for step in sorted(set(run) & set(golden)):
        if abs(run[step] - golden[step]) > LOSS_RTOL * max(abs(golden[step]), 1e-12):
            return step
    return None


# ----- drawing helpers ----------------------------------------------------------------------


class Frame:
    """One plot's axes: data coordinates to pixels, and the SVG parts drawn so far."""

    def __init__(self, title: str, x_range: tuple[float, float], y_range: tuple[float, float],
                 x_label: str, y_label: str, height: int = H) -> None:
        self.height = height
        self.x0, self.x1 = x_range[0], x_range[1] if x_range[1] > x_range[0] else x_range[0] + 1
        self.y0, self.y1 = y_range[0], y_range[1] if y_range[1] > y_range[0] else y_range[0] + 1
        self.parts = [f'<text x="{L}" y="18" font-size="13" font-weight="600" fill="{INK}">{escape(title)}</text>']
        self._marks = 0
        self._axes(x_label, y_label)

    def x(self, v: float) -> float:
        return round(L + (v - self.x0) / (self.x1 - self.x0) * (W - L - R), 2)

    def y(self, v: float) -> float:
        return round(self.height - B - (v - self.y0) / (self.y1 - self.y0) * (self.height - T - B), 2)

    def _axes(self, x_label: str, y_label: str) -> None:
        bottom = self.height - B
        self.parts.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{bottom - T}" fill="#fff" '
                          f'stroke="{GRID}"/>')
        for v in _ticks(self.x0, self.x1):
            self.parts.append(f'<line x1="{self.x(v)}" y1="{bottom}" x2="{self.x(v)}" y2="{bottom + 4}" '
                              f'stroke="{MUTED}"/>'
                              f'<text x="{self.x(v)}" y="{bottom + 15}" font-size="10" text-anchor="middle" '
                              f'fill="{MUTED}">{_fmt(v)}</text>')
        for v in _ticks(self.y0, self.y1):
            self.parts.append(f'<line x1="{L}" y1="{self.y(v)}" x2="{W - R}" y2="{self.y(v)}" stroke="{GRID}" '
                              f'stroke-dasharray="2 3"/><text x="{L - 4}" y="{self.y(v) + 3}" font-size="10" '
                              f'text-anchor="end" fill="{MUTED}">{_fmt(v)}</text>')
        self.parts.append(f'<text x="{(L + W - R) / 2}" y="{self.height - 6}" font-size="11" text-anchor="middle" '
                          f'fill="{INK}">{escape(x_label)}</text><text x="12" y="{(T + bottom) / 2}" font-size="11" '
                          f'text-anchor="middle" fill="{INK}" transform="rotate(-90 12 {(T + bottom) / 2})">'
                          f'{escape(y_label)}</text>')

    def polyline(self, points: Iterable[tuple[float, float]], color: str, label: str, dash: str = "",
                 step: bool = False, width: float = 1.8) -> None:
        # Thinned before the stair is drawn: each pixel column keeps its lowest and highest value
        # and the one it enters with (the previous column's last), so the stair covers the same pixels.
        scale = (W - L - R) / (self.x1 - self.x0)
        pts = points.thinned(self.x0, scale) if isinstance(points, (_LanePoints, _Series)) else thin(
            list(points), self.x0, scale)
        if step and pts:  # a value that holds until the next point: draw the stair, not the slope
            corners = zip(map(itemgetter(0), pts[1:]), map(itemgetter(1), pts))
            pts = [pts[0], *chain.from_iterable(zip(corners, pts[1:]))]
        coords = " ".join(f"{self.x(a)},{self.y(b)}" for a, b in pts)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="{width}"{extra}>'
                          f"<title>{escape(label)}</title></polyline>")

    def vline(self, v: float, color: str, label: str) -> None:
        right = self.x(v) < (L + W - R) / 2  # the label goes on the side with room
        self.parts.append(f'<line x1="{self.x(v)}" y1="{T}" x2="{self.x(v)}" y2="{self.height - B}" stroke="{color}" '
                          f'stroke-width="1.5" stroke-dasharray="4 2"><title>{escape(label)}</title></line>'
                          f'<text x="{self.x(v) + (3 if right else -3)}" '
                          f'y="{self.height - B - 5 - 12 * (self._marks % 3)}"'
                          f' font-size="10" fill="{color}" text-anchor="{"start" if right else "end"}">'
                          f"{escape(label)}</text>")
        self._marks += 1  # stagger the labels upwards from the x axis, clear of the legend at the top

    def legend(self, items: list[tuple[str, str]]) -> None:
        x = W - R - 4  # inside the plot's top-right corner, clear of the title above it
        for text, color in reversed(items):
            width = 10 + 6 * len(text)
            x -= width
            self.parts.append(f'<rect x="{x}" y="{T + 5}" width="8" height="8" fill="{color}"/>'
                              f'<text x="{x + 11}" y="{T + 13}" font-size="10" fill="{INK}">{escape(text)}</text>')
            x -= 8

    def svg(self, label: str) -> str:
        return svg_document(label, self.height, "".join(self.parts))


THIN_ABOVE = 4 * (W - L - R)
"""A line of more points than this (four per pixel column) is thinned (`thin`); fewer are drawn as they are."""


def thin(pts: list[tuple[float, float]], x0: float, scale: float) -> list[tuple[float, float]]:
    """A line ordered by x, with only the first, last, lowest and highest point of each pixel
    column (column = int((x - x0) * scale)), in their order: the segments left draw what the
    dropped points did within a pixel (the M4 reduction), so a million points cost a few thousand
    coordinates. A line of THIN_ABOVE points or fewer, or one not ordered by x, is returned as is."""
    if len(pts) <= THIN_ABOVE:
        return pts
    xs = list(map(itemgetter(0), pts))
    if not all(map(le, xs, xs[1:])):
        return pts
    columns = map(int, map(mul, map(sub, xs, repeat(x0)), repeat(scale)))
    out: list[tuple[float, float]] = []
    point = y = itemgetter(1)  # of a (column, point) pair; of a point
    for _, group in groupby(zip(columns, pts), key=itemgetter(0)):
        column = list(map(point, group))  # the points of one pixel column
        if len(column) <= 4:
            out.extend(column)
            continue
        keep = {0, len(column) - 1, column.index(min(column, key=y)), column.index(max(column, key=y))}
        out.extend(column[i] for i in sorted(keep))
    return out


def thin_ordered(times: Sequence[float], steps: Sequence[int], t0: float, x0: float,
                 scale: float) -> list[tuple[float, int]]:
    """`thin` of the points (times[i] - t0, steps[i]) when neither column ever decreases, without
    making every point: each pixel column's stretch is found by bisection (the same column formula),
    and in a stretch that never decreases the lowest point is its first and the first highest is
    where its last value begins. The same list as `thin(list(points), x0, scale)`."""
    n = len(times)
    if n <= THIN_ABOVE:
        return list(zip(map(sub, times, repeat(t0)), steps))

    def column(t: float) -> int:
        return int(((t - t0) - x0) * scale)

    out: list[tuple[float, int]] = []
    i = 0
    while i < n:
        j = bisect_right(times, column(times[i]), lo=i, key=column)
        keep = range(i, j) if j - i <= 4 else sorted({i, j - 1, bisect_left(steps, steps[j - 1], i, j)})
        out.extend((times[k] - t0, steps[k]) for k in keep)
        i = j
    return out


def thin_xy(xs: Sequence[float], ys: Sequence[float], x0: float, scale: float) -> list[tuple[float, float]]:
    """`thin` of the points (xs[i], ys[i]) without making every point: when xs never decreases,
    each pixel column's stretch is found by bisection (the same column formula) and its lowest and
    highest points by C-level passes over a slice of ys. The same list as `thin(list(zip(xs, ys)), x0, scale)`."""
    n = len(xs)
    if n <= THIN_ABOVE or not all(map(le, xs, islice(xs, 1, None))):
        return list(zip(xs, ys))

    def column(x: float) -> int:
        return int((x - x0) * scale)

    out: list[tuple[float, float]] = []
    i = 0
    while i < n:
        j = bisect_right(xs, column(xs[i]), lo=i, key=column)
        if j - i <= 4:
            keep: Iterable[int] = range(i, j)
        else:
            part = ys[i:j]  # the first lowest and first highest, as min and max over the points pick them
            keep = sorted({i, j - 1, i + part.index(min(part)), i + part.index(max(part))})
        out.extend((xs[k], ys[k]) for k in keep)
        i = j
    return out


class _Series:
    """A line given as its xs and ys (a step -> loss mapping's keys and values), thinned without a
    tuple per point: a 16 M-event run's loss line has a million of them."""

    def __init__(self, points: dict[int, float]) -> None:
        self.xs, self.ys = list(points), list(points.values())

    def thinned(self, x0: float, scale: float) -> list[tuple[float, float]]:
        return thin_xy(self.xs, self.ys, x0, scale)


def svg_document(label: str, height: int, body: str, width: int = W) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="{escape(label)}" font-family="system-ui, sans-serif">'
            f"<title>{escape(label)}</title>{body}</svg>")


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.1e}"


# ----- the four plots -----------------------------------------------------------------------


def loss_svg(run_dir: Path, golden_dir: Path | None, data: RunEvents | None = None) -> str:
    run = lineage_losses(run_dir, data)
    golden = lineage_losses(golden_dir) if golden_dir is not None and Path(golden_dir).is_dir() else {}
    frame = Frame("loss per update: this run against the golden run",
                  (min(chain(run, golden), default=1), max(chain(run, golden), default=1)),
                  (min(chain(run.values(), golden.values()), default=0.0),
                   max(chain(run.values(), golden.values()), default=0.0)), "update (lineage step)", "loss")
    if golden:
        frame.polyline(_Series(golden), GOLDEN_COLOR, "golden run", dash="5 3")
    frame.polyline(_Series(run), RUN_COLOR, "this run")
    diverged = first_divergence(run, golden)
    if diverged is not None:
        frame.vline(diverged, BAD, f"diverges at step {diverged}")
    frame.legend([("this run", RUN_COLOR), ("golden", GOLDEN_COLOR)] + ([("divergence", BAD)] if diverged else []))
    verdict = "no golden run to compare" if not golden else (
        f"first diverges from the golden run at step {diverged}" if diverged
        else "matches the golden run at every step")
    return frame.svg(f"Loss per update; {verdict}")


def coverage_grid(run_dir: Path, data: RunEvents | None = None) -> tuple[list[tuple[int, int, list[int]]], int]:
    """[(step, epoch, ids)] for the lineage's updates (the last attempt to apply each step), and the dataset size."""
    spec = read_spec(Path(run_dir))
    size = int(spec.get("dataset_size") or (spec.get("config") or {}).get("dataset_size") or 0)
    grid = (data or RunEvents.read(run_dir)).grid()
    if isinstance(grid, ColumnGrid):  # a History's ids are integers
        bounds = grid.id_bounds()
        return grid, max(size, bounds[1] + 1) if bounds else size
    size = max([size] + [i + 1 for _, _, ids in grid for i in ids if isinstance(i, int)])
    return grid, size


def epoch_ends(grid: list[tuple[int, int, list[int]]], col: int, size: int, counts: dict[int, int]) -> bool:
    """Whether epoch `grid[col]`'s ends at this column: the next update is in another epoch, or this is
    the run's last update and its epoch left fewer unused ids than one update takes (the tail a
    drop_last sampler drops). A run that stops mid-epoch draws no end there."""
    epoch, ids = grid[col][1], grid[col][2]
    if col < len(grid) - 1:
        return grid[col + 1][1] != epoch
    return size - len(counts) < max(len(ids), 1)


def coverage_svg(run_dir: Path, data: RunEvents | None = None) -> str:
    grid, size = coverage_grid(run_dir, data)
    cell_w = max(4, min(24, (W - L - R) // max(len(grid) + 1, 1)))
    cell_h = max(2, min(6, 300 // max(size, 1)))
    height = T + size * cell_h + B
    parts = [f'<text x="{L}" y="18" font-size="13" font-weight="600" fill="{INK}">sample ids used per update</text>'
             f'<text x="{W - R}" y="18" font-size="10" text-anchor="end" fill="{MUTED}">red: seen twice in its epoch; '
             "amber: never used by a finished epoch</text>"]
    seen: dict[int, set[int]] = {}  # epoch -> the ids it used so far
    twice = never = 0
    epochs = grid.epochs if isinstance(grid, ColumnGrid) else [e for _, e, _ in grid]
    last_epoch = max(epochs, default=0)
    # Columns right of the plot's width are clipped by its viewBox: drawn, they would cost a mark per
    # sample id of a long run and show nothing. They are counted all the same (`_count_hidden`).
    shown = min(len(grid), -(-(W - L) // cell_w))
    for col in range(shown):
        step, epoch, ids = grid[col]
        counts = seen.setdefault(epoch, set())
        x = L + col * cell_w
        for i in ids:
            dup = i in counts
            counts.add(i)
            twice += dup
            parts.append(f'<rect x="{x}" y="{T + i * cell_h}" width="{cell_w - 1}" height="{cell_h}" '
                         f'fill="{BAD if dup else RUN_COLOR}"><title>step {step} epoch {epoch}: id {i}'
                         f'{" seen twice this epoch" if dup else ""}</title></rect>')
        if epoch_ends(grid, col, size, counts):
            missing = [i for i in range(size) if i not in counts] if epoch < last_epoch else []
            never += len(missing)
            parts.extend(f'<rect x="{x + cell_w}" y="{T + i * cell_h}" width="3" height="{cell_h}" fill="{WARN}">'
                         f"<title>epoch {epoch} ended without id {i}</title></rect>" for i in missing)
            parts.append(f'<line x1="{x + cell_w - 0.5}" y1="{T}" x2="{x + cell_w - 0.5}" y2="{T + size * cell_h}" '
                         f'stroke="{INK}" stroke-width="1"><title>end of epoch {epoch}</title></line>')
    hidden_twice, hidden_never = _count_hidden(grid, epochs, shown, size, seen)
    twice, never = twice + hidden_twice, never + hidden_never
    bottom = T + size * cell_h
    parts.append(f'<text x="{L - 4}" y="{T + 8}" font-size="10" text-anchor="end" fill="{MUTED}">id 0</text>'
                 f'<text x="{L - 4}" y="{bottom}" font-size="10" text-anchor="end" fill="{MUTED}">id {size - 1}</text>'
                 f'<text x="{L}" y="{bottom + 15}" font-size="10" fill="{MUTED}">updates {grid[0][0] if grid else "-"}'
                 f'–{grid[-1][0] if grid else "-"}, one column each; black lines end an epoch</text>'
                 f'<text x="{L}" y="{bottom + 29}" font-size="11" fill="{BAD if twice or never else OK}">'
                 f"{twice} use(s) of an id already seen in its epoch; {never} id(s) a finished epoch never used</text>")
    return svg_document(f"Sample coverage: {twice} repeated use(s), {never} id(s) never used", height, "".join(parts))


def _count_hidden(grid: Sequence[tuple[int, int, list[int]]], epochs: list[int], shown: int, size: int,
                  seen: dict[int, set[int]]) -> tuple[int, int]:
    """(uses of an id already seen in its epoch, ids a finished epoch never used) over the columns
    from `shown` on, as coverage_svg's loop counts them, a stretch of one epoch at a time: every use
    that adds no new id to the epoch's set is a repeat, and an epoch can only end where the
    next column's epoch differs, or at the last column. An epoch's counts are let go after its
    last column: a long run's epochs would otherwise hold a count per id each."""
    twice = never = 0
    last_epoch = max(epochs, default=0)
    last_col = dict(zip(epochs, range(len(epochs))))  # epoch -> its last column
    bounds = grid.id_bounds() if isinstance(grid, ColumnGrid) else None  # integers by construction
    within = bounds is not None and bounds[0] >= 0 and bounds[1] < size
    col = shown
    for epoch, group in groupby(epochs[shown:]):
        end = col + sum(1 for _ in group)
        counts = seen.setdefault(epoch, set())
        before = len(counts)
        if isinstance(grid, ColumnGrid):
            ranges = list(grid.ranges(col, end))
            used = sum(j - i for _, i, j in ranges)
            counts = seen[epoch] = _with_ids(counts, ranges)
        else:
            used = 0
            for ids in (g[2] for g in grid[col:end]):
                counts.update(ids)
                used += len(ids)
        twice += used - (len(counts) - before)
        if epoch < last_epoch and epoch_ends(grid, end - 1, size, counts):
            never += size - len(counts) if within else _unused(counts, size)
        if last_col[epoch] < end:
            del seen[epoch]
        col = end
    return twice, never


def _with_ids(counts: Any, ranges: list[tuple[Any, int, int]]) -> Any:
    """`counts` (an epoch's distinct ids so far: a set, or a sorted numpy array) with the ids of
    `ranges` added: in numpy when they are many (invariants/vectors.py), else as a set."""
    prior: list[tuple[Any, int, int]] | None
    if not len(counts):
        prior = []
    elif isinstance(counts, set):
        try:
            prior = [(array("q", counts), 0, len(counts))]
        except (OverflowError, TypeError):  # past 64 bits, or not integers: sets it is
            prior = None
    else:
        prior = [(counts, 0, len(counts))]
    merged = vectors.distinct(prior + ranges) if prior is not None else None
    if merged is not None:
        return merged
    out = counts if isinstance(counts, set) else set(counts.tolist())
    for column, i, j in ranges:
        out.update(column[i:j])
    return out


def _unused(counts: Any, size: int) -> int:
    """How many of the ids 0..size-1 `counts` lacks: by its bounds when every id is an int within them."""
    if not isinstance(counts, set):  # a sorted numpy array of distinct ids (_with_ids)
        return size - vectors.count_within(counts, 0, size)
    if counts and set(map(type, counts)) == {int} and min(counts) >= 0 and max(counts) < size:
        return size - len(counts)
    return sum(1 for i in range(size) if i not in counts)


def progress_svg(run_dir: Path, data: RunEvents | None = None) -> str:
    ev = data or RunEvents.read(run_dir)
    lanes = ev.lanes()
    t_end = max([pts.x_max() for pts in lanes.values() if pts] + [h["t"] - ev.t0 for h in ev.hangs] + [0.001])
    top = max([pts.y_max() for pts in lanes.values() if pts] + [1])
    frame = Frame("forward progress: the newest update each rank applied, over time", (0, t_end), (0, top),
                  "seconds since the run started", "update")
    for (attempt, rank), pts in sorted(lanes.items()):
        # Ranks in step draw on top of each other: lower ranks wider, so every rank stays visible.
        frame.polyline(pts.sorted(), RANK_COLORS[rank % len(RANK_COLORS)], f"attempt {attempt} rank {rank}", step=True,
                       width=max(1.2, 4.5 - 1.5 * rank))
    for f in ev.faults:
        frame.vline(f["t"] - ev.t0, WARN, f"fault {f.get('fault_id', '?')}")
    for h in ev.hangs:
        frame.vline(h["t"] - ev.t0, BAD, f"hang declared: rank(s) {','.join(map(str, h.get('ranks', [])))}")
    ranks = sorted({r for _, r in lanes})
    frame.legend([(f"rank {r}", RANK_COLORS[r % len(RANK_COLORS)]) for r in ranks[:6]])
    return frame.svg(f"Forward progress of {len(ranks)} rank(s) over {t_end:.2f} s; {len(ev.hangs)} hang(s) declared")


def ckpt_age_svg(run_dir: Path, data: RunEvents | None = None) -> str:
    """Seconds since the state of the newest committed save was taken, sampled at every event; a
    drop is a commit (to the save's own length: report/metrics.py `held_since`)."""
    ev = data or RunEvents.read(run_dir)
    every = chain(ev.step_times(), (e["t"] for e in ev.saves + ev.hangs + ev.faults))
    # Distinct before rounding as well: round(x, 6) costs about 0.6 µs, and ranks in step often
    # share a time (8 ranks' 800 000 step times held 102 000 distinct values in the benchmark's run).
    times = sorted(set(map(round, set(map(sub, every, repeat(ev.t0))), repeat(6))))
    saves = sorted((s["t"] - ev.t0, held_since({**s, "t_s": s["t"] - ev.t0})) for s in ev.saves)
    # No save yet: the age is the run's age (a restart would redo everything). Each save counts from
    # the first sample at or after its commit; between two commits the newest state's time holds,
    # so a stretch of samples is made at once.
    points: list[tuple[float, float]] = []
    last, at = 0.0, 0
    for commit, since in saves:  # in commit order
        upto = bisect_left(times, commit, lo=at)
        points.extend(zip(times[at:upto], map(sub, times[at:upto], repeat(last))))
        last, at = max(last, since), upto
    points.extend(zip(times[at:], map(sub, times[at:], repeat(last))))
    peak = max([a for _, a in points] + [0.001])
    frame = Frame("checkpoint age: seconds since the newest committed save's state was taken", (0, times[-1] if times else 1),
                  (0, peak), "seconds since the run started", "age (s)")
    if points:
        frame.polyline(points, WARN, "checkpoint age")
    for s in ev.saves:
        frame.parts.append(f'<circle cx="{frame.x(s["t"] - ev.t0)}" cy="{frame.y(0)}" r="3" fill="{OK}">'
                           f'<title>save of step {s.get("step")} ({s.get("checkpoint")})</title></circle>')
    frame.legend([("age", WARN), ("save", OK)])
    return frame.svg(f"Checkpoint age over time; {len(ev.saves)} save(s); oldest {peak:.3f} s")


PLOTS = {"loss": loss_svg, "coverage": coverage_svg, "progress": progress_svg, "ckpt_age": ckpt_age_svg}
"""Plot name -> function; loss takes the golden run's directory as well."""


def write_plots(run_dir: Path, golden_dir: Path | None, names: Iterable[str] = PLOTS) -> dict[str, Path]:
    """Write RUN_DIR/report/NAME.svg for each plot (beside report.html); name -> path."""
    out = RunDir(Path(run_dir)).report
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in names:
        svg = loss_svg(run_dir, golden_dir) if name == "loss" else PLOTS[name](run_dir)
        path = out / f"{name}.svg"
        path.write_text(svg, encoding="utf-8")
        written[name] = path
    return written
