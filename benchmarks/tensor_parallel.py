"""Megatron-style tensor parallelism, measured: a column-then-row parallel MLP on 2 gloo ranks against the
same MLP on one device, and the bytes its one all-reduce moves.

"How does tensor parallelism split a layer, and what does it communicate?" The MLP is
y = gelu(x W1ᵀ + b1) W2ᵀ + b2 (W1: ffn × hidden, W2: hidden × ffn). Rank r keeps the rows of W1 (the
first linear's output columns) and of b1 for its slice of ffn, and the matching columns of W2 (the second
linear's input rows): its gelu needs no other rank's columns, and x W1ᵣᵀ → gelu → W2ᵣ gives a partial y of
full shape whose sum over ranks is y. So the forward pays exactly one all-reduce, of tokens × hidden
elements, and none between the two matrices. Every rank builds the same full weights from one seed,
computes the one-device output itself, and compares: the maximum absolute difference is measured. The
collectives are counted as they are issued (calls and payload bytes), not computed.

    python -m trainwreck.benchmarks.tensor_parallel [--world 2]   # one JSON object
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainwreck.benchmarks.ranks import run_ranks

HIDDEN, FFN, BATCH, SEQ = 64, 256, 4, 8
"""Tiny and configured: 4 sequences of 8 tokens, hidden 64, ffn 4 × hidden (the transformer's usual ratio)."""
TOLERANCE = 1e-5
"""fp32: the split sums the second matmul's products in another order, which moves the last bits only."""


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """The full MLP's weights, the same on every rank (nn.Linear layout: out_features × in_features)."""
    g = torch.Generator().manual_seed(seed)
    return {"w1": torch.randn(FFN, HIDDEN, generator=g) / HIDDEN ** 0.5, "b1": torch.randn(FFN, generator=g),
            "w2": torch.randn(HIDDEN, FFN, generator=g) / FFN ** 0.5, "b2": torch.randn(HIDDEN, generator=g),
            "x": torch.randn(BATCH, SEQ, HIDDEN, generator=g)}


def one_device(w: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.linear(F.gelu(F.linear(w["x"], w["w1"], w["b1"])), w["w2"], w["b2"])


def shard(w: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    """Rank's slice: W1 and b1 by output column (rows of W1), W2 by input row (its columns); b2 whole."""
    cols = slice(rank * FFN // world, (rank + 1) * FFN // world)
    return {"w1": w["w1"][cols].contiguous(), "b1": w["b1"][cols].contiguous(),
            "w2": w["w2"][:, cols].contiguous(), "b2": w["b2"], "x": w["x"]}


def tensor_parallel(part: dict[str, torch.Tensor], log: list[dict[str, Any]]) -> torch.Tensor:
    """The column-then-row MLP on this rank's slice; every collective it issues is appended to `log`."""
    hidden = F.gelu(F.linear(part["x"], part["w1"], part["b1"]))  # this rank's ffn columns: no communication
    partial = F.linear(hidden, part["w2"])  # full shape, a partial sum over this rank's ffn rows
    log.append({"op": "all_reduce", "bytes": partial.nbytes, "elements": partial.numel()})
    dist.all_reduce(partial)
    return partial + part["b2"]  # the bias once, after the sum


def _rank(rank: int, world: int, port: int, out: Path) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    w = weights()
    log: list[dict[str, Any]] = []
    y = tensor_parallel(shard(w, rank, world), log)
    diffs: list[Any] = [None] * world
    dist.all_gather_object(diffs, float((y - one_device(w)).abs().max()))
    if rank == 0:
        part = shard(w, rank, world)
        out.write_text(json.dumps({
            "world_size": world, "backend": "gloo", "dtype": "float32", "cores": os.cpu_count(),
            "hidden": HIDDEN, "ffn": FFN, "batch": BATCH, "seq": SEQ, "tokens": BATCH * SEQ,
            "bytes_per_element": w["x"].element_size(),
            "w1_shard_shape": list(part["w1"].shape), "w2_shard_shape": list(part["w2"].shape),
            "collectives": log, "collectives_per_layer": len(log),
            "allreduce_bytes_per_layer": sum(c["bytes"] for c in log),
            "max_abs_diff": max(diffs), "max_abs_diff_per_rank": diffs, "tolerance": TOLERANCE,
            "equal_within_tolerance": max(diffs) <= TOLERANCE}))
    dist.barrier()
    dist.destroy_process_group()


def measure(world: int = 2) -> dict[str, Any]:
    """One gloo job on 127.0.0.1 (benchmarks/ranks.py); rank 0's figures."""
    return run_ranks("trainwreck.benchmarks.tensor_parallel", world, [], "tensor-parallel MLP")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.tensor_parallel",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rank", type=int, help="internal: run one rank of the job")
    parser.add_argument("--port", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.world < 2 or FFN % args.world:
        print(f"--world {args.world}: expected at least 2 ranks dividing ffn {FFN} (use --world 2)", file=sys.stderr)
        sys.exit(2)
    if args.rank is None:
        print(json.dumps(measure(args.world), indent=1))
    else:
        _rank(args.rank, args.world, args.port, args.out)


if __name__ == "__main__":
    main()
