"""Where each target stands: the targets, what a run records about itself, and the table of runs.

`python -m trainwreck.benchmarks --table RUN.json [RUN.json ...]` renders, from the `--out` or
`--json` files of runs already made, one Markdown table of the runs (when, which commit, the load
and the machine's speed as each run began and ended) and one of the targets (each run's figure,
judged against the targets as they stand now, and in how many runs it was met). Issue 38 is done
when three consecutive quiet runs meet every target: the table is read from those runs' own files,
so a figure in the docs is the one a run wrote. Nothing here imports torch.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from trainwreck.rundir.files import SMALL_LIMIT, read_bytes

TARGETS: dict[str, tuple[str, float]] = {
    "launch_warm_s_4": ("<=", 0.5),
    "launch_speedup_vs_torchrun_4": (">=", 20.0),
    "instrumentation_overhead_pct": ("<=", 3.0),
    "instrumentation_direct_pct": ("<=", 3.0),
    "atomic_save_ratio_100mb": ("<=", 1.3),
    "atomic_save_ratio_vs_fsynced_100mb": ("<=", 1.1),
    "atomic_save_ratio_vs_fsynced_1gb": ("<=", 1.1),
    "verified_load_ratio_100mb": ("<=", 1.2),
    "async_stall_ratio_100mb": ("<=", 0.05),
    "async_stall_ratio_1gb": ("<=", 0.05),  # issue 38, item 3
    "checker_events_per_s": (">=", 2_000_000),  # issue 38, item 5 (1 M the round before)
    "report_s_1_6m": ("<=", 5.0),  # `trainwreck report` of the checker's 1.6 M-event run, start-up included
    "report_s_16m": ("<=", 60.0),
    "report_peak_rss_mb_16m": ("<=", 512),
    "checker_peak_rss_mb_16m": ("<=", 512),
    "checker_rss_growth_doubled": ("<=", 1.1),  # twice the events, columns on disk: memory bounded
    "launch_warm_s_16": ("<=", 1.0),
    "hang_latency_max_s_16": ("<=", 1.2),  # timeout 1.0 s + 0.2 s
    "scenarios_per_min": (">=", 500),  # issue 38, item 4 (150 the round before)
    "cmd_warm_speedup": (">=", 5.0),  # issue 38: --cmd kill-and-resume, cold over forked-warm ranks
    "gpu_async_stall_of_step_1gb": ("<=", 0.05),  # on a GPU host only; "n/a" elsewhere
}
"""Every target a run is judged by: the `--json` key, its comparison and its bound."""

PROBE_REPEATS = 5


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def met(value: Any, op: str, bound: float) -> bool | None:
    """Whether a figure meets its bound; None when the run has no figure for it (a GPU target on
    a CPU host, a section left out or failed)."""
    if not _number(value):
        return None
    return value <= bound if op == "<=" else value >= bound


def speed_probe_ms(clock: Callable[[], float] = time.perf_counter) -> float:
    """The machine's speed as a run begins or ends: the best of five timings of
    `sum(range(10**6))`, in ms. Load average counts runnable processes; this sees what a
    process of ours actually gets (another tenant's work on shared cores, a slow host)."""
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        started = clock()
        sum(range(10**6))
        best = min(best, clock() - started)
    return round(best * 1000, 1)


def source_commit(folder: Path = Path(__file__).resolve().parent) -> tuple[str | None, bool | None]:
    """(the commit of the checkout this code runs from, whether its tracked files differ from it);
    (None, None) for an installed wheel (this file untracked, even in a venv inside some checkout),
    or where git is missing or answers nothing in 10 s."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)

    try:
        if git("ls-files", "--error-unmatch", "--", Path(__file__).name).returncode != 0:
            return None, None
        head, changed = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if head.returncode != 0:
        return None, None
    return head.stdout.strip(), bool(changed.stdout.strip()) if changed.returncode == 0 else None


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_begins() -> dict[str, Any]:
    """What a run records about itself as it begins (results["run"])."""
    commit, dirty = source_commit()
    return {"started_utc": now_utc(), "commit": commit, "dirty": dirty,
            "load_average_start": [round(x, 2) for x in os.getloadavg()], "speed_probe_ms_start": speed_probe_ms()}


def run_ends(run: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """The same record as the run ends: when, the load, the speed probe again and the wall time."""
    return {**run, "finished_utc": now_utc(), "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "speed_probe_ms_end": speed_probe_ms(), "wall_s": round(wall_s, 1)}


def judged(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """results["targets"]: each target's bound, the run's figure and whether it met it."""
    return {key: {"target": f"{op} {bound:g}", "measured": results.get(key), "met": met(results.get(key), op, bound)}
            for key, (op, bound) in TARGETS.items()}


class NotARun(ValueError):
    """A file given to --table that is not a benchmarks run; the message names the file and the fix."""


def load_run(path: Path) -> dict[str, Any]:
    """One run's figures from its --out/--json file; NotARun naming the file and what is wrong."""
    try:  # a run's file is tens of KB: a FIFO, a device or a huge file is refused, never waited on
        figures = json.loads(read_bytes(Path(path).resolve(), SMALL_LIMIT))
    except OSError as exc:
        raise NotARun(f"--table {path}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise NotARun(f"--table {path}: not JSON ({exc}); pass a file that "
                      "`python -m trainwreck.benchmarks --out FILE` or `--json` wrote") from None
    if not isinstance(figures, dict) or not isinstance(figures.get("targets"), dict):
        raise NotARun(f"--table {path}: no \"targets\" object, so not a benchmarks run; pass a file that "
                      "`python -m trainwreck.benchmarks --out FILE` or `--json` wrote")
    return figures


def _figure(value: Any) -> str:
    if not _number(value):
        return "—"
    return f"{value:,}".replace(",", " ") if isinstance(value, int) or abs(value) >= 1000 else f"{value:g}"


def _when(run: dict[str, Any]) -> str:
    started = run.get("started_utc")
    return started.replace("T", " ")[:16] if isinstance(started, str) else "not recorded"


def _start_end(start: Any, end: Any, between: str) -> str:
    """A reading taken as a run began and as it ended; the start alone when the end is missing."""
    if not _number(start):
        return "not recorded"
    return f"{start:g}{between}{end:g}" if _number(end) else f"{start:g}"


def _load(run: dict[str, Any]) -> str:
    start, end = (value[0] if isinstance(value, list) and value else None
                  for value in (run.get("load_average_start"), run.get("load_average_end")))
    return _start_end(start, end, " → ")


def _probe(run: dict[str, Any]) -> str:
    return _start_end(run.get("speed_probe_ms_start"), run.get("speed_probe_ms_end"), " / ")


def _commit(run: dict[str, Any]) -> str:
    commit = run.get("commit")
    if not isinstance(commit, str):
        return "not recorded"
    return f"{commit[:7]}{' (with uncommitted changes)' if run.get('dirty') else ''}"


def _wall(run: dict[str, Any]) -> str:
    wall = run.get("wall_s")
    return f"{int(wall // 60)} min {int(wall % 60):02d} s" if _number(wall) else "not recorded"


def render(runs: list[dict[str, Any]]) -> tuple[str, bool]:
    """(the two Markdown tables, whether every target was met in every run that measured it and
    every run measured it; a target no run measured, a GPU one on a CPU host, is listed apart)."""
    lines = ["| run | started (UTC) | commit | wall | load average, 1 min: start → end | speed probe, ms: start / end |",
             "|---|---|---|---|---|---|"]
    for number, figures in enumerate(runs, 1):
        run = figures.get("run") if isinstance(figures.get("run"), dict) else {}
        lines.append(f"| {number} | {_when(run)} | {_commit(run)} | {_wall(run)} | {_load(run)} | {_probe(run)} |")
    lines += ["", f"| target (`--json` key) | bound | run {' / '.join(str(n) for n in range(1, len(runs) + 1))} | met |",
              "|---|---|---|---|"]
    done, unmeasured = True, []
    for key, (op, bound) in TARGETS.items():
        values = [figures.get(key) for figures in runs]
        verdicts = [met(value, op, bound) for value in values]
        if all(verdict is None for verdict in verdicts):
            unmeasured.append(f"`{key}`")
            continue
        count = sum(verdict is True for verdict in verdicts)
        done = done and count == len(runs)
        lines.append(f"| `{key}` | {op} {_figure(bound)} | {' / '.join(map(_figure, values))} | {count} of {len(runs)} |")
    if unmeasured:
        lines += ["", f"Measured by none of these runs: {', '.join(unmeasured)}."]
    return "\n".join(lines) + "\n", done
