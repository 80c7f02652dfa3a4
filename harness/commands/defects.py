"""trainwreck defects [--json] [--only NAME,...] [--out DIR]: the planted-defect self-test table.

For each planted defect: run it under the scenario that exposes it, require the named
invariant to judge it invalid, and require the reference to pass the same scenario.
Exit 0 only when every defect is caught and every control is valid, else 1 (2: bad input).
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from trainwreck.harness.suites.defects import DEFECTS, Defect, Row, defect_names, get_defect, run_table, table_exit_code
from trainwreck.harness.registry import DEFAULT_LAUNCHER, REFERENCE, launcher_help, launcher_names


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help='print [{"defect", "invariant", "caught", "control_valid", ...}]')
    parser.add_argument("--only", help=f"comma-separated defect names (default all): {', '.join(defect_names())}")
    parser.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary "
                                                 "directory, removed afterwards)")
    # A planted watchdog defect needs the harness's own attempt loop: only those launchers.
    choices = launcher_names(REFERENCE, planted_watchdogs=True)
    parser.add_argument("--launcher", default=DEFAULT_LAUNCHER, choices=choices,
                        help=f"how ranks start (default {DEFAULT_LAUNCHER}): {launcher_help(choices)}")


def main(args: argparse.Namespace) -> int:
    defects = select(args.only)  # an unknown name is an InputError (rundir/errors.py UnknownName)
    # harness/cli.py has checked --out (absent or empty, writable) before this runs.
    out = args.out or Path(tempfile.mkdtemp(prefix="trainwreck-defects-"))
    started = time.monotonic()
    try:
        progress = None if args.json else print_progress
        if not args.json:
            print(f"{len(defects)} planted defect(s); each must be caught by its invariant, "
                  "and the reference must pass the same scenario", flush=True)
        rows = run_table(out, defects, launcher=args.launcher, progress=progress)
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    if args.json:
        print(json.dumps([row.to_json() for row in rows], indent=1))
    else:
        print_table(rows, time.monotonic() - started)
    return table_exit_code(rows)


def select(only: str | None) -> list[Defect]:
    if not only:
        return list(DEFECTS)
    return [get_defect(name.strip()) for name in only.split(",") if name.strip()]


def print_progress(row: Row) -> None:
    mark = "caught " if row.caught else "MISSED "
    print(f"  {mark} {row.defect.name:<26} by {row.defect.invariant:<10} ({row.wall_s:.1f}s)", flush=True)


def result_word(row: Row) -> str:
    if row.caught and row.control_valid:
        return "ok"
    if not row.caught:
        return "NOT CAUGHT"
    return "CONTROL INVALID"


def print_table(rows: list[Row], wall_s: float) -> None:
    header = ("defect", "component", "invariant", "scenario", "defect run", "control", "result")
    table = [header] + [(r.defect.name, r.defect.component, r.defect.invariant, r.defect.scenario.name,
                         "invalid" if r.caught else str(r.verdict), "valid" if r.control_valid else "NOT VALID",
                         result_word(r)) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    print()
    for index, line in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
        if index == 0:
            print("  ".join("-" * w for w in widths))
    caught = sum(r.caught for r in rows)
    controls = sum(r.control_valid for r in rows)
    print(f"\n{caught}/{len(rows)} defects caught, {controls}/{len(rows)} controls valid, {wall_s:.1f}s")
