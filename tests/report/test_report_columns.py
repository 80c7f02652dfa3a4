"""The report takes its lanes, sample counts and plots from the checker's columns (load_history(report=True)),
not from a second parse of the events: it must say exactly what reading the events says, read no batch or
step line again, and keep a long run's pictures to what the plot can show."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from trainwreck.benchmarks.checker import bench_report, write_run
from trainwreck.report import rawlog
from trainwreck.report.html import render_html
from trainwreck.report.model import build_report_and_plots
from trainwreck.report.plots import THIN_ABOVE, ColumnGrid, RunEvents, coverage_grid, coverage_svg, thin, thin_ordered, thin_xy
from trainwreck.rundir import layout
from tests.report.rundirs import clean_run, duplicated_sample_run, hung_run, killed_run


def _synthetic(root: Path) -> Path:
    write_run(str(root), steps=120, ranks=3, batch_per_rank=2, save_every=10)  # a kill and a resume
    return root


def _torn(root: Path) -> Path:
    run = killed_run(root)
    last = sorted((run / "events").glob("a001-r001-*.jsonl"))[0]
    with open(last, "a") as f:
        f.write('{"kind":"step","t":2000.5,"attempt":1,"rank":1,"wor')  # a kill mid-line
    return run


STORIES: dict[str, Callable[[Path], Path]] = {
    "clean": clean_run, "duplicated": duplicated_sample_run, "killed": killed_run, "hung": hung_run,
    "synthetic": _synthetic, "torn": _torn,
}


def _both_ways(run: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[str, str], tuple[str, str]]:
    """(report.json text, HTML) built from the columns, then from the events (the lanes read again)."""
    report, plots = build_report_and_plots(run)
    assert plots is not None, "the report did not take its lanes from the columns"
    from_columns = json.dumps(report, default=str), render_html(report, plots)
    with monkeypatch.context() as patch:
        patch.setattr(rawlog, "_lanes_agree", lambda history: False)
        report, plots = build_report_and_plots(run)
    assert plots is None
    return from_columns, (json.dumps(report, default=str), render_html(report, plots))


@pytest.mark.parametrize("vector_min", [None, 0], ids=["default", "numpy-everywhere"])
@pytest.mark.parametrize("story", sorted(STORIES))
def test_a_report_from_the_checker_columns_says_exactly_what_one_from_the_events_says(
        story: str, vector_min: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from trainwreck.invariants import vectors
    if vector_min is not None:  # the columns' plots through numpy's passes however short (vectors.py)
        monkeypatch.setattr(vectors, "VECTOR_MIN", vector_min)
    run = STORIES[story](tmp_path / story)
    (columns_json, columns_html), (events_json, events_html) = _both_ways(run, monkeypatch)
    assert columns_json == events_json
    assert columns_html == events_html
    if story == "torn":
        assert "skipped 1 line(s)" in columns_json  # the torn last step line is still noted


def test_a_report_from_columns_on_disk_says_exactly_what_one_from_memory_says(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch):
    from trainwreck.invariants import spill

    run = _synthetic(tmp_path / "run")
    report, plots = build_report_and_plots(run)
    in_memory = json.dumps(report, default=str), render_html(report, plots)
    monkeypatch.setattr(spill, "SPILL_MIN_BYTES", 0)
    report, plots = build_report_and_plots(run)
    assert all(isinstance(log.times, spill.DiskNumbers) for log in plots.history.logs.values())
    raw = rawlog.read_raw(run, batches=False, history=plots.history)
    lanes = [lane for lane in raw.lanes.values() if len(lane.steps)]
    assert lanes and all(isinstance(column, spill.DiskNumbers)  # the lanes read the columns, not copies of them
                         for lane in lanes for column in (lane.steps, lane.times, lane.losses))
    assert (json.dumps(report, default=str), render_html(report, plots)) == in_memory


def test_a_report_reads_no_batch_or_step_line_a_second_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    run = killed_run(tmp_path / "killed")
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the report read the events files again")
    monkeypatch.setattr(rawlog, "read_events", refuse)
    monkeypatch.setattr(layout, "read_events", refuse)
    report, plots = build_report_and_plots(run)
    assert report["valid"] is True and report["attempts"][1]["lanes"][0]["ranges"] == [[5, 8]]
    html = render_html(report, plots)
    for label in ("Loss per update", "Sample coverage", "Forward progress", "Checkpoint age"):
        assert f'aria-label="{label}' in html  # every plot drawn (a plot that raises is left out)


def test_a_line_of_more_points_than_pixels_keeps_each_pixel_columns_extremes_and_ends():
    pts = [(i / 1000, (i * 7919) % 1009) for i in range(50_000)]
    scale = 568 / 50  # pixels per unit of x
    kept = thin(pts, 0.0, scale)
    assert len(kept) <= 4 * 568 + 4 and kept[0] == pts[0] and kept[-1] == pts[-1]
    assert kept == sorted(kept)  # still in the line's order
    columns: dict[int, list[float]] = {}
    for x, y in pts:
        columns.setdefault(int(x * scale), []).append(y)
    left: dict[int, list[float]] = {}
    for x, y in kept:
        left.setdefault(int(x * scale), []).append(y)
    assert {c: (min(v), max(v)) for c, v in columns.items()} == {c: (min(v), max(v)) for c, v in left.items()}
    short = pts[:THIN_ABOVE]
    assert thin(short, 0.0, scale) is short  # a line that fits is drawn as it is


@pytest.mark.parametrize("seed", range(6))
def test_a_line_that_never_goes_down_is_thinned_by_bisection_to_the_same_points(seed: int):
    import random

    rng = random.Random(seed)
    n = THIN_ABOVE * (1 + seed) + rng.randrange(100)  # above the threshold: thinned
    times, steps, t, step = [], [], 1000.0, 0
    for _ in range(n):  # plateaus, equal times, bursts and gaps: every shape a pixel column can get
        t += rng.choice([0.0, 0.0001, 0.003, 0.05, rng.random()])
        step += rng.choice([0, 0, 1, 1, 2, 50])
        times.append(t)
        steps.append(step)
    t0, x0 = 999.5, 0.0
    scale = (640 - 72) / (times[-1] - t0)
    points = [(a - t0, b) for a, b in zip(times, steps)]
    assert thin_ordered(times, steps, t0, x0, scale) == thin(points, x0, scale)
    assert thin_ordered(times[:50], steps[:50], t0, x0, scale) == points[:50]  # a short line as it is


@pytest.mark.parametrize("seed", range(6))
def test_a_line_given_as_xs_and_ys_is_thinned_to_the_points_thin_keeps(seed: int):
    import random

    rng = random.Random(seed)
    n = THIN_ABOVE * (1 + seed) + rng.randrange(100)
    xs, x = [], 0
    for _ in range(n):  # repeated xs, gaps and bursts; ys that rise, fall, repeat and tie
        x += rng.choice([0, 0, 1, 1, 3, 40])
        xs.append(x)
    ys = [rng.choice([0.5, 1.0, 1.0, rng.random(), -rng.random()]) for _ in range(n)]
    scale = (640 - 72) / (xs[-1] + 1)
    assert thin_xy(xs, ys, 0.0, scale) == thin(list(zip(xs, ys)), 0.0, scale)
    shuffled = xs[::-1]  # not ordered by x: drawn as it is, as thin leaves it
    assert thin_xy(shuffled, ys, 0.0, scale) == thin(list(zip(shuffled, ys)), 0.0, scale) == list(zip(shuffled, ys))


def _reference_counts(grid: list[tuple[int, int, list[int]]], size: int) -> tuple[int, int]:
    """coverage_svg's counts, one id at a time over every column, as the plot counted them before."""
    from trainwreck.report.plots import epoch_ends
    seen: dict[int, dict[int, int]] = {}
    twice = never = 0
    last_epoch = max((e for _, e, _ in grid), default=0)
    for col, (_, epoch, ids) in enumerate(grid):
        counts = seen.setdefault(epoch, {})
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
            twice += counts[i] > 1
        if epoch_ends(grid, col, size, counts) and epoch < last_epoch:
            never += sum(1 for i in range(size) if i not in counts)
    return twice, never


@pytest.mark.parametrize("vector_min", [0, 1 << 62], ids=["numpy", "sets"])
def test_a_coverage_plot_wider_than_its_viewbox_draws_what_shows_and_counts_every_column(
        tmp_path: Path, monkeypatch, vector_min: int):
    from trainwreck.invariants import vectors
    monkeypatch.setattr(vectors, "VECTOR_MIN", vector_min)  # the counts through numpy's passes or through sets
    run = tmp_path / "long"
    write_run(str(run), steps=1500, ranks=2, batch_per_rank=2, save_every=100)  # 1000 updates an epoch
    # A repeated and a missing id in a column far past the visible ones: rank 1 reuses update 1400's ids at 1401.
    rank1 = sorted((run / "events").glob("a001-r001-*.jsonl"))[0]
    lines = rank1.read_text().splitlines()
    batches = {json.loads(line)["step"]: i for i, line in enumerate(lines) if '"kind": "batch"' in line}
    reused = json.loads(lines[batches[1400]])["samples"]
    bad = json.loads(lines[batches[1401]])
    bad["samples"] = reused
    lines[batches[1401]] = json.dumps(bad)
    rank1.write_text("\n".join(lines) + "\n")
    from trainwreck.invariants import load_history
    history = load_history(run, report=True)
    events_grid, size = coverage_grid(run, RunEvents.read(run))
    columns_grid, columns_size = coverage_grid(run, _columns(run, history))
    assert isinstance(columns_grid, ColumnGrid) and size == columns_size
    assert [columns_grid[c] for c in range(len(columns_grid))] == events_grid
    twice, never = _reference_counts(events_grid, size)
    assert twice == 2  # the reused ids, counted though their column is never drawn
    svg = coverage_svg(run, RunEvents.read(run))
    assert f"Sample coverage: {twice} repeated use(s), {never} id(s) never used" in svg
    assert svg == coverage_svg(run, _columns(run, history))
    drawn = Counter(part.split('"')[0] for part in svg.split('<rect x="')[1:])
    assert max(map(int, drawn)) < 640  # no mark right of the plot's width
    assert sum(drawn.values()) < 200 * 4 + 10  # the columns that show, not 1500


def _columns(run: Path, history: Any) -> Any:
    from trainwreck.report.plots import Columns
    raw = rawlog.read_raw(run, batches=False, history=history)
    assert raw.columns
    return Columns.of(raw, history)


def test_bench_report_reports_the_time_memory_and_size_of_one_report():
    result = bench_report(steps=200, ranks=2, batch_per_rank=2, suffix="tiny")
    assert set(result) == {f"report_{key}_tiny" for key in
                           ("events", "s", "cpu_s", "peak_rss_mb", "worker_peak_rss_mb", "html_mb")}
    assert result["report_events_tiny"] > 800 and result["report_s_tiny"] > 0 and result["report_peak_rss_mb_tiny"] > 0


def test_the_benchmarks_run_the_report_sections_and_hold_them_to_their_targets():
    from trainwreck.benchmarks.__main__ import TARGETS, sections
    names = [name for name, _ in sections(quick=True)]
    assert "report" in names and "report_16m" in names
    assert TARGETS["report_s_1_6m"] == ("<=", 5.0) and TARGETS["report_s_16m"] == ("<=", 60.0)
    assert TARGETS["report_peak_rss_mb_16m"] == ("<=", 512)


@pytest.mark.parametrize("seed", range(4))
def test_a_grid_built_from_runs_of_updates_is_the_grid_built_from_sets(monkeypatch: pytest.MonkeyPatch, seed: int):
    """ColumnGrid's two ways, on random attempts: each a run of updates (nested, overlapping, apart)
    reported by one to three ranks, some with a gap, a repeat or another rank's epochs."""
    import random
    from array import array

    from trainwreck.invariants.history import History, RankLog

    rng = random.Random(seed)
    taken: list[bool] = []
    from_runs = ColumnGrid._from_runs
    monkeypatch.setattr(ColumnGrid, "_from_runs", lambda self: taken.append(from_runs(self)) or taken[-1])
    for _ in range(40):
        history = History(run_dir="x", spec={})
        for attempt in range(rng.randint(1, 5)):
            first = rng.randint(1, 60)
            steps = array("q", range(first, first + rng.randint(1, 40)))
            for rank in range(rng.randint(1, 3)):
                mine = steps if rank == 0 or rng.random() < 0.7 else array("q", steps)
                if rng.random() < 0.1:  # a gap or a repeated update: not one run
                    mine = array("q", [s for s in steps if s != steps[len(steps) // 2]] if rng.random() < 0.5
                                 else list(steps) + [steps[-1]])
                epochs = array("q", [s // 17 + (rank if rng.random() < 0.2 else 0) for s in mine])
                history.logs[(attempt, rank)] = RankLog(attempt, rank, 3, batch_steps=mine, epochs=epochs)
        fast = ColumnGrid(history)
        with monkeypatch.context() as patch:
            patch.setattr(ColumnGrid, "_from_runs", lambda self: False)
            slow = ColumnGrid(history)
        assert (fast.steps, fast.epochs, fast.segments) == (slow.steps, slow.epochs, slow.segments)
    assert any(taken) and not all(taken), "both ways should have been compared"


@pytest.mark.parametrize("seed", range(6))
def test_losses_taken_a_lane_per_attempt_are_the_rows_latest_losses(seed: int):
    """lanes_losses (the columns' and the report model's way) against latest_losses over the same rows:
    the last attempt to report a number for a step wins, and of one attempt its last row."""
    import random

    from trainwreck.report.plots import lanes_losses, latest_losses

    rng = random.Random(seed)
    lanes = []
    for attempt in rng.sample(range(8), rng.randint(1, 5)):  # attempts in any order
        steps = sorted(rng.choices(range(1, 40), k=rng.randint(0, 30)))  # repeats: a step reported twice
        losses = [rng.choice([None, rng.random(), rng.randint(0, 3), True]) for _ in steps]
        lanes.append((attempt, steps, losses))
    rows = [(step, attempt, loss) for attempt, steps, losses in lanes for step, loss in zip(steps, losses)]
    assert list(lanes_losses(lanes).items()) == list(latest_losses(rows).items())
