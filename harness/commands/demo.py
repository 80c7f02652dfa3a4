"""trainwreck demo [--out DIR]: a short chaos run over built-in scenarios, ending in a casebook.

Each scenario runs under its faults, is judged against its cached golden run (the first
demo on a machine builds those too), gets a report, and the casebook indexes them all.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from trainwreck.report import NotARun, render_casebook, render_report
from trainwreck.invariants.verdict import compose, exit_code, verdict_word, word_validity
from trainwreck.harness.judge.cache_dir import usable_cache_dir
from trainwreck.harness.supervise.interrupts import deferred
from trainwreck.harness.supervise.scenarios import get_scenario, scenario_names
from trainwreck.rundir.layout import RunDir

DEMO_SCENARIOS = ("kill-resume", "hang-detect", "shrink-world", "sigterm-rank0", "corrupt-newest", "straggler")
"""The demo's fixed cases once the table grows: a kill, a hang, a world-size change, the writer's death,
a damaged newest checkpoint and a straggler: between them, every interview question a report answers."""
RUN_ALL_BELOW = 8
"""With fewer built-in scenarios than this, the demo runs them all (about 10 s each on 2 cores)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="casebook directory (default: ./trainwreck-out/demo-TIMESTAMP)")
    parser.add_argument("--scenarios", help="comma-separated scenario names instead of the demo's own list")


def demo_names() -> list[str]:
    names = scenario_names()
    if len(names) < RUN_ALL_BELOW:
        return names
    chosen = [n for n in DEMO_SCENARIOS if n in names]
    return chosen if len(chosen) >= 4 else names[:6]


def main(args: argparse.Namespace) -> int:
    names = args.scenarios.split(",") if args.scenarios else demo_names()
    for name in names:
        get_scenario(name)  # an unknown name fails here (an InputError), before anything runs
    usable_cache_dir()
    out = args.out or Path("trainwreck-out") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_demo(names, out)


def run_demo(names: list[str], out: Path) -> int:
    with deferred():  # before the progress line's thread, which would make the fork unsafe
        from trainwreck.harness.launch.launchers import fork_server_from_here
        fork_server_from_here()
    progress = ProgressLine(len(names), sys.stdout)
    print(f"trainwreck demo: {len(names)} scenarios → {out}", flush=True)
    started, run_dirs, words = time.monotonic(), [], []
    try:
        for i, name in enumerate(names):
            run_dir = out / "runs" / f"{i + 1:02d}-{name}"
            progress.begin(i, name)
            word, detail = run_one(name, run_dir)
            progress.end(i, name, word, detail)
            if RunDir(run_dir).run_json.exists():
                run_dirs.append(run_dir)
            words.append(word)
    except KeyboardInterrupt:
        progress.stop()
        print("\ninterrupted: the casebook holds the runs that finished", flush=True)
        words.append("UNKNOWN")
    index = render_casebook(out, run_dirs, f"trainwreck demo ({len(run_dirs)} runs)")
    overall = verdict_word(compose(word_validity(word) for word in words))
    print(f"\n{overall}: {words.count('VALID')}/{len(words)} runs valid in {time.monotonic() - started:.0f} s")
    print(f"casebook: {index}")
    print(f"          {index.with_name('index.md')}")
    return exit_code(word_validity(overall))


def run_one(name: str, run_dir: Path) -> tuple[str, str]:
    """Run and judge one scenario; (verdict, where its report is). A crash of the harness is UNKNOWN."""
    # Imported here: the harness pulls in the fork server and torch's launch machinery.
    from trainwreck.harness.judge.runner import run_judged, spec_for

    try:
        judged = run_judged(spec_for(get_scenario(name), run_dir), name)
    except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others
        return "UNKNOWN", f"the harness failed: {type(exc).__name__}: {exc}"
    html = RunDir(run_dir).report_file("report.html")
    if not html.exists():  # the runner renders it; this covers a runner without the hook
        try:
            html = render_report(run_dir)
        except NotARun as exc:
            return verdict_word(judged.judgement.valid), f"no report: {exc}"
    record = judged.record
    cause = f"\n      root cause: {judged.root_cause.sentence()}" if judged.root_cause else ""
    return (verdict_word(judged.judgement.valid),
            f"{record.outcome} after {record.attempts} attempt(s), {record.wall_s:.1f} s → {html}{cause}")


class ProgressLine:
    """A bar redrawn in place in a terminal; one plain line per event anywhere else (CI logs, pipes)."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.stream = total, stream
        self.tty = stream.isatty()
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    def begin(self, i: int, name: str) -> None:
        if not self.tty:
            print(f"[{i + 1}/{self.total}] {name}: {get_scenario(name).summary}", file=self.stream, flush=True)
            return
        self._stop.clear()
        t0 = time.monotonic()
        # The run itself must stay on the main thread (parent-death signals follow the thread
        # that started the ranks), so only the redrawing happens here.
        self._ticker = threading.Thread(target=self._tick, args=(i, name, t0), daemon=True)
        self._ticker.start()

    def _tick(self, i: int, name: str, t0: float) -> None:
        while not self._stop.wait(0.25):
            self._draw(i, f"{name} ({time.monotonic() - t0:.0f} s)")

    def _draw(self, done: int, label: str) -> None:
        width = 24
        filled = width * done // max(self.total, 1)
        bar = "█" * filled + "░" * (width - filled)
        self.stream.write(f"\r\x1b[2K[{bar}] {done}/{self.total} {label}")
        self.stream.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None

    def end(self, i: int, name: str, word: str, detail: str) -> None:
        self.stop()
        if self.tty:
            self.stream.write("\r\x1b[2K")
        print(f"[{i + 1}/{self.total}] {word:<8} {name}: {detail}", file=self.stream, flush=True)
        if self.tty and i + 1 < self.total:
            self._draw(i + 1, "")
