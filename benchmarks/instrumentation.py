"""Instrumentation overhead: step time with events, digests and phase timers on vs off.

One rank in this process (gloo, world size 1) trains two identical trainers that
differ only in `instrument`; blocks of steps alternate between them so that machine
noise lands on both. A single rank has no communication time to hide behind, so the
ratio is an upper bound on what a multi-rank step pays.
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

from trainwreck.trainer.config import TrainConfig
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


def bench_instrumentation(cfg: TrainConfig | None = None, blocks: int = 10, steps_per_block: int = 5,
                          warmup_steps: int = 3) -> dict[str, Any]:
    """Median per-step seconds with instrumentation on and off, and the overhead in percent."""
    cfg = cfg or TrainConfig()
    torch.set_num_threads(1)
    total = warmup_steps + blocks * steps_per_block
    cfg = replace(cfg, total_steps=total, ckpt_interval=total)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with tempfile.TemporaryDirectory(prefix="tw-instr-") as tmp:
            on = _trainer(replace(cfg, instrument=True), Path(tmp) / "on", 0)
            off = _trainer(replace(cfg, instrument=False), Path(tmp) / "off", 0)
            times: dict[bool, list[float]] = {True: [], False: []}
            step = 0
            for trainer in (on, off):  # warm both (allocator, first-call paths)
                for s in range(1, warmup_steps + 1):
                    trainer.train_step(s)
            step = warmup_steps
            for _ in range(blocks):
                for trainer, flag in ((on, True), (off, False)):
                    for offset in range(1, steps_per_block + 1):
                        started = time.perf_counter()
                        trainer.train_step(step + offset)
                        times[flag].append(time.perf_counter() - started)
                step += steps_per_block
            direct_s = _direct_cost(on)
            on.events.close()
            off.events.close()
    finally:
        if owns_group:
            dist.destroy_process_group()
    on_s, off_s = statistics.median(times[True]), statistics.median(times[False])
    return {
        "instrumentation_step_on_s": round(on_s, 6),
        "instrumentation_step_off_s": round(off_s, 6),
        "instrumentation_overhead_pct": round((on_s / off_s - 1.0) * 100.0, 2),
        "instrumentation_direct_s": round(direct_s, 6),
        "instrumentation_direct_pct": round(direct_s / off_s * 100.0, 2),
        "instrumentation_model": {"width": cfg.width, "depth": cfg.depth, "global_batch": cfg.global_batch,
                                  "params": sum(p.numel() for p in on.state.model.parameters())},
    }


if __name__ == "__main__":
    print(json.dumps(bench_instrumentation(), indent=1))
