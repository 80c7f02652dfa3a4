"""trainwreck chaos [--budget 10m] [--seed S] [--out DIR]: random plans until the budget is spent.

One run directory per plan under --out, a progress line per run, a summary at the
end (and a casebook when harness.report is installed). Exit 0 all valid, 1 any
invalid, 2 any unknown and none invalid.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from trainwreck.harness.chaos import ChaosCase, parse_duration, stream_cases
from trainwreck.harness.registry import DEFAULT_LAUNCHER, REFERENCE, launcher_help, launcher_names
from trainwreck.invariants.verdict import EXIT_VALID, compose, exit_code as verdict_exit_code, verdict_word
from trainwreck.trainer.errors import InputError
from trainwreck.trainer.rundir import RunDir



def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", default="10m", help="wall-clock budget: 90s, 10m, 1h (default 10m)")
    parser.add_argument("--seed", type=int, help="seed of the plan stream (default: random, printed)")
    parser.add_argument("--out", type=Path, help="directory for the run directories "
                                                 "(default ./trainwreck-out/chaos-TIMESTAMP)")
    parser.add_argument("--launcher", default=DEFAULT_LAUNCHER, choices=launcher_names(REFERENCE),
                        help=f"how ranks start (default {DEFAULT_LAUNCHER}): {launcher_help(launcher_names(REFERENCE))}")
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"),
                        help="process-group backend (default auto)")


@dataclass
class Outcome:
    index: int
    case: ChaosCase
    run_dir: Path
    valid: object
    reproduce: str
    seconds: float


def main(args: argparse.Namespace) -> int:
    try:
        budget_s = parse_duration(args.budget)
    except ValueError as exc:
        raise InputError(f"--budget: {exc}") from None
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    out = args.out or Path("trainwreck-out") / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"chaos: seed {seed}, budget {args.budget}, runs under {out}", flush=True)
    deadline = time.monotonic() + budget_s
    outcomes: list[Outcome] = []

    def consume(case: ChaosCase) -> None:
        outcomes.append(run_one(len(outcomes) + 1, case, out, args.launcher, args.backend))
        report_progress(outcomes[-1], deadline)

    stream_cases(seed, lambda: time.monotonic() < deadline, consume)
    print_summary(outcomes, seed, args.budget)
    write_casebook(out, outcomes, seed)
    return exit_code(outcomes)


def run_one(index: int, case: ChaosCase, out: Path, launcher: str, backend: str) -> Outcome:
    from trainwreck.harness.runner import run_judged, verdict_lines

    run_dir = out / f"plan-{index:04d}"
    started = time.monotonic()
    reproduce = case.reproduce(launcher, backend)
    try:
        judged = run_judged(case.spec(run_dir, launcher, backend))
        valid = judged.judgement.valid
        if valid is not True:
            (run_dir / "chaos-failure.txt").write_text("\n".join(verdict_lines(judged.judgement) + [f"reproduce: {reproduce}"]) + "\n")
    except Exception:  # noqa: BLE001 - a harness error is this run's "unknown", not the end of the chaos run
        valid = "unknown"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "chaos-error.txt").write_text(traceback.format_exc())
    return Outcome(index, case, run_dir, valid, reproduce, time.monotonic() - started)


def report_progress(outcome: Outcome, deadline: float) -> None:
    word = verdict_word(outcome.valid)
    left = max(0.0, deadline - time.monotonic())
    print(f"[{outcome.index:4d}] {word:<8} {outcome.seconds:5.1f}s  {left:6.0f}s left  {outcome.case.describe()}",
          flush=True)
    if outcome.valid is not True:
        print(f"       run directory: {outcome.run_dir}\n       reproduce: {outcome.reproduce}", flush=True)


def print_summary(outcomes: list[Outcome], seed: int, budget: str) -> None:
    counts = Counter(verdict_word(o.valid) for o in outcomes)
    kinds = Counter(f["kind"] for o in outcomes for f in o.case.plan)
    print(f"\nchaos summary: {len(outcomes)} plan(s) in {budget} (seed {seed}): "
          f"{counts['VALID']} valid, {counts['INVALID']} invalid, {counts['UNKNOWN']} unknown")
    if kinds:
        print("fault kinds exercised: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
    for o in outcomes:
        if o.valid is not True:
            print(f"  {verdict_word(o.valid):<8} {o.run_dir}\n           {o.reproduce}")


def write_casebook(out: Path, outcomes: list[Outcome], seed: int) -> None:
    try:
        from trainwreck.harness.report import render_casebook
    except ImportError:
        return
    run_dirs = [o.run_dir for o in outcomes if RunDir(o.run_dir).run_json.exists()]
    if not run_dirs:
        return
    try:
        index = render_casebook(out / "casebook", run_dirs, f"trainwreck chaos, seed {seed}")
        print(f"casebook: {index}")
    except Exception as exc:  # noqa: BLE001 - the runs and their verdicts stand without the casebook
        print(f"casebook not written: {exc}", file=sys.stderr)


def exit_code(outcomes: list[Outcome]) -> int:
    """0 all valid, 1 any invalid, 2 any unknown and none invalid (0 when no plan fit the budget)."""
    values = [o.valid for o in outcomes]
    return verdict_exit_code(compose(values)) if values else EXIT_VALID  # type: ignore[arg-type]
