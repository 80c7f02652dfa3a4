"""trainwreck sweep [--writer NAME] [--parallelism ddp|fsdp] [--json] [--out DIR]: crash at every file
operation of a save. With --parallelism fsdp every rank writes its own shards, so each rank is
crashed at each of its own operations (harness/suites/sweep.py run_sharded_sweep).

Each crash point (before/after every mutating storage op of one checkpoint save, and a
torn variant of every write) is its own job, restarted by the harness and judged by
every invariant against one golden run.

trainwreck sweep --power-loss [--writer NAME] [--limit N] [--seed S] [--json]: the power
is cut instead (faults/powerloss.py): every save of one clean run is recorded, each crash
state a file system may leave is materialised, and the job resumes from it as its next
attempt, judged by every invariant (harness/suites/sweep.py run_power_loss_sweep). `--writer
lightning|accelerate|hf` records the framework's own saves in its ranks and resumes its
example script instead (run_foreign_power_loss; --limit defaults to 4 there).

trainwreck sweep --writer lightning|accelerate|hf|torchrun: the framework's own save, a crash at
every file operation its golden run recorded (`trainwreck frameworks --frameworks NAME
--scenarios crash-every-op`, the same rows).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from trainwreck.faults.plan import CRASH_WHEN
from trainwreck.invariants.verdict import compose, exit_code, verdict_word
from trainwreck.trainer.config import InputError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--writer", default="reference",
                        help="trainer variant whose save is swept: reference (default), naive_writer, rename_no_fsync; "
                             "or dcp (torch.distributed.checkpoint's own commit, a new directory per save), and "
                             "without --power-loss dcp_in_place (every DCP save into the same directory); with "
                             "--power-loss also the framework writers lightning, accelerate, hf (their own saves, "
                             "resumed by their example scripts); without --power-loss lightning, accelerate, hf, torchrun crash "
                             "the framework's own save at every file operation (the frameworks table's crash-every-op rows)")
    parser.add_argument("--out", type=Path, help="where the runs go (default ./trainwreck-out/sweep-TIMESTAMP)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with a row per crash point")
    parser.add_argument("--points", help="only these crash points, e.g. 12:after,2:torn (OP_INDEX:before|after|torn); "
                                         "with --parallelism fsdp a rank may lead, e.g. r1:1:torn (default rank 0)")
    parser.add_argument("--parallelism", choices=("ddp", "fsdp"), default="ddp",
                        help="ddp (default): rank 0 writes the checkpoint; fsdp: every rank writes its own DCP shards "
                             "and each rank is crashed at each of its own operations")
    parser.add_argument("--power-loss", action="store_true",
                        help="cut the power instead: judge every crash state a file system may leave (unsynced "
                             "data lost or torn, unsynced renames/creates lost)")
    parser.add_argument("--limit", type=int, help="--power-loss: judge at most N of the explored states, "
                                                  "spread evenly (default: all; 4 for a framework writer)")
    parser.add_argument("--seed", type=int, default=0, help="--power-loss: the seed of the state sampling (default 0)")
    parser.add_argument("--cmd", help="your own training command (it wraps its save in probe.saving): crash that "
                                      "save at every file operation its golden run recorded, e.g. --cmd "
                                      "'python train.py'")


def parse_points(text: str | None) -> list[tuple[int, str]] | None:
    """--points 12:after,2:torn -> [(12, 'after'), (2, 'torn')]; None: every crash point."""
    if text is None:
        return None
    points = []
    for item in text.split(","):
        index, _, when = item.strip().partition(":")
        if not index.isdigit() or when not in CRASH_WHEN:
            raise InputError(f"--points {item!r}: expected OP_INDEX:WHEN with WHEN one of {', '.join(CRASH_WHEN)}, "
                             "e.g. --points 12:after")
        points.append((int(index), when))
    return points


def parse_rank_points(text: str | None) -> list[tuple[int, int, str]] | None:
    """--points r1:1:torn,5:after -> [(1, 1, 'torn'), (0, 5, 'after')]; None: every crash point."""
    if text is None:
        return None
    points = []
    for item in text.split(","):
        head, _, when = item.strip().rpartition(":")
        rank, _, index = head.partition(":") if head.startswith("r") else ("r0", "", head)
        if not rank[1:].isdigit() or not index.isdigit() or when not in CRASH_WHEN:
            raise InputError(f"--points {item!r}: expected [rRANK:]OP_INDEX:WHEN with WHEN one of "
                             f"{', '.join(CRASH_WHEN)}, e.g. --points r1:1:torn")
        points.append((int(rank[1:]), int(index), when))
    return points


def main(args: argparse.Namespace) -> int:
    from trainwreck.faults.dcpcrash import DCP_LAYOUTS
    from trainwreck.harness.suites.frameworks import FRAMEWORKS
    from trainwreck.harness.suites.sweep import FOREIGN_WRITERS, run_sweep
    from trainwreck.trainer.entry import trainer_class

    dcp_own = args.writer == "dcp" or (args.writer in DCP_LAYOUTS and not args.power_loss)
    if args.cmd is not None:
        return command_main(args)
    if args.writer in FRAMEWORKS and not args.power_loss:
        return framework_main(args)
    try:
        # DCP's own commit and the framework writers' saves are no trainer variants
        if not (dcp_own or (args.power_loss and args.writer in FOREIGN_WRITERS)):
            trainer_class(args.writer)
    except ValueError as exc:
        raise InputError(f"--writer: {exc}") from None
    if dcp_own and args.parallelism != "ddp":
        raise InputError(f"--writer {args.writer} sweeps DCP's own save in one process; leave out --parallelism")
    if args.power_loss and args.parallelism != "ddp":
        raise InputError("--power-loss with --parallelism fsdp is not implemented (the power-loss sweep records "
                         "rank 0's saves only); leave out --parallelism, or use --writer dcp for DCP's own "
                         "commit under power loss")
    out = args.out or Path("trainwreck-out") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.power_loss:
        return power_loss_main(args, out)
    if dcp_own:
        return dcp_main(args, out)
    if args.parallelism == "fsdp":
        return sharded_main(args, out)
    started = time.perf_counter()
    result = run_sweep(args.writer, out, progress=lambda line: print(line, file=sys.stderr, flush=True),
                       points=parse_points(args.points))
    return finish(args, result, started, out)


def framework_main(args: argparse.Namespace) -> int:
    """A framework's own save, crashed at every file operation: the frameworks table's
    crash-every-op rows for that framework (harness/suites/frameworks.py), one code path for both."""
    from trainwreck.harness.commands import frameworks
    from trainwreck.harness.suites.frameworks import EVERY_OP

    refused = [flag for flag, given in (("--points", args.points is not None),
                                        ("--parallelism", args.parallelism != "ddp")) if given]
    if refused:
        raise InputError(f"{refused[0]} does not apply to --writer {args.writer}: a framework's save is crashed "
                         "at every file operation the golden run recorded; leave it out")
    out = args.out or Path("trainwreck-out") / f"sweep-{args.writer}-{time.strftime('%Y%m%d-%H%M%S')}"
    return frameworks.main(argparse.Namespace(out=out, json=args.json, frameworks=args.writer, scenarios=EVERY_OP))


def command_main(args: argparse.Namespace) -> int:
    """`--cmd`: the user's own save, crashed at every file operation it recorded: the frameworks
    table's crash-every-op rows for one more "framework", the command (one code path)."""
    from trainwreck.harness.commands.frameworks import publish_rows
    from trainwreck.harness.suites.frameworks import run_command_sweep

    refused = [flag for flag, given in (("--writer", args.writer != "reference"), ("--power-loss", args.power_loss),
                                        ("--points", args.points is not None),
                                        ("--parallelism", args.parallelism != "ddp")) if given]
    if refused or not args.cmd.strip():
        what = (f"{refused[0]} does not apply to --cmd: the command's own save is crashed at every file operation "
                "its golden run recorded; leave it out") if refused else "--cmd is empty; give e.g. --cmd 'python train.py'"
        raise InputError(what)
    out = args.out or Path("trainwreck-out") / f"sweep-cmd-{time.strftime('%Y%m%d-%H%M%S')}"
    return publish_rows(args.json, out, "trainwreck sweep --cmd",
                        lambda progress: run_command_sweep(args.cmd, out, progress=progress),
                        lambda row: f"{row.scenario:<32}")


def finish(args: argparse.Namespace, result, started: float, out: Path) -> int:  # type: ignore[no-untyped-def]
    """Print a process-crash sweep's result (--json or the table) and return its exit code."""
    if args.json:
        print(json.dumps(result.to_json(), indent=1, default=str))
    else:
        print_table(result, time.perf_counter() - started, out)
    return exit_code(compose(row.verdict for row in result.rows))


def dcp_main(args: argparse.Namespace, out: Path) -> int:
    from trainwreck.harness.suites.sweep import run_dcp_crash_sweep

    return points_sweep(args, out, parse_points, run_dcp_crash_sweep)


def sharded_main(args: argparse.Namespace, out: Path) -> int:
    from trainwreck.harness.suites.sweep import run_sharded_sweep

    return points_sweep(args, out, parse_rank_points, run_sharded_sweep)


def points_sweep(args: argparse.Namespace, out: Path, parse: Callable[[str | None], Any],
                 run: Callable[..., Any]) -> int:
    """A process-crash sweep whose --points `parse` reads (an InputError naming the fix when it cannot)."""
    points = parse(args.points)
    started = time.perf_counter()
    result = run(args.writer, out, progress=lambda line: print(line, file=sys.stderr, flush=True), points=points)
    return finish(args, result, started, out)


def print_table(result, seconds: float, out: Path) -> None:  # type: ignore[no-untyped-def]
    for row in result.rows:
        label = verdict_word(row.verdict)
        detail = ", ".join(row.failing + row.unknown)
        rank = f"rank {row.rank}  " if result.parallelism == "fsdp" else ""
        print(f"{label:<8} {rank}{row.when:<6} op {row.op_index:>2}  {row.op}" + (f"   [{detail}]" if detail else ""))
    first = result.first_failure
    ops = (" + ".join(f"{len(o)} (rank {r})" for r, o in sorted(result.rank_ops.items()))
           if result.rank_ops else str(len(result.ops)))
    name = f"fsdp {result.writer}" if result.parallelism == "fsdp" else result.writer
    print(f"\n{name}: {ops} operations, {len(result.rows)} crash points, "
          f"{len(result.failures)} not valid, {seconds:.0f}s; runs under {out}")
    if first is not None:
        print(f"first failing point: {first.label} -> {', '.join(first.failing + first.unknown)}: {first.summary}")


def power_loss_main(args: argparse.Namespace, out: Path) -> int:
    from trainwreck.harness.suites.sweep import (FOREIGN_LIMIT, FOREIGN_WRITERS, ForeignWriterMissing, run_dcp_power_loss,
                                          run_foreign_power_loss, run_power_loss_sweep)

    if args.points is not None:
        raise InputError("--points names process-crash points; with --power-loss use --limit N")
    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit {args.limit} judges nothing; give --limit 1 or more")
    started = time.perf_counter()
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731 - progress goes to stderr
    if args.writer in FOREIGN_WRITERS:
        try:
            result = run_foreign_power_loss(args.writer, out, progress=say, seed=args.seed,
                                            limit=FOREIGN_LIMIT if args.limit is None else args.limit)
        except ForeignWriterMissing as exc:
            raise InputError(str(exc)) from None
    elif args.writer == "dcp":
        result = run_dcp_power_loss(out, progress=say, seed=args.seed, limit=args.limit)
    else:
        result = run_power_loss_sweep(args.writer, out, progress=say, seed=args.seed, limit=args.limit)
    if args.json:
        print(json.dumps(result.to_json(), indent=1, default=str))
    else:
        print_power_loss_table(result, time.perf_counter() - started, out)
    return exit_code(compose(row.verdict for row in result.rows))


def print_power_loss_table(result, seconds: float, out: Path) -> None:  # type: ignore[no-untyped-def]
    for row in result.rows:
        detail = ", ".join(row.failing + row.unknown)
        print(f"{verdict_word(row.verdict):<8} state {row.state:>4}  cut after op {row.point:>3}  "
              f"kept {len(row.kept):>3} lost {len(row.lost):>2} torn {len(row.torn):>2}  {row.report}"
              + (f"   [{detail}]" if detail else ""))
    first = result.first_failure
    print(f"\n{result.writer}: {result.ops} recorded ops; {result.stats}; {len(result.rows)} judged, "
          f"{len(result.failures)} not valid, {seconds:.0f}s; runs under {out}")
    if first is not None:
        print(f"first failing state: {first.description} -> {', '.join(first.failing + first.unknown)}: "
              f"{first.summary}")
