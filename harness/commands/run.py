"""trainwreck run [SCENARIO] [...]: one job under faults, judged against a cached golden run.

The judge's runner imports torch (seconds on a busy machine), so it is imported only once the
arguments have passed their checks: a usage error, a bad plan or a bad field of the job (its
JobSpec is built first, torch-free) exits 2 without waiting for it.
The import runs with SIGINT/SIGTERM deferred (interrupts.py `deferred`), as the dispatcher's does."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwreck.harness.judge.cache_dir import usable_cache_dir
from trainwreck.harness.launch import gpus
from trainwreck.harness.registry import COMMAND, DEFAULT_LAUNCHER, default_launcher, launcher_help, launcher_names
from trainwreck.harness.supervise.interrupts import deferred
from trainwreck.harness.supervise.scenarios import Scenario, custom_scenario, get_scenario, scenario_names
from trainwreck.harness.supervise.spec import spec_for
from trainwreck.invariants.verdict import verdict_word
from trainwreck.faults.plan import PlanError
from trainwreck.rundir.arguments import load_json_arg
from trainwreck.trainer.config import BACKENDS, PARALLELISMS, backend_fields, parse_set_items
from trainwreck.rundir.errors import InputError

if TYPE_CHECKING:
    from trainwreck.harness.judge.runner import JudgedRun


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", help=f"a built-in scenario: {', '.join(scenario_names())}")
    parser.add_argument("--plan", help="fault plan as JSON, or @FILE (replaces the scenario's plan)")
    parser.add_argument("--world-sizes", help="world size per attempt, e.g. 4,2 (the last repeats)")
    parser.add_argument("--total-steps", type=int, help="optimizer updates in the job")
    parser.add_argument("--hang-timeout", type=float, help="seconds without progress before a hang is declared")
    parser.add_argument("--launcher", choices=launcher_names(),
                        help=f"how ranks start (default {DEFAULT_LAUNCHER}; with --cmd {default_launcher(COMMAND)}): "
                             f"{launcher_help(launcher_names())}")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="process-group backend (default auto: nccl when every rank has a GPU, else gloo)")
    parser.add_argument("--parallelism", choices=PARALLELISMS,
                        help="ddp (default) or fsdp: FSDP2 with sharded DCP checkpoints")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override one config field (repeatable), e.g. --set width=64")
    parser.add_argument("--out", type=Path, help="run directory (default: ./trainwreck-out/run-TIMESTAMP)")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument("--cmd", help="judge your own trainer: the command that runs one rank (it calls the "
                                      "probe; docs/FRAMEWORKS.md), started per rank with torchrun's environment "
                                      "(`python SCRIPT.py`/`python -m MOD` forked from a server that imported torch "
                                      "once; --launcher cmd: a fresh interpreter per rank)")
    parser.add_argument("--fresh-golden", action="store_true",
                        help="--cmd: rebuild the command's golden run even when a cached one matches its key "
                             "(the command, the files it names and imports, torch and trainwreck versions)")
    parser.add_argument("--ckpt-dir", default="checkpoints",
                        help="--cmd: the command's checkpoint directory, relative to the run directory "
                             "(corrupt faults damage its newest entry; default checkpoints)")


def main(args: argparse.Namespace) -> int:
    if args.cmd is not None:
        return main_cmd(args)
    if args.fresh_golden:
        raise InputError("--fresh-golden applies to --cmd only: the reference trainer's golden key already "
                         "covers its config and source; leave it out")
    scenario = build_scenario(args)
    out = args.out or Path("trainwreck-out") / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    spec = spec_for(scenario, out, launcher=args.launcher or DEFAULT_LAUNCHER)  # checks every field, torch-free
    usable_cache_dir()
    with deferred():
        gpus.check_gpus(scenario.config, scenario.world_sizes)  # imports torch; nccl wants a GPU per rank
        from trainwreck.harness.judge.runner import run_judged
        if spec.launcher_kind.fork_server:  # now: torch is imported, no run file is open yet
            from trainwreck.harness.launch.launchers import fork_server_from_here
            fork_server_from_here()
    judged = run_judged(spec, args.scenario)
    print_result(judged, args.json)
    return judged.exit_code


def build_scenario(args: argparse.Namespace) -> Scenario:
    scenario = get_scenario(args.scenario) if args.scenario else custom_scenario()
    changes: dict[str, Any] = {}
    if args.plan is not None:
        changes["plan"] = tuple(parse_plan_arg(args.plan))
    if args.world_sizes is not None:  # '' is a mistake to refuse, not "no change"
        try:
            changes["world_sizes"] = tuple(int(w) for w in args.world_sizes.split(","))
        except ValueError:
            raise InputError(f"--world-sizes {args.world_sizes!r}: expected integers like 4,2") from None
    config = dict(scenario.config)
    if args.total_steps is not None:
        config["total_steps"] = args.total_steps
    if args.backend:
        config.update(backend_fields(args.backend))
    config.update(parse_set_items(args.set))
    if args.parallelism:
        config["parallelism"] = args.parallelism
    changes["config"] = config
    if args.hang_timeout is not None:
        changes["hang_timeout_s"] = args.hang_timeout
    return replace(scenario, **changes)


def parse_plan_arg(text: str) -> list[dict[str, Any]]:
    from trainwreck.faults.plan import PLAN_EXAMPLE, parse_plan  # validates every field, naming the fault id

    plan = load_json_arg(text, "--plan", PLAN_EXAMPLE)
    if not isinstance(plan, list) or not all(isinstance(f, dict) for f in plan):
        raise PlanError(f"--plan must be a JSON list of fault objects, e.g. {PLAN_EXAMPLE}")
    return parse_plan(plan).to_list()


def print_result(judged: JudgedRun, as_json: bool) -> None:
    from trainwreck.harness.judge.runner import verdict_lines  # imported by now: it ran the job

    if as_json:
        payload = {**judged.judgement.to_json(), "run_dir": str(judged.record.run_dir),
                   "outcome": judged.record.outcome, "reproduce": judged.reproduce,
                   "root_cause": judged.root_cause.to_json() if judged.root_cause else None}
        print(json.dumps(payload, indent=1, default=str))
        return
    if judged.root_cause is not None:  # first: the verdicts below may judge a run that tested nothing
        print(f"root cause: {judged.root_cause.sentence()}")
    print("\n".join(verdict_lines(judged.judgement)))
    print(f"overall: {verdict_word(judged.judgement.valid)}   ({judged.record.outcome} after {judged.record.attempts} attempt(s), "
          f"{judged.record.wall_s:.1f}s)")
    print(f"run directory: {judged.record.run_dir}")
    print(f"reproduce: {judged.reproduce}")


CMD_HANG_TIMEOUT_S = 30.0
"""--cmd's default --hang-timeout (seconds)."""


def main_cmd(args: argparse.Namespace) -> int:
    """`--cmd`: the user's command per rank, judged against its own golden run."""
    from trainwreck.harness.supervise.command.target import Command
    from trainwreck.harness.supervise.create_rundir import check_out_dir
    from trainwreck.harness.supervise.spec import JobSpec

    given = [flag for flag, value in (("SCENARIO", args.scenario), ("--total-steps", args.total_steps),
                                      ("--backend", args.backend), ("--set", args.set),
                                      ("--parallelism", args.parallelism),
                                      # A command's own launchers are its choice: forked warm (default) or cold.
                                      ("--launcher", None if args.launcher in launcher_names(COMMAND) else args.launcher))
             if value not in (None, [])]
    if given:  # each would be silently ignored: the command is the user's, not the reference trainer's
        raise InputError(f"--cmd takes --plan, --world-sizes, --hang-timeout, --ckpt-dir, --out and --launcher "
                         f"{' or '.join(launcher_names(COMMAND))} only, not {', '.join(given)}: the command itself "
                         "sets the steps, the backend, the parallelism and the rest, and its ranks start with "
                         "torchrun's environment; drop them, or pass them to your command")
    scenario = build_scenario(args)
    out = check_out_dir(args.out or Path("trainwreck-out") / f"run-{time.strftime('%Y%m%d-%H%M%S')}")
    spec = JobSpec(target=Command(args.cmd, args.ckpt_dir), world_sizes=scenario.world_sizes, launcher=args.launcher,
                   plan=list(scenario.plan),
                   # A foreign trainer imports its framework after its first progress
                   # record; the built-in scenarios' few seconds are for the warm reference.
                   hang_timeout_s=args.hang_timeout if args.hang_timeout is not None else CMD_HANG_TIMEOUT_S,
                   run_dir=out, keep=True)
    usable_cache_dir()
    with deferred():
        from trainwreck.harness.judge.runner import run_judged
    judged = run_judged(spec, fresh_golden=args.fresh_golden)
    print_result(judged, args.json)
    return judged.exit_code
