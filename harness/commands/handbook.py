"""trainwreck handbook [--out DIR] [--chapters A,B] [--full]: interview questions answered by runs made on the spot.

Every chapter's runs are executed now (the golden runs built on first use), judged, reported
and plotted; the casebook (OUT/index.html, with the claims in OUT/handbook.json) quotes their
numbers. Exit 0 when every reference run is valid and every planted defect caught, else 1
(2: bad input or a run that could not be judged).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from trainwreck.invariants.verdict import exit_code, word_validity
from trainwreck.rundir.errors import InputError


def configure(parser: argparse.ArgumentParser) -> None:
    # The chapter table itself (no runs, no torch): the help names what --chapters accepts.
    from trainwreck.report.chapters import CHAPTERS

    default = ", ".join(c.slug for c in CHAPTERS if not c.full)
    slow = ", ".join(c.slug for c in CHAPTERS if c.full)
    parser.add_argument("--out", type=Path, help="casebook directory (default: ./trainwreck-out/handbook-TIMESTAMP)")
    parser.add_argument("--chapters", help=f"comma-separated chapter names instead of the default set; the default "
                                           f"set: {default}; with --full, or by name: {slow}")
    parser.add_argument("--full", action="store_true",
                        help=f"also the chapters whose runs are too slow for the default handbook's time budget: {slow}")


def measured_bytes(measured: dict[str, Any]) -> str:
    """A byte-counting job's figures as the job measured them on rank 0: the weights-and-optimizer
    figure names what it leaves out (the gradients), and the gradients are given beside it."""
    per = measured.get("bytes_per_param")
    if not per:
        return "measured"
    return (f"rank 0 measured {per['state']:g} bytes per parameter of weights and optimizer state "
            f"({per['params']:g} + {per['optimizer']:g}), gradients not included: "
            f"{per['grads']:g} more ({per['state'] + per['grads']:g} in all)")


def main(args: argparse.Namespace) -> int:
    from trainwreck.harness.suites.handbook import CHAPTERS, Case, CaseResult, default_chapters, get_chapter, run_handbook
    from trainwreck.rundir.layout import RunDir

    try:
        chapters = [get_chapter(n.strip()) for n in args.chapters.split(",") if n.strip()] if args.chapters \
            else (list(CHAPTERS) if args.full else default_chapters())
    except KeyError as exc:
        raise InputError(f"--chapters: {exc.args[0]}") from None
    out = args.out or Path("trainwreck-out") / f"handbook-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"trainwreck handbook: {len(chapters)} chapters → {out}", flush=True)

    def progress(i: int, total: int, item: Case | CaseResult, done: bool) -> None:
        if not done:
            print(f"[{i + 1}/{total}] {item.key}: {item.summary()}", flush=True)
            return
        record = item.judged.record if item.judged else None
        if item.measured is not None:
            detail = f"{measured_bytes(item.measured)} → {item.case.report_file(item.run_dir)}"
        else:
            detail = item.error or (f"{record.outcome} after {record.attempts} attempt(s), {record.wall_s:.1f} s → "
                                    f"{RunDir(item.run_dir).report_file('report.html')}")
        print(f"[{i + 1}/{total}] {item.status:<8} {item.case.key}: {detail}", flush=True)

    started = time.monotonic()
    index, word = run_handbook(out, chapters, progress=progress)
    print(f"\n{word}: handbook of {len(chapters)} chapters in {time.monotonic() - started:.0f} s "
          "(a CAUGHT broken trainer counts as passing)")
    print(f"casebook: {index}")
    return exit_code(word_validity(word))
