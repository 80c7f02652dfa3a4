"""trainwreck chaos [--budget 10m] [--seed S] [--out DIR] [--engine local|ray [--address A]] [--resume OUT]:
random plans until the budget is spent.

One run directory per plan under --out, a progress line per run, a summary at the
end (and a casebook when trainwreck.report is installed). The engine decides where
plans run (harness/suites/engines.py: this process by default, a Ray cluster with
`--engine ray`); the campaign (harness/suites/campaign.py) is the same on either, and
`--resume OUT` continues one without rerunning its finished plans. Exit 0 all
valid, 1 any invalid, 2 any unknown and none invalid.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

from trainwreck.harness.suites.campaign import Campaign, CampaignSpec, finished_outcomes, read_ledger, write_ledger
from trainwreck.harness.suites.chaos import ChaosCase, parse_duration
from trainwreck.harness.suites.engines import ENGINES, EngineOptions, Outcome, open_engine
from trainwreck.harness.registry import DEFAULT_LAUNCHER, REFERENCE, launcher_help, launcher_names
from trainwreck.report.casebook import node_label
from trainwreck.invariants.verdict import EXIT_VALID, compose, exit_code as verdict_exit_code, verdict_word
from trainwreck.rundir.errors import InputError
from trainwreck.rundir.layout import RunDir

__all__ = ["ChaosCase", "Outcome", "configure", "exit_code", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", default="10m", help="wall-clock budget: 90s, 10m, 1h (default 10m)")
    parser.add_argument("--plans", type=int, help="stop after this many plans of the stream (default: the budget decides)")
    parser.add_argument("--seed", type=int, help="seed of the plan stream (default: random, printed)")
    parser.add_argument("--out", type=Path, help="directory for the run directories "
                                                 "(default ./trainwreck-out/chaos-TIMESTAMP)")
    parser.add_argument("--launcher", default=DEFAULT_LAUNCHER, choices=launcher_names(REFERENCE),
                        help=f"how ranks start (default {DEFAULT_LAUNCHER}): {launcher_help(launcher_names(REFERENCE))}")
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"),
                        help="process-group backend (default auto)")
    parser.add_argument("--engine", default="local", choices=tuple(ENGINES),
                        help="where plans run: local (this process, default) or ray (a Ray cluster; the [ray] extra)")
    parser.add_argument("--address", help="--engine ray: the cluster to join (HOST:PORT, ray://HOST:PORT, auto; "
                                           "default $RAY_ADDRESS, else a local instance on loopback)")
    parser.add_argument("--cpus-per-rank", type=float, default=1.0,
                        help="--engine ray: CPUs a plan reserves per rank, at most one whole node (default 1)")
    parser.add_argument("--resume", type=Path, metavar="OUT",
                        help="continue the campaign in OUT (its seed, launcher and backend); finished plans are kept")


def main(args: argparse.Namespace) -> int:
    try:
        budget_s = parse_duration(args.budget)
    except ValueError as exc:
        raise InputError(f"--budget: {exc}") from None
    if getattr(args, "plans", None) is not None and args.plans < 1:
        raise InputError(f"--plans {args.plans} must be at least 1 (or left out: the budget decides)")
    out, spec, finished = campaign_dir(args)
    engine = open_engine(getattr(args, "engine", "local"),
                         EngineOptions(getattr(args, "address", None), getattr(args, "cpus_per_rank", 1.0)))
    try:
        write_ledger(out, spec)
        print(f"chaos: seed {spec.seed}, budget {args.budget}, runs under {out}", flush=True)
        if engine.name != "local" or finished:
            print(f"chaos: {engine.describe()}" + (f"; resuming, {len(finished)} plan(s) already judged"
                                                    if finished else ""), flush=True)
        deadline = time.monotonic() + budget_s
        campaign = Campaign(engine, out, spec, lambda outcome: report_progress(outcome, deadline))
        outcomes = campaign.run(budget_s, getattr(args, "plans", None), finished)
    finally:
        engine.close()
    print_summary(outcomes, spec.seed, args.budget)
    write_casebook(out, outcomes, spec.seed)
    return exit_code(outcomes)


def campaign_dir(args: argparse.Namespace) -> tuple[Path, CampaignSpec, dict[int, Outcome]]:
    """A new campaign's directory and spec, or a resumed one's with the plans it already judged."""
    resume = getattr(args, "resume", None)
    if resume is None:
        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
        out = args.out or Path("trainwreck-out") / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}"
        return out, CampaignSpec(seed, args.launcher, args.backend), {}
    if args.out is not None or args.seed is not None:
        raise InputError(f"--resume {resume}: a resumed campaign keeps its own directory and seed; "
                         "drop --out and --seed")
    spec = read_ledger(resume)
    return resume, spec, finished_outcomes(resume)


def report_progress(outcome: Outcome, deadline: float) -> None:
    word = verdict_word(outcome.valid)
    left = max(0.0, deadline - time.monotonic())
    where = f"on {node_label(outcome.node)}  " if outcome.node.get("engine", "local") != "local" else ""
    print(f"[{outcome.index:4d}] {word:<8} {outcome.seconds:5.1f}s  {left:6.0f}s left  {where}{outcome.case.describe()}",
          flush=True)
    if outcome.valid is not True:
        print(f"       run directory: {outcome.run_dir}\n       reproduce: {outcome.reproduce}", flush=True)


def print_summary(outcomes: list[Outcome], seed: int, budget: str) -> None:
    counts = Counter(verdict_word(o.valid) for o in outcomes)
    kinds = Counter(f["kind"] for o in outcomes for f in o.case.plan)
    print(f"\nchaos summary: {len(outcomes)} plan(s) in {budget} (seed {seed}): "
          f"{counts['VALID']} valid, {counts['INVALID']} invalid, {counts['UNKNOWN']} unknown")
    nodes = Counter(node_label(o.node) for o in outcomes if o.node.get("engine", "local") != "local")
    if nodes:
        print("plans per node: " + ", ".join(f"{label} x{n}" for label, n in sorted(nodes.items())))
    if kinds:
        print("fault kinds exercised: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
    for o in outcomes:
        if o.valid is not True:
            print(f"  {verdict_word(o.valid):<8} {o.run_dir}\n           {o.reproduce}")


def write_casebook(out: Path, outcomes: list[Outcome], seed: int) -> None:
    try:
        from trainwreck.report import render_casebook
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
