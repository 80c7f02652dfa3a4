"""What torch's own `monitored_barrier` says about a rank that never arrives, measured on gloo.

    python -m trainwreck.benchmarks.barrier [--world 3] [--timeout 1]

A plain collective on gloo waits out the process group's timeout and its error names the
collective, not the missing rank. `torch.distributed.monitored_barrier` (gloo only) is the
exception: rank 0 waits for every other rank and its error names the ones that never came. Here
the last rank is held back (it waits on the store until rank 0's call has raised, then leaves) and
every other rank calls `monitored_barrier(wait_all_ranks=True)`. Each caller's error, how long it
took, and the rank numbers it names are printed as JSON; the handbook's hang chapter quotes them.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainwreck.benchmarks.ranks import run_ranks

RAISED = "raised"
"""The store key rank 0 sets once its monitored_barrier has returned or raised: the held-back rank may go."""
STORE_WAIT_S = 120.0
_RANKS = re.compile(r"\branks? (\d+(?:, \d+)*)", re.IGNORECASE)


def named_ranks(message: str, me: int) -> list[int]:
    """Every rank number an error names but the caller's own. Torch words it by version ("[Rank 0]:
    Rank 2 failed to pass monitoredBarrier", "Ranks 2, 3 failed ..."); a rank that did pass says
    to read rank 0's log, and so names rank 0."""
    found = {int(n) for m in _RANKS.finditer(message) for n in m.group(1).split(", ")}
    return sorted(found - {me})


def _call(rank: int, timeout_s: float) -> dict[str, Any]:
    started = time.monotonic()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
        error = None
    except RuntimeError as exc:
        error = str(exc)
    return {"rank": rank, "raised_after_s": round(time.monotonic() - started, 3), "error": error,
            "names": named_ranks(error, rank) if error is not None else []}


def _rank(rank: int, world: int, port: int, timeout_s: float, out: Path) -> None:
    store = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timedelta(seconds=STORE_WAIT_S))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    stalled = world - 1
    if rank == stalled:
        store.wait([RAISED])  # held back until the barrier has given up on it: no sleep guessing how long
    else:
        store.set(f"result/{rank}", json.dumps(_call(rank, timeout_s)))
        if rank == 0:
            store.set(RAISED, "1")
    if rank == 0:
        ranks = [json.loads(store.get(f"result/{r}")) for r in range(stalled)]
        out.write_text(json.dumps({"backend": dist.get_backend(), "world_size": world, "stalled_rank": stalled,
                                   "timeout_s": timeout_s, "wait_all_ranks": True, "torch": torch.__version__,
                                   "ranks": ranks}))
    dist.destroy_process_group()


def measure(world: int, timeout_s: float) -> dict[str, Any]:
    """One gloo job on 127.0.0.1, ranks forked warm (benchmarks/ranks.py); rank 0's figures."""
    return run_ranks("trainwreck.benchmarks.barrier", world, ["--timeout", str(timeout_s)], "monitored_barrier")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.barrier",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1.0, help="monitored_barrier's timeout, seconds")
    parser.add_argument("--rank", type=int, help="internal: run one rank of the job")
    parser.add_argument("--port", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.world < 2:
        print(f"--world: {args.world} is too small; one rank must call the barrier while another is held back "
              "(use --world 2 or more)", file=sys.stderr)
        sys.exit(2)
    if not 0 < args.timeout <= 60:
        print(f"--timeout: {args.timeout} is not in (0, 60] seconds; give e.g. --timeout 1", file=sys.stderr)
        sys.exit(2)
    if args.rank is None:
        print(json.dumps(measure(args.world, args.timeout), indent=1))
    else:
        _rank(args.rank, args.world, args.port, args.timeout, args.out)


if __name__ == "__main__":
    main()
