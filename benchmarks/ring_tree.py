"""Ring against tree all-reduce, both built from point-to-point isend/irecv on gloo ranks, against the α-β model.

"Ring or tree: which wins where?" Both algorithms are written here from send and receive, so what each
rank sends is counted as it is sent (bytes and messages, per rank) rather than quoted from a paper:

- ring: the tensor in n chunks; n - 1 rounds of reduce-scatter (send a chunk right, add the one from the
  left), then n - 1 of all-gather. 2(n - 1) rounds, each moving D/n bytes per rank.
- tree (binomial, n a power of two): log2 n rounds reducing the whole tensor towards rank 0, then log2 n
  rounds broadcasting the sum back. 2 log2 n rounds, each moving all D bytes.

The α-β model prices a message of D bytes at α + D·β. α and β are fitted from a ping-pong between ranks
0 and 1 at a few sizes (the others wait at a barrier), by least squares of one-way time against bytes
(α the intercept, β the slope). The model then gives
ring = 2(n-1)(α + D/n·β) and tree = 2·log2 n·(α + D·β), each put beside the measured median time. Every
rank's result is checked exactly against the known sum (integer-valued fp32, so exact).

The machine's cores are reported: with more ranks than cores, ranks take turns on a core and every round
pays for a wake-up, which the fitted α (measured with two busy ranks) does not hold.

    python -m trainwreck.benchmarks.ring_tree [--world 4]   # one JSON object
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainwreck.benchmarks.ranks import gloo_rank, run_ranks

SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 22)
"""fp32 messages of 1 KiB, 16 KiB, 256 KiB and 4 MiB: from latency-bound to bandwidth-bound on loopback."""
PING_SIZES = (4, 1 << 12, 1 << 16, 1 << 20, 1 << 22)
"""The ping-pong's sizes for the α-β fit, 4 bytes to 4 MiB."""
WARMUP, REPEATS = 1, 7


class Sent:
    """What one rank sent: bytes and messages, counted at each isend."""

    def __init__(self) -> None:
        self.bytes = self.messages = 0

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> Any:
        self.bytes += tensor.nbytes
        self.messages += 1
        return dist.isend(tensor, dst, tag=tag)


def ring_allreduce(t: torch.Tensor, ranks: list[int], sent: Sent) -> int:
    """Sum `t` over `ranks` in place (this process is one of them); returns the rounds it took."""
    n, i = len(ranks), ranks.index(dist.get_rank())
    if n == 1:
        return 0
    if t.numel() % n:
        raise ValueError(f"the ring here splits {t.numel()} elements into {n} equal chunks: pad to a multiple of {n}")
    chunks = list(t.chunk(n))
    right, left = ranks[(i + 1) % n], ranks[(i - 1) % n]
    buf = torch.empty_like(chunks[0])
    for s in range(n - 1):  # reduce-scatter: afterwards this rank holds the whole sum of chunk (i + 1) % n
        works = [sent.send(chunks[(i - s) % n], right, s), dist.irecv(buf, left, tag=s)]
        for w in works:
            w.wait()
        chunks[(i - s - 1) % n].add_(buf)
    for s in range(n - 1):  # all-gather: pass the finished chunks round
        works = [sent.send(chunks[(i + 1 - s) % n], right, n + s), dist.irecv(chunks[(i - s) % n], left, tag=n + s)]
        for w in works:
            w.wait()
    return 2 * (n - 1)


def tree_allreduce(t: torch.Tensor, ranks: list[int], sent: Sent) -> int:
    """Binomial-tree reduce to ranks[0], then broadcast back down the same tree; returns the rounds."""
    n, i = len(ranks), ranks.index(dist.get_rank())
    levels = int(math.log2(n))
    if 1 << levels != n:
        raise ValueError(f"the binomial tree here needs a power-of-two world, not {n}")
    buf = torch.empty_like(t)
    for k in range(levels):  # reduce: at round k the ranks at odd multiples of 2^k hand their sum down
        m = 1 << k
        if i % (2 * m) == m:
            sent.send(t, ranks[i - m], k).wait()
            break
        if i % (2 * m) == 0:
            dist.irecv(buf, ranks[i + m], tag=k).wait()
            t.add_(buf)
    for k in reversed(range(levels)):  # broadcast: the same edges, the other way
        m = 1 << k
        if i % (2 * m) == 0:
            sent.send(t, ranks[i + m], levels + k).wait()
        elif i % (2 * m) == m:
            dist.irecv(t, ranks[i - m], tag=levels + k).wait()
    return 2 * levels


ALGORITHMS: dict[str, Callable[[torch.Tensor, list[int], Sent], int]] = {"ring": ring_allreduce,
                                                                          "tree": tree_allreduce}


def pattern(numel: int, rank: int) -> torch.Tensor:
    """Integer-valued fp32 input: (k % 7 + 1) * (rank + 1), so the sum over ranks is exact."""
    return (torch.arange(numel) % 7 + 1).float() * (rank + 1)


def fit_alpha_beta(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least squares of seconds = α + β·bytes over the ping-pong's sizes; α kept at or above 0."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    beta = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / sum((x - mx) ** 2 for x in sizes)
    return max(my - beta * mx, 0.0), beta


def _gathered_max(value: float, world: int) -> float:
    values: list[Any] = [None] * world
    dist.all_gather_object(values, value)
    return max(values)


def _ping_pong(nbytes: int) -> float:
    """Median one-way seconds of an nbytes message between ranks 0 and 1 (half the round trip)."""
    rank, buf, times = dist.get_rank(), torch.zeros(nbytes // 4), []
    for r in range(WARMUP + REPEATS):
        dist.barrier()
        if rank > 1:
            continue
        started = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1, tag=r)
            dist.recv(buf, 1, tag=r)
        else:
            dist.recv(buf, 0, tag=r)
            dist.send(buf, 0, tag=r)
        if r >= WARMUP:
            times.append((time.perf_counter() - started) / 2)
    return statistics.median(times) if rank <= 1 else 0.0


def _measure(world: int) -> dict[str, Any]:
    rank, ranks = dist.get_rank(), list(range(world))
    ping = [{"bytes": b, "one_way_s": _gathered_max(_ping_pong(b), world)} for b in PING_SIZES]
    alpha, beta = fit_alpha_beta([p["bytes"] for p in ping], [p["one_way_s"] for p in ping])
    levels = int(math.log2(world))
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in ALGORITHMS}
    for nbytes in SIZES:
        numel = nbytes // 4
        expected = (torch.arange(numel) % 7 + 1).float() * (world * (world + 1) // 2)
        for name, algorithm in ALGORITHMS.items():
            times, rounds, sent, exact = [], 0, Sent(), True
            for r in range(WARMUP + REPEATS):
                t, counter = pattern(numel, rank), Sent()
                dist.barrier()
                started = time.perf_counter()
                rounds = algorithm(t, ranks, counter)
                elapsed = _gathered_max(time.perf_counter() - started, world)  # the slowest rank's
                exact = exact and bool(torch.equal(t, expected))
                if r >= WARMUP:
                    times.append(elapsed)
                sent = counter  # every repeat sends the same; the last one's counts are kept
            per_rank: list[Any] = [None] * world
            dist.all_gather_object(per_rank, {"bytes": sent.bytes, "messages": sent.messages, "exact": exact})
            model = (2 * (world - 1) * (alpha + nbytes / world * beta) if name == "ring"
                     else 2 * levels * (alpha + nbytes * beta))
            measured = statistics.median(times)
            rows[name].append({"bytes": nbytes, "rounds": rounds, "seconds": measured,
                               "seconds_min": min(times), "seconds_max": max(times), "model_s": model,
                               "measured_over_model": measured / model,
                               "sent_bytes_per_rank": [p["bytes"] for p in per_rank],
                               "messages_per_rank": [p["messages"] for p in per_rank],
                               "max_sent_bytes": max(p["bytes"] for p in per_rank),
                               "exact": all(p["exact"] for p in per_rank)})
    crossover = (world - 1 - levels) * alpha / ((levels - (world - 1) / world) * beta) if beta > 0 else None
    winners = ["tree" if t["seconds"] < r["seconds"] else "ring" for r, t in zip(rows["ring"], rows["tree"])]
    return {"world_size": world, "backend": "gloo", "dtype": "float32", "cores": os.cpu_count(),
            "oversubscribed": world > (os.cpu_count() or 1), "repeats": REPEATS, "sizes": list(SIZES),
            "ping": ping, "alpha_s": alpha, "beta_s_per_byte": beta,
            "bandwidth_bytes_per_s": 1 / beta if beta > 0 else None,
            "fit": "least squares of one-way seconds = alpha + beta * bytes over the ping-pong sizes",
            "model_crossover_bytes": crossover, "measured_winner": winners,
            "ring": rows["ring"], "tree": rows["tree"]}


def measure(world: int = 4) -> dict[str, Any]:
    """One gloo job on 127.0.0.1 (benchmarks/ranks.py); rank 0's figures."""
    return run_ranks("trainwreck.benchmarks.ring_tree", world, [], "ring/tree all-reduce")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.ring_tree",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--rank", type=int, help="internal: run one rank of the job")
    parser.add_argument("--port", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.world < 2 or args.world & (args.world - 1):
        print(f"--world {args.world}: expected a power of two of at least 2 (the binomial tree), e.g. --world 4",
              file=sys.stderr)
        sys.exit(2)
    if args.rank is None:
        print(json.dumps(measure(args.world), indent=1))
    else:
        gloo_rank(args.rank, args.world, args.port, args.out, _measure)


if __name__ == "__main__":
    main()
