"""Instrumentation overhead: step time with events, digests and phase timers on vs off.

One rank in this process (gloo, world size 1) trains two identical trainers that
differ only in `instrument`. A single rank has no communication time to hide behind, so
the ratio is an upper bound on what a multi-rank step pays.

The figure comes from paired differences: the two trainers take single steps in turn
(on, off, then off, on, ...), each pair's difference is taken, and the mean of the middle
half of the differences is divided by the median uninstrumented step. Each step is timed in the
process's CPU time, not wall time: what the instrumentation costs is CPU work (JSON,
digests, writes to the page cache; nothing is fsynced per step), and on a shared machine
a step's wall time also holds whatever the neighbours took from the core meanwhile.
Medians of 5-step blocks timed by the wall clock gave 0.41-3.24 % in three runs. On the
same loaded machine (load 3-4), 60 pairs in CPU time gave 0.92-1.63 % in four runs this
way, 0.94-2.12 % by their median difference (-1.61 % once at load 7), and 30 pairs
1.05-2.85 % in six, so a run takes 60 pairs or more; three back-to-back `--quick` runs of
60 pairs on the quiet machine then gave 1.75 / 3.46 / 1.85 %, so `--quick` takes 120 pairs,
as the full run does. The wall-clock figure, paired the
same way, is reported beside it (`instrumentation_overhead_wall_pct`).
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainwreck.trainer.config import TrainConfig, backend_fields
from trainwreck.trainer.hooks import NoHooks
from trainwreck.trainer.launch import RankContext, pick_device
from trainwreck.trainer.loop import Trainer
from trainwreck.trainer.probe import Probe


def _trainer(cfg: TrainConfig, run_dir: Path, attempt: int) -> Trainer:
    ctx = RankContext(run_dir=run_dir, rank=0, world_size=1, attempt=attempt)
    return Trainer(ctx, cfg, pick_device(cfg.device, 0), Probe(run_dir, 0, 1, attempt), NoHooks())


def _direct_cost(trainer: Trainer, repeats: int = 20) -> float:
    """Seconds per step of the instrumentation work itself: digest, both events, loss reduction."""
    from trainwreck.trainer.state import state_digest

    ids = torch.arange(trainer.cfg.global_batch)
    loss = torch.tensor(1.0)
    started = time.perf_counter()
    for _ in range(repeats):
        trainer.probe.batch(0, 0, ids.tolist())
        trainer.global_mean(loss, trainer.cfg.global_batch)
        trainer.probe.step(0, 1.0, state_digest(trainer.state), lr=0.0, phases={"data": 0.0, "forward": 0.0})
    return (time.perf_counter() - started) / repeats


def bench_instrumentation(cfg: TrainConfig | None = None, pairs: int = 60, warmup_steps: int = 3) -> dict[str, Any]:
    """Per-step seconds with instrumentation on and off and the overhead in percent, from
    `pairs` pairs of steps (see the module's docstring)."""
    cfg = cfg or TrainConfig(**backend_fields("gloo"))  # a CPU figure on a GPU host too
    torch.set_num_threads(1)
    total = warmup_steps + pairs
    cfg = replace(cfg, total_steps=total, ckpt_interval=total)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with tempfile.TemporaryDirectory(prefix="tw-instr-") as tmp:
            on = _trainer(replace(cfg, instrument=True), Path(tmp) / "on", 0)
            off = _trainer(replace(cfg, instrument=False), Path(tmp) / "off", 0)
            for trainer in (on, off):  # warm both (allocator, first-call paths)
                for s in range(1, warmup_steps + 1):
                    trainer.train_step(s)
            cpu, wall = _paired_steps(on, off, range(warmup_steps + 1, total + 1))
            direct_s = _direct_cost(on)
            on.events.close()
            off.events.close()
    finally:
        if owns_group:
            dist.destroy_process_group()
    on_s, off_s = statistics.median(cpu[True]), statistics.median(cpu[False])
    return {
        "instrumentation_step_on_s": round(on_s, 6),
        "instrumentation_step_off_s": round(off_s, 6),
        "instrumentation_overhead_pct": round(_paired_overhead_pct(cpu), 2),
        "instrumentation_overhead_wall_pct": round(_paired_overhead_pct(wall), 2),
        "instrumentation_direct_s": round(direct_s, 6),
        "instrumentation_direct_pct": round(direct_s / off_s * 100.0, 2),
        "instrumentation_model": {"width": cfg.width, "depth": cfg.depth, "global_batch": cfg.global_batch,
                                  "params": sum(p.numel() for p in on.state.model.parameters())},
    }


Samples = dict[bool, list[float]]
"""Seconds per step, by `instrument` (True: on), in the order the pairs were taken."""


def _paired_steps(on: Trainer, off: Trainer, steps: range) -> tuple[Samples, Samples]:
    """CPU and wall seconds of each trainer's step, one pair per step number; which of the
    two goes first alternates, so neither always runs on the other's warm caches."""
    cpu: Samples = {True: [], False: []}
    wall: Samples = {True: [], False: []}
    for index, step in enumerate(steps):
        pair = ((on, True), (off, False)) if index % 2 == 0 else ((off, False), (on, True))
        for trainer, flag in pair:
            cpu_started, started = time.process_time(), time.perf_counter()
            trainer.train_step(step)
            cpu[flag].append(time.process_time() - cpu_started)
            wall[flag].append(time.perf_counter() - started)
    return cpu, wall


def _paired_overhead_pct(samples: Samples) -> float:
    """The interquartile mean of the pairs' differences (on - off: the middle half, the
    quarter of pairs a neighbour hit hardest either way left out), in percent of the median
    off step. The median alone rests on one or two pairs and moved twice as far."""
    differences = sorted(with_ - without for with_, without in zip(samples[True], samples[False]))
    quarter = len(differences) // 4
    middle = differences[quarter:len(differences) - quarter]
    return statistics.fmean(middle) / statistics.median(samples[False]) * 100.0

if __name__ == "__main__":
    print(json.dumps(bench_instrumentation(), indent=1))
