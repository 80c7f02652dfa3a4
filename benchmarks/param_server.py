"""A parameter server against all-reduce, measured: a tiny server over send/recv as workers go from 1 to 4.

"Parameter server or all-reduce?" Rank 0 is the server: in a step every worker sends it a gradient of D
bytes, it sums them, updates its parameters and sends each worker the new ones. Its inbound bytes per step
are counted as they arrive (N × D for N workers: they all land on one rank's link), and timed from the
receives being posted to the last gradient in. Beside it the same N workers all-reduce the same gradient
with the ring of benchmarks/ring_tree.py (counted: 2(N - 1)/N × D sent per rank, whatever N).

One gloo job of 5 processes on 127.0.0.1; for N workers ranks 0..N take part and the rest wait at a
barrier. The machine's cores are in the JSON and every row says whether it ran more busy processes than
cores (`oversubscribed`): there, a step also waits for a core, so its time and bandwidth say as much about
this machine as about the design. The bytes do not depend on the machine.

    python -m trainwreck.benchmarks.param_server   # one JSON object
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainwreck.benchmarks.ranks import gloo_rank, run_ranks
from trainwreck.benchmarks.ring_tree import Sent, ring_allreduce

GRAD_BYTES = 3 << 18
"""A 768 KiB fp32 gradient (configured): large enough that bytes, not the per-message latency, dominate, and
divisible into 1 to 4 equal ring chunks."""
WORKERS = (1, 2, 3, 4)
WARMUP, REPEATS = 1, 5
LR = 0.1


def _server_step(params: torch.Tensor, workers: list[int]) -> dict[str, Any]:
    bufs = {w: torch.empty_like(params) for w in workers}
    started = time.perf_counter()
    for work in [dist.irecv(bufs[w], w, tag=0) for w in workers]:
        work.wait()
    received = time.perf_counter()
    params.sub_(LR * torch.stack(list(bufs.values())).mean(0))
    for work in [dist.isend(params, w, tag=1) for w in workers]:
        work.wait()
    return {"inbound_bytes": sum(b.nbytes for b in bufs.values()), "recv_s": received - started,
            "step_s": time.perf_counter() - started}


def _worker_step(params: torch.Tensor, grad: torch.Tensor) -> None:
    works = [dist.isend(grad, 0, tag=0), dist.irecv(params, 0, tag=1)]
    for work in works:
        work.wait()


def _measure(world: int) -> dict[str, Any]:
    rank, numel, cores = dist.get_rank(), GRAD_BYTES // 4, os.cpu_count() or 1
    rows = []
    for n in WORKERS:
        workers = list(range(1, n + 1))
        params, grad = torch.zeros(numel), torch.full((numel,), float(rank))
        server: list[dict[str, Any]] = []
        allreduce: list[float] = []
        sent = Sent()
        for r in range(WARMUP + REPEATS):
            dist.barrier()
            if rank == 0:
                step = _server_step(params, workers)
                if r >= WARMUP:
                    server.append(step)
            elif rank in workers:
                _worker_step(params, grad)
        for r in range(WARMUP + REPEATS):
            dist.barrier()
            if rank in workers:
                t, sent = grad.clone(), Sent()
                started = time.perf_counter()
                ring_allreduce(t, workers, sent)
                if r >= WARMUP:
                    allreduce.append(time.perf_counter() - started)
        # the parameters after the last step: every worker's gradient averaged in, so the update is checked
        expected = -LR * (WARMUP + REPEATS) * sum(workers) / n
        per_rank: list[Any] = [None] * world
        dist.all_gather_object(per_rank, {"sent": sent.bytes, "allreduce_s": statistics.median(allreduce)
                                          if allreduce else None, "param0": float(params[0])})
        if rank == 0:
            mid = sorted(server, key=lambda s: s["recv_s"])[len(server) // 2]
            rows.append({
                "workers": n, "busy_processes_ps": n + 1, "busy_processes_allreduce": n, "cores": cores,
                "oversubscribed": n + 1 > cores, "grad_bytes": GRAD_BYTES,
                "server_inbound_bytes": mid["inbound_bytes"], "server_recv_s": mid["recv_s"],
                "server_step_s": mid["step_s"],
                "server_inbound_bytes_per_s": mid["inbound_bytes"] / mid["recv_s"],
                "server_update_ok": abs(float(params[0]) - expected) < 1e-4,
                "allreduce_sent_bytes_per_worker": [per_rank[w]["sent"] for w in workers],
                "allreduce_s": max(per_rank[w]["allreduce_s"] for w in workers),
                "allreduce_oversubscribed": n > cores})
    return {"world_size": world, "backend": "gloo", "dtype": "float32", "cores": cores, "repeats": REPEATS,
            "grad_bytes": GRAD_BYTES, "workers": list(WORKERS), "rows": {f"n{r['workers']}": r for r in rows}}


def measure() -> dict[str, Any]:
    """One gloo job of a server and up to 4 workers on 127.0.0.1 (benchmarks/ranks.py)."""
    return run_ranks("trainwreck.benchmarks.param_server", max(WORKERS) + 1, [], "parameter server")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.param_server",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, help="internal: run one rank of the job")
    parser.add_argument("--world", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rank is None:
        print(json.dumps(measure(), indent=1))
    else:
        gloo_rank(args.rank, args.world, args.port, args.out, _measure)


if __name__ == "__main__":
    main()
