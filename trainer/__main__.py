"""python -m trainer --run-dir DIR --total-steps N [...]: the reference trainer on its own.

Works as a single process or under torchrun (which sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT); writes a run directory that `trainwreck check` can judge.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainwreck.rundir.arguments import OneLineParser, end_without_collecting, load_json_arg
from trainwreck.rundir.errors import InputError
from trainwreck.trainer.config import ConfigError, TrainConfig, parse_set_items
from trainwreck.rundir.files import describe, is_environment_failure
from trainwreck.trainer.launch import RankContext
from trainwreck.rundir.layout import RunDirError, refuse_foreign
from trainwreck.trainer.standalone import prepare_standalone


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m trainwreck.trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory (created if missing)")
    parser.add_argument("--total-steps", type=int, help="optimizer updates in the whole job")
    parser.add_argument("--tiny", action="store_true", help="start from the small test configuration")
    parser.add_argument("--config", help="config fields as JSON, or @FILE holding JSON")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override one config field (repeatable), e.g. --set width=128")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> TrainConfig:
    values: dict[str, Any] = {}
    if args.config:
        try:
            loaded = load_json_arg(args.config, "--config", '{"width": 128}')
        except InputError as exc:  # main() reports ConfigError as exit 2
            raise ConfigError(str(exc)) from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config must be a JSON object of config fields, got {type(loaded).__name__}; "
                              'e.g. {"width": 128}')
        values.update(loaded)
    values.update(parse_set_items(args.set))
    if args.total_steps is not None:
        values["total_steps"] = args.total_steps
    return TrainConfig.tiny(**values) if args.tiny else TrainConfig.from_dict(values)


def main(argv: list[str] | None = None) -> int:
    end_without_collecting()
    args = parse_args(argv)
    try:
        cfg = build_config(args)
        refuse_foreign(args.run_dir)  # before the attempt lookup below writes anything there
        ctx = RankContext.from_torchrun_env(args.run_dir)
        cfg.check_world_size(ctx.world_size)
        prepare_standalone(args.run_dir, cfg, ctx.world_size, ctx.rank, ctx.pg_timeout_s)
    except (ConfigError, RunDirError, OSError) as exc:
        print(f"trainwreck.trainer: error: {exc}", file=sys.stderr)
        return 2
    # After validation: a bad flag should not pay torch's import (tests/trainer/test_standalone.py).
    from trainwreck.trainer.checkpoint import IncompatibleCheckpoint
    from trainwreck.trainer.entry import run_rank

    try:
        run_rank(ctx, cfg)
    except IncompatibleCheckpoint as exc:
        print(f"trainwreck.trainer: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the machine: a full disk, a taken MASTER_PORT, a read-only run directory
        if not is_environment_failure(exc):
            raise
        print(f"trainwreck.trainer: error: {describe(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: one line, the shell's 128 + SIGINT, like every trainwreck command.
        print("trainwreck.trainer: interrupted; rerun with the same --run-dir to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
