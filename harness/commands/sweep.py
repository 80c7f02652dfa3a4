"""trainwreck sweep [--writer NAME] [--json] [--out DIR]: crash at every file operation of a save.

Each crash point (before/after every mutating storage op of one checkpoint save, and a
torn variant of every write) is its own job, restarted by the harness and judged by
every invariant against one golden run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from trainwreck.invariants.verdict import verdict_word


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--writer", default="reference",
                        help="trainer variant whose save is swept: reference (default) or naive_writer")
    parser.add_argument("--out", type=Path, help="where the runs go (default ./trainwreck-out/sweep-TIMESTAMP)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with a row per crash point")


def main(args: argparse.Namespace) -> int:
    from trainwreck.faults.sweep import run_sweep
    from trainwreck.trainer.entry import trainer_class

    try:
        trainer_class(args.writer)
    except ValueError as exc:
        print(f"trainwreck sweep: error: --writer: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path("trainwreck-out") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    started = time.perf_counter()
    result = run_sweep(args.writer, out, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(result.to_json(), indent=1, default=str))
    else:
        print_table(result, time.perf_counter() - started, out)
    verdicts = [row.verdict for row in result.rows]
    if any(v is False for v in verdicts):
        return 1
    return 0 if verdicts and all(v is True for v in verdicts) else 2


def print_table(result, seconds: float, out: Path) -> None:  # type: ignore[no-untyped-def]
    for row in result.rows:
        label = verdict_word(row.verdict)
        detail = ", ".join(row.failing + row.unknown)
        print(f"{label:<8} {row.when:<6} op {row.op_index:>2}  {row.op}" + (f"   [{detail}]" if detail else ""))
    first = result.first_failure
    print(f"\n{result.writer}: {len(result.ops)} operations, {len(result.rows)} crash points, "
          f"{len(result.failures)} not valid, {seconds:.0f}s; runs under {out}")
    if first is not None:
        print(f"first failing point: {first.label} -> {', '.join(first.failing + first.unknown)}: {first.summary}")
