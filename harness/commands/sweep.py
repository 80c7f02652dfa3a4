"""trainwreck sweep [--writer NAME] [--parallelism ddp|fsdp] [--json] [--out DIR]: crash at every file
operation of a save. With --parallelism fsdp every rank writes its own shards, so each rank is
crashed at each of its own operations.

Each crash point (before/after every mutating storage op of one checkpoint save, and a
torn variant of every write) is its own job, restarted by the harness and judged by
every invariant against one golden run.

trainwreck sweep --power-loss [--writer NAME | --framework NAME] [--limit N] [--seed S] [--json]: the power
is cut instead (faults/powerloss.py): every save of one clean run is recorded, each crash
state a file system may leave is materialised, and the job resumes from it as its next
attempt, judged by every invariant. `--framework lightning|accelerate|hf` records the
framework's own saves in its ranks and resumes its example script instead (--limit defaults
to 4 there).

trainwreck sweep --framework lightning|accelerate|hf|torchrun: the framework's own save, a crash at
every file operation its golden run recorded (`trainwreck frameworks --frameworks NAME
--scenarios crash-every-op`, the same rows); --cmd does the same for the user's own command.

This module only parses: the flags become a harness/suites/sweep.py `SweepRequest`, which checks
itself and picks its kind of sweep; `run_sweep` runs every one of them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainwreck.faults.plan import CRASH_WHEN
from trainwreck.harness.errors import InputError
from trainwreck.invariants.verdict import exit_code, verdict_word

if TYPE_CHECKING:
    from trainwreck.harness.suites.sweep import SweepRequest, SweepResult


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--writer", default="reference",
                        help="trainer variant whose save is swept: reference (default), naive_writer, rename_no_fsync; "
                             "or dcp (torch.distributed.checkpoint's own commit, a new directory per save), and "
                             "without --power-loss dcp_in_place (every DCP save into the same directory)")
    parser.add_argument("--framework", metavar="NAME",
                        help="sweep a framework's own save instead, run by its example script: torchrun, hf, "
                             "lightning, accelerate crash it at every file operation (the frameworks table's "
                             "crash-every-op rows); with --power-loss lightning, accelerate, hf")
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


def parse_points(text: str | None) -> list[tuple[int, int, str]] | None:
    """--points 12:after,2:torn -> [(0, 12, 'after'), (0, 2, 'torn')] (rank 0 writes a DDP or DCP
    save); None: every crash point."""
    if text is None:
        return None
    points = []
    for item in text.split(","):
        index, _, when = item.strip().partition(":")
        if not index.isdigit() or when not in CRASH_WHEN:
            raise InputError(f"--points {item!r}: expected OP_INDEX:WHEN with WHEN one of {', '.join(CRASH_WHEN)}, "
                             "e.g. --points 12:after")
        points.append((0, int(index), when))
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


def request_from(args: argparse.Namespace) -> SweepRequest:
    """The flags as a request, checked (an InputError naming the fix) before anything runs."""
    from trainwreck.harness.suites.sweep import SweepRequest

    parse = parse_rank_points if args.parallelism == "fsdp" else parse_points
    points = parse(args.points)
    request = SweepRequest(writer=args.writer, parallelism=args.parallelism, points=None if points is None else
                           tuple(points), power_loss=args.power_loss, limit=args.limit, seed=args.seed, cmd=args.cmd,
                           framework=args.framework)
    request.check()
    return request


def main(args: argparse.Namespace) -> int:
    from trainwreck.harness.suites.sweep import run_sweep

    request = request_from(args)
    if request.table:
        return table_main(args, request)
    out = args.out or Path("trainwreck-out") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    started = time.perf_counter()
    result = run_sweep(request, out, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(result.to_json(), indent=1, default=str))
    elif result.power_loss:
        print_power_loss_table(result, time.perf_counter() - started, out)
    else:
        print_table(result, time.perf_counter() - started, out)
    return exit_code(result.valid)


def table_main(args: argparse.Namespace, request: SweepRequest) -> int:
    """A framework's own save or the user's --cmd, crashed at every file operation: the frameworks
    table's crash-every-op rows (harness/suites/frameworks.py), published as that table publishes them."""
    from trainwreck.harness.commands.frameworks import publish_rows, table
    from trainwreck.harness.suites.frameworks import EVERY_OP, run_command_sweep

    stamp = time.strftime('%Y%m%d-%H%M%S')
    if request.cmd is None:
        out = args.out or Path("trainwreck-out") / f"sweep-{request.framework}-{stamp}"
        return table(out, args.json, [request.framework or ""], [EVERY_OP])
    command, out = request.cmd, args.out or Path("trainwreck-out") / f"sweep-cmd-{stamp}"
    return publish_rows(args.json, out, "trainwreck sweep --cmd",
                        lambda progress: run_command_sweep(command, out, progress=progress),
                        lambda row: f"{row.scenario:<32}")


def print_table(result: SweepResult, seconds: float, out: Path) -> None:
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


def print_power_loss_table(result: SweepResult, seconds: float, out: Path) -> None:
    for row in result.rows:
        detail = ", ".join(row.failing + row.unknown)
        print(f"{verdict_word(row.verdict):<8} state {row.state:>4}  cut after op {row.point:>3}  "
              f"kept {len(row.kept):>3} lost {len(row.lost):>2} torn {len(row.torn):>2}  {row.report}"
              + (f"   [{detail}]" if detail else ""))
    first = result.first_failure
    print(f"\n{result.writer}: {len(result.ops)} recorded ops; {result.stats}; {len(result.rows)} judged, "
          f"{len(result.failures)} not valid, {seconds:.0f}s; runs under {out}")
    if first is not None:
        print(f"first failing state: {first.description} -> {', '.join(first.failing + first.unknown)}: "
              f"{first.summary}")
