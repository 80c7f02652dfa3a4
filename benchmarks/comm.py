"""What a gradient all-reduce costs, measured: gloo on loopback across message sizes, and the
one all-reduce per parameter, as the reference trainer's hook reduces a model past DDP's first bucket,
against one bucketed all-reduce of the same bytes.

The trainer folds the all-reduce into its "backward" phase (DDP overlaps it with the backward
pass), so no run's phases show it; this job times the collective alone. A ring all-reduce moves
2(n-1)/n * D bytes per rank for a D-byte message; the JSON says which n and D it timed, and the
handbook's "comm" chapter does the arithmetic from them. The per-parameter list is the parameters
of benchmarks/fsdp.py's model (the model the handbook's byte measurements count), so the comparison
is the one trainer/gradsync.py pays for exact digests on a model past DDP's first bucket, as this one is
(`model.hook` says which of its two layouts the trainer's hook gives this model).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainwreck.benchmarks.fsdp import SPEC
from trainwreck.benchmarks.ranks import gloo_rank, run_ranks
from trainwreck.trainer.gradsync import ONE_BUCKET_BYTES, ParameterOrder
from trainwreck.trainer.model import MLP

SIZES_BYTES = (4 << 10, 64 << 10, 1 << 20, 8 << 20)
"""fp32 messages from 4 KiB to 8 MiB (the reference model's gradients are about 8.4 MB)."""
WARMUP, REPEATS = 1, 5


def _timed(op: Callable[[], None]) -> float:
    """Median seconds of `op` over REPEATS, every rank starting each repeat together."""
    for _ in range(WARMUP):
        op()
    seconds = []
    for _ in range(REPEATS):
        dist.barrier()
        started = time.perf_counter()
        op()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _per_parameter(grads: list[torch.Tensor]) -> Callable[[], None]:
    """trainer/gradsync.py's pattern: every parameter's all-reduce issued, then all awaited."""
    def op() -> None:
        for work in [dist.all_reduce(g, async_op=True) for g in grads]:
            work.wait()
    return op


def _measure(world: int) -> dict[str, Any]:
    sizes = []
    for nbytes in SIZES_BYTES:
        buf = torch.ones(nbytes // 4)
        sizes.append({"bytes": nbytes, "seconds": _timed(lambda: dist.all_reduce(buf))})
    model = MLP(SPEC)
    shapes = [p.shape for p in model.parameters()]
    grads = [torch.ones(s) for s in shapes]
    flat = torch.ones(sum(g.numel() for g in grads))
    return {"world_size": world, "backend": dist.get_backend(), "dtype": "float32", "repeats": REPEATS,
            "sizes": sizes,
            "model": {"parameters": len(grads), "numel": flat.numel(), "bytes": flat.nbytes,
                      "one_bucket_bytes": ONE_BUCKET_BYTES,
                      "hook": "flat" if ParameterOrder(model).flat else "per_parameter",
                      "per_parameter_s": _timed(_per_parameter(grads)),
                      "bucketed_s": _timed(lambda: dist.all_reduce(flat))}}


def measure(world: int) -> dict[str, Any]:
    """One gloo job on 127.0.0.1, ranks forked warm (benchmarks/ranks.py); rank 0's figures."""
    return run_ranks("trainwreck.benchmarks.comm", world, [], "all-reduce")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.comm", description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rank", type=int, help="internal: run one rank of the job")
    parser.add_argument("--port", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.world < 2:
        print(f"--world: {args.world} is too small; an all-reduce needs at least 2 ranks (use --world 2)",
              file=sys.stderr)
        sys.exit(2)
    if args.rank is None:
        print(json.dumps(measure(args.world), indent=1))
    else:
        gloo_rank(args.rank, args.world, args.port, args.out, _measure)


if __name__ == "__main__":
    main()
