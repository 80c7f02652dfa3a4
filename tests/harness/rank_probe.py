"""A benchmark job's rank that reports where it ran: `python -m tests.harness.rank_probe --rank R
--world W --port P --out F [--fail]`, run by benchmarks/ranks.py `run_ranks` in its tests."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch.distributed as dist

from trainwreck.benchmarks.ranks import gloo_rank


def where(world: int) -> dict[str, object]:
    parents: list[object] = [None] * world
    dist.all_gather_object(parents, {"ppid": os.getppid(), "pid": os.getpid(), "main": sys.modules["__main__"].__file__})
    return {"ranks": parents}


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port"):
        parser.add_argument(name, type=int)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args()
    if args.fail:  # every rank, before any joins the group: nobody waits for a peer
        print(f"rank {args.rank} refuses to start", file=sys.stderr)
        sys.exit(3)
    gloo_rank(args.rank, args.world, args.port, args.out, where)


if __name__ == "__main__":
    main()
