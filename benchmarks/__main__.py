"""python -m trainwreck.benchmarks: every performance figure, measured in one run; --table: where each target stands.

Figures are ratios or latencies taken in the same process on the same machine, so
they can be compared across machines; absolute seconds are reported for context.
`--quick` trims repeats: 6 minutes on a quiet 2-core machine, 12-17 on a slow one; it measures every size, 1 GB included.
Each section's figures are printed (stderr) as it finishes and, with `--out`, written to FILE
then: a section that fails is recorded under "failed" and the others still run, so a crash
loses one section, not the run (exit 1 when any failed). The CPU figures run on the CPU on a
GPU host too; the `gpu` section measures CUDA-resident checkpoints and nccl hangs where a GPU
exists (benchmarks/gpu.py) and says it skipped elsewhere. `--only fsdp,gpu` runs those sections
alone (a GPU host's check, `.ci/gpu`); the targets of the sections left out read "n/a".
Each run records when it ran, from which commit, and the load and the machine's speed as it began
and ended (results["run"], benchmarks/standing.py); `--table` renders where each target stands
over runs already made, from their files.
"""
from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from trainwreck.benchmarks.standing import TARGETS, NotARun, judged, load_run, render, run_begins, run_ends

__all__ = ["TARGETS", "main", "run_all", "run_sections", "sections"]


def machine() -> dict[str, Any]:
    import torch  # here, not above: --table renders runs already made and never loads torch

    cuda = torch.cuda.is_available()
    return {"cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.machine()})"}


Section = tuple[str, Callable[[], dict[str, Any]]]


def sections(quick: bool) -> list[Section]:
    from trainwreck.harness.registry import SPAWN
    from trainwreck.benchmarks.checker import bench_checker, bench_checker_16m, bench_checker_bounded, bench_report
    from trainwreck.benchmarks.checkpoint import bench_checkpoint
    from trainwreck.benchmarks.fsdp import bench_fsdp
    from trainwreck.benchmarks.gpu import bench_gpu
    from trainwreck.benchmarks.instrumentation import bench_instrumentation
    from trainwreck.benchmarks.launch import bench_cmd, bench_launch, bench_watchdog_cpu
    from trainwreck.benchmarks.scenarios import bench_hang, bench_hang_16, bench_throughput

    return [
        ("launch", lambda: bench_launch(ranks=(4, 16), repeats=1 if quick else 3,
                                        skip=frozenset({(SPAWN, 16)}) if quick else frozenset())),
        ("cmd_launch", lambda: bench_cmd(repeats=1 if quick else 3)),
        ("watchdog", lambda: bench_watchdog_cpu(world_size=16)),
        # The full 1.6 M-event history in --quick too: the target is stated at that size.
        ("checker", lambda: bench_checker(steps=100_000)),
        ("checker_16m", bench_checker_16m),  # ten times that, for memory: about 2.3 GB of events on disk
        ("report", lambda: bench_report(steps=100_000)),  # `trainwreck report` of the 1.6 M-event run
        ("report_16m", lambda: bench_report(steps=1_000_000, suffix="16m")),  # and of ten times that
        ("instrumentation", lambda: bench_instrumentation(pairs=120)),
        # 1 GB in --quick too (about a minute: three rotating rounds of three saves and two
        # loads), so that every target in TARGETS is measured by every run.
        ("checkpoint", lambda: bench_checkpoint(("1mb", "100mb", "1gb"),
                                                repeats=2 if quick else 3)),
        ("throughput", lambda: bench_throughput(runs=3 if quick else 10)),
        ("hang", lambda: bench_hang(hangs=5 if quick else 20)),
        ("fsdp", lambda: bench_fsdp(steps=4 if quick else 8)),
        ("hang_16", lambda: bench_hang_16(hangs=2 if quick else 5)),
        # Twice the events, the same peak: 8 M and 16 M events in --quick (about 80 s), 16 M and 32 M
        # else. Last: it writes and deletes 3.5 GB of events, and the one run that measured it before
        # the checkpoint benchmark missed the 100 MB save ratio (1.64; 0.68-0.80 in the runs before).
        ("checker_bounded", lambda: bench_checker_bounded(steps=500_000 if quick else 1_000_000)),
        ("gpu", lambda: bench_gpu(quick)),  # CUDA-resident state and nccl; skipped without a GPU
    ]


def run_all(quick: bool, log: Callable[[str], None], out: Path | None = None,
            only: tuple[str, ...] = ()) -> dict[str, Any]:
    chosen = [(name, bench) for name, bench in sections(quick) if not only or name in only]
    if cache_bytecode():
        log("[benchmarks] wrote the bytecode caches of trainwreck's modules that were missing: "
            "PYTHONDONTWRITEBYTECODE is set, and each fresh process measured would compile them again")
    run, started = run_begins(), time.monotonic()
    results = run_sections(chosen, {"machine": machine(), "run": run, "quick": quick}, log, out)
    results["run"] = run_ends(run, time.monotonic() - started)
    if out is not None:
        _write_atomic(out, results)
    return results


PACKAGES = ("rundir", "trainer", "faults", "invariants", "report", "benchmarks", "harness")
"""trainwreck's packages (pyproject.toml); each folder's subpackages are compiled with it."""


def cache_bytecode(folders: list[str] | None = None) -> bool:
    """Write the missing or stale bytecode caches of trainwreck's own modules, as pip does for a
    package it installs, when this interpreter writes none itself (PYTHONDONTWRITEBYTECODE, -B). An
    editable install's tree then has none, and every fresh process a benchmark times (a report, a
    command line, a cold rank) compiled about 100 modules first: 0.6 s of a 1.6 M-event report's
    5.6 s here. Whether it had to; a folder it cannot write is left as it is."""
    if not sys.dont_write_bytecode:
        return False  # each import writes its own cache
    if folders is None:
        folders = [folder for name in PACKAGES
                   for folder in importlib.util.find_spec(f"trainwreck.{name}").submodule_search_locations]
    for folder in folders:
        compileall.compile_dir(folder, quiet=2)
    return True


def parse_only(text: str) -> tuple[str, ...]:
    """--only's section names, each one of `sections`; ValueError naming an unknown one and the known."""
    names = tuple(name for name in text.split(",") if name)
    known = [name for name, _ in sections(True)]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(f"--only {text!r}: {', '.join(unknown) or 'no section'} is not a section; "
                         f"expected some of {', '.join(known)}, e.g. --only fsdp,gpu")
    return names


def run_sections(steps: list[Section], results: dict[str, Any], log: Callable[[str], None],
                 out: Path | None = None) -> dict[str, Any]:
    """Each section in turn; its figures logged, merged into `results` and written to `out` as
    it finishes. A section that raises is logged with its error and listed in results["failed"]."""
    results.setdefault("failed", {})
    for name, bench in steps:
        started = time.perf_counter()
        log(f"[benchmarks] {name} ...")
        try:
            figures = bench()
        except Exception as exc:  # noqa: BLE001 - one section's crash must not lose the others' figures
            results["failed"][name] = f"{type(exc).__name__}: {exc}"
            log(f"[benchmarks] {name} FAILED after {time.perf_counter() - started:.1f}s: {type(exc).__name__}: {exc}\n"
                + traceback.format_exc())
        else:
            results.update(figures)
            log(f"[benchmarks] {name} done in {time.perf_counter() - started:.1f}s: {json.dumps(figures)}")
        if out is not None:
            _write_atomic(out, results)
    for n in (4, 16):
        if f"launch_torchrun_s_{n}" in results and f"launch_warm_s_{n}" in results:
            results[f"launch_speedup_vs_torchrun_{n}"] = round(
                results[f"launch_torchrun_s_{n}"] / results[f"launch_warm_s_{n}"], 1)
    results["targets"] = judged(results)
    if out is not None:
        _write_atomic(out, results)
    return results


def _write_atomic(path: Path, results: dict[str, Any]) -> None:
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps(results, indent=1))
    os.replace(scratch, path)


def table(paths: list[Path], measuring: bool = False) -> int:
    """--table: the Markdown of `standing.render` on stdout; 0 when every target was met in every
    run, 1 otherwise, 2 for a file that is not a run or for options that would measure."""
    if measuring:
        print("--table renders runs already made and measures nothing: give it no --quick, --json, --out or "
              "--only (run those first, then --table on the files --out wrote)", file=sys.stderr)
        return 2
    try:
        runs = [load_run(path) for path in paths]
    except NotARun as exc:
        print(exc, file=sys.stderr)
        return 2
    markdown, done = render(runs)
    print(markdown, end="")
    runs_said = "the one run" if len(runs) == 1 else f"all {len(runs)} runs"
    print(f"every target met in {runs_said}" if done else f"not every target met in {runs_said}", file=sys.stderr)
    return 0 if done else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (6 minutes on a quiet 2-core machine, 12-17 on a slow one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", type=Path, help="write the figures to this JSON file after every section")
    parser.add_argument("--only", default="", help="comma-separated sections to run (default: all), e.g. fsdp,gpu")
    parser.add_argument("--table", nargs="+", type=Path, metavar="RUN.json",
                        help="measure nothing: render where each target stands in these runs' --out files, "
                             "oldest first (exit 0 when every target was met in every one)")
    args = parser.parse_args(argv)
    if args.table:
        return table(args.table, measuring=args.quick or args.json or args.out is not None or bool(args.only))
    try:
        only = parse_only(args.only) if args.only else ()
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    results = run_all(args.quick, lambda line: print(line, file=sys.stderr, flush=True), args.out, only)
    status = 1 if results["failed"] else 0
    if args.json:
        print(json.dumps(results, indent=1))
        return status
    for key, value in results.items():
        if key != "targets" and not isinstance(value, dict):
            print(f"{key:<36} {value}")
        elif isinstance(value, dict) and value and all(isinstance(v, (int, float)) for v in value.values()):
            for part, figure in value.items():  # a split, such as scenario_split_s: one line per part
                print(f"{key + '.' + part:<36} {figure}")
    print("\ntargets:")
    for key, row in results["targets"].items():
        mark = {True: "met", False: "MISSED", None: "n/a"}[row["met"]]
        print(f"  {key:<34} {row['target']:<12} measured {row['measured']}  {mark}")
    for name, error in results["failed"].items():
        print(f"section {name} FAILED: {error}")
    return status


if __name__ == "__main__":
    sys.exit(main())
