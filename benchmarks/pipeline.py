"""A pipeline bubble, measured: p real processes as pipeline stages on loopback gloo, GPipe against 1F1B.

Each stage is a process holding a few Linear layers; a micro-batch's activation goes forward with
torch.distributed send/recv, its gradient comes back the same way. GPipe runs every micro-batch's
forward, then every backward; 1F1B (PipeDream-Flush) runs p - s - 1 forwards on stage s, then
alternates one forward and one backward, then drains. For each schedule and m micro-batches a step is
timed on every stage from a common start (a barrier) to a common end (another) as computing (inside a
forward or a backward), blocked (waiting in recv for a neighbour, for its own sends to be taken, or at
the step's end for the slowest stage), starting sends (gloo moves part of the bytes inside isend) and
the rest (Python between them). The measured bubble is the blocked share of all stages' time; the
formula's (p - 1)/(m + p - 1) is the handbook's to put beside it. The schedules and micro-batch counts
are timed in interleaved rounds, so each sees the same load from the machine's other jobs.

Why blocked time and not wall minus busy: the machine this runs on has 2 cores shared with other jobs.
When a stage loses its core, its compute stretches and its neighbour waits longer by the same amount,
so the ratio of waiting to computing keeps the schedule's shape; each stage's CPU time inside its
compute (its `cpu_share`) says how much of that compute it really had a core for. A wait is a
dependency not yet met, whatever the load. 4 stages on 2 cores cannot all compute at once, so the
p = 4 figures (`--stages 2,4`) include that contention (the JSON names the cores).

Activations held: a saved-tensors hook counts the bytes autograd keeps for each micro-batch's backward
(parameters excluded); a stage holds a micro-batch from its forward to its backward, so the peak count
in flight and the peak bytes are counted, not computed: GPipe holds all m, 1F1B at most p - s.

    python -m trainwreck.benchmarks.pipeline [--stages 2] [--micro 1,2,4,8] [--repeats 7]   # one JSON object
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainwreck.benchmarks.ranks import run_ranks

WIDTH, LAYERS, ROWS = 256, 4, 1024
"""Each stage: 4 Linear(256, 256) + ReLU; a micro-batch is 1024 rows (a 1 MiB activation), so its forward
and backward take about 13 ms on one core here, large against a loopback send."""
STAGES, MICRO = (2,), (1, 2, 4, 8)
"""What the handbook measures: 2 stages, one per core when the machine is quiet. `--stages 2,4` adds a
4-stage job, about 45 s more here, which the handbook leaves out for its cost (docs/HANDBOOK.md has its
figures)."""
SCHEDULES = ("gpipe", "1f1b")
WARMUP, REPEATS = 1, 7
FWD_TAG, BWD_TAG = 0, 1 << 16


def order(schedule: str, stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """The stage's operations in order: ("F", i) forward of micro-batch i, ("B", i) its backward."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


class Stage:
    """One pipeline stage: its layers, its neighbours, and the clocks of one step."""

    def __init__(self, rank: int, stages: int):
        torch.manual_seed(rank)
        self.rank, self.stages = rank, stages
        self.model = torch.nn.Sequential(*[m for _ in range(LAYERS) for m in (torch.nn.Linear(WIDTH, WIDTH),
                                                                              torch.nn.ReLU())])
        self.params = {p.untyped_storage().data_ptr() for p in self.model.parameters()}

    def _saved(self) -> tuple[Any, dict[int, int]]:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self.params:
                seen[ptr] = t.untyped_storage().nbytes()
            return t
        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), seen

    def _wait(self, work: Any, clock: dict[str, float], key: str) -> None:
        started = time.perf_counter()
        work.wait()
        clock[key] += time.perf_counter() - started

    def _post(self, tensor: torch.Tensor, dst: int, tag: int, sends: list[Any], clock: dict[str, float]) -> None:
        """Start a send; gloo does part of the transfer in the call, so that time is the stage's sending."""
        started = time.perf_counter()
        sends.append(dist.isend(tensor, dst, tag=tag))
        clock["send_post_s"] += time.perf_counter() - started

    def step(self, schedule: str, m: int) -> dict[str, Any]:
        """One step of m micro-batches; every stage leaves it together (the step's end is a barrier)."""
        s, last = self.rank, self.rank == self.stages - 1
        clock = {"compute_s": 0.0, "compute_cpu_s": 0.0, "recv_wait_s": 0.0, "send_wait_s": 0.0, "end_wait_s": 0.0,
                 "send_post_s": 0.0}
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        held: dict[int, int] = {}
        sends: list[Any] = []
        in_flight = peak_in_flight = peak_bytes = per_micro_batch = 0
        self.model.zero_grad(set_to_none=True)
        # Inputs and receive buffers made before the clock starts: a stage's step is its compute and its waits.
        fresh = {i: (torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(i)) if s == 0
                     else torch.empty(ROWS, WIDTH)) for i in range(m)}
        grads = {i: torch.empty(ROWS, WIDTH) for i in range(m)} if not last else {}
        dist.barrier()
        started = time.perf_counter()
        for op, i in order(schedule, s, self.stages, m):
            if op == "F":
                x = fresh.pop(i)
                if s > 0:
                    self._wait(dist.irecv(x, s - 1, tag=FWD_TAG + i), clock, "recv_wait_s")
                x.requires_grad_(s > 0)
                hooks, seen = self._saved()
                t0, c0 = time.perf_counter(), time.thread_time()
                with hooks:
                    y = self.model(x)
                    if last:
                        y = y.square().mean()
                clock["compute_s"] += time.perf_counter() - t0
                clock["compute_cpu_s"] += time.thread_time() - c0
                inputs[i], outputs[i], held[i] = x, y, sum(seen.values())
                per_micro_batch = max(per_micro_batch, held[i])
                in_flight += 1
                peak_in_flight = max(peak_in_flight, in_flight)
                peak_bytes = max(peak_bytes, sum(held.values()))
                if not last:
                    self._post(y.detach(), s + 1, FWD_TAG + i, sends, clock)
            else:
                grad = grads.pop(i, None)
                if grad is not None:
                    self._wait(dist.irecv(grad, s + 1, tag=BWD_TAG + i), clock, "recv_wait_s")
                t0, c0 = time.perf_counter(), time.thread_time()
                outputs.pop(i).backward(grad)
                clock["compute_s"] += time.perf_counter() - t0
                clock["compute_cpu_s"] += time.thread_time() - c0
                x = inputs.pop(i)
                held.pop(i)
                in_flight -= 1
                if s > 0:
                    self._post(x.grad, s - 1, BWD_TAG + i, sends, clock)
        for work in sends:
            self._wait(work, clock, "send_wait_s")
        self._wait(dist.barrier(async_op=True), clock, "end_wait_s")
        ended = time.perf_counter()
        digest = sum(float(p.grad.double().abs().sum()) for p in self.model.parameters())
        blocked = clock["recv_wait_s"] + clock["send_wait_s"] + clock["end_wait_s"]
        return {**clock, "blocked_s": blocked, "own_s": ended - started,
                "other_s": ended - started - clock["compute_s"] - blocked - clock["send_post_s"],
                "started": started, "ended": ended,
                "peak_in_flight": peak_in_flight, "peak_saved_bytes": peak_bytes,
                "saved_bytes_per_micro_batch": per_micro_batch,
                "grad_digest": digest}


def _summary(steps: list[list[dict[str, Any]]], stages: int, m: int) -> dict[str, Any]:
    """The median step (by measured bubble) of REPEATS, every stage of it, and the repeats' spread."""
    rows = []
    for per_stage in steps:
        compute = sum(r["compute_s"] for r in per_stage)
        blocked = sum(r["blocked_s"] for r in per_stage)
        wall = max(r["ended"] for r in per_stage) - min(r["started"] for r in per_stage)
        rows.append({"bubble": blocked / sum(r["own_s"] for r in per_stage),
                     "idle_of_wall": 1 - compute / (stages * wall),
                     "step_s": wall, "stages": per_stage})
    rows.sort(key=lambda r: r["bubble"])
    mid = rows[len(rows) // 2]
    keep = ("own_s", "compute_s", "compute_cpu_s", "blocked_s", "recv_wait_s", "send_wait_s", "end_wait_s",
            "send_post_s", "other_s",
            "peak_in_flight", "peak_saved_bytes", "saved_bytes_per_micro_batch")
    return {"stages": stages, "micro_batches": m, "bubble": mid["bubble"], "idle_of_wall": mid["idle_of_wall"],
            "step_s": mid["step_s"], "bubble_min": rows[0]["bubble"], "bubble_max": rows[-1]["bubble"],
            "cpu_share": sum(r["compute_cpu_s"] for r in mid["stages"]) / sum(r["compute_s"] for r in mid["stages"]),
            "peak_in_flight": max(r["peak_in_flight"] for r in mid["stages"]),
            "peak_saved_bytes": max(r["peak_saved_bytes"] for r in mid["stages"]),
            "grad_digest": [r["grad_digest"] for r in mid["stages"]],
            "per_stage": [{"stage": s, **{k: r[k] for k in keep}} for s, r in enumerate(mid["stages"])]}


def _measure(stage: Stage, micro: list[int], repeats: int) -> dict[str, Any]:
    """Every (schedule, m) once to warm up, then `repeats` rounds of all of them: interleaved, so both
    schedules are timed under the same load from the machine's other jobs."""
    cases = [(schedule, m) for m in micro for schedule in SCHEDULES]
    for schedule, m in cases * WARMUP:
        stage.step(schedule, m)
    steps: dict[tuple[str, int], list[dict[str, Any]]] = {case: [] for case in cases}
    for _ in range(repeats):
        for schedule, m in cases:
            steps[schedule, m].append(stage.step(schedule, m))
    gathered: list[Any] = [None] * stage.stages
    dist.all_gather_object(gathered, list(steps.values()))
    out: dict[str, Any] = {s: {} for s in SCHEDULES}
    for i, (schedule, m) in enumerate(cases):
        per_step = [list(stages) for stages in zip(*(g[i] for g in gathered))]
        out[schedule][f"m{m}"] = _summary(per_step, stage.stages, m)
    return out


def _rank(rank: int, world: int, port: int, micro: list[int], repeats: int, out: Path) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    result = _measure(Stage(rank, world), micro, repeats)
    if rank == 0:
        out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def measure(stages: list[int], micro: list[int], repeats: int = REPEATS) -> dict[str, Any]:
    """One gloo job per pipeline depth (benchmarks/ranks.py: forked warm, on 127.0.0.1)."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    runs = {f"p{p}": run_ranks("trainwreck.benchmarks.pipeline", p, ["--micro", ",".join(map(str, micro)),
                                                                     "--repeats", str(repeats)],
                               f"{p}-stage pipeline") for p in stages}
    return {"method": "time blocked in recv, in send and at the step's end against time computing, per stage",
            "backend": "gloo", "cores": os.cpu_count(), "load_average_1m": round(load, 2), "threads": 1,
            "width": WIDTH, "layers_per_stage": LAYERS, "micro_batch_rows": ROWS,
            "activation_bytes": ROWS * WIDTH * 4, "repeats": repeats, "stages": stages, "micro_batches": micro,
            "wall_s": round(time.perf_counter() - started, 2), **runs}


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.pipeline",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=_ints, default=list(STAGES), help="pipeline depths, comma-separated")
    parser.add_argument("--micro", type=_ints, default=list(MICRO), help="micro-batch counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help="timed steps per schedule and m (the median is kept)")
    parser.add_argument("--rank", type=int, help="internal: run one stage of the job")
    parser.add_argument("--world", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rank is not None:
        _rank(args.rank, args.world, args.port, args.micro, args.repeats, args.out)
        return
    if min(args.stages) < 2:
        print(f"--stages: {min(args.stages)} is too few; a pipeline needs at least 2 stages (use --stages 2)",
              file=sys.stderr)
        sys.exit(2)
    print(json.dumps(measure(args.stages, args.micro, args.repeats), indent=1))


if __name__ == "__main__":
    main()
