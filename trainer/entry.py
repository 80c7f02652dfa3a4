"""The function every rank calls: pick the trainer by name, join the job, train.

Trainers are listed here explicitly, the reference and its planted defects, so that
`trainer.loop` (the reference) never imports the defects that subclass it."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.defects import DEFECTS
from trainwreck.trainer.events import EventLog
from trainwreck.trainer.hooks import Hooks, NoHooks
from trainwreck.trainer.launch import RankContext, init_process_group, pick_device
from trainwreck.trainer.loop import Trainer, resolve_backend
from trainwreck.trainer.progress import ProgressBoard
from trainwreck.trainer.rundir import RunDir

VARIANTS: dict[str, type[Trainer]] = {"reference": Trainer, **DEFECTS}
"""TrainConfig.variant -> the Trainer class that runs it."""


def trainer_class(name: str) -> type[Trainer]:
    if name not in VARIANTS:
        raise ValueError(f"variant={name!r} is unknown; known variants: {', '.join(sorted(VARIANTS))}")
    return VARIANTS[name]


def run_rank(ctx: RankContext, cfg: TrainConfig, hooks: Hooks | None = None) -> None:
    """Train one rank of one attempt to cfg.total_steps (raises on any failure)."""
    cfg.check_world_size(ctx.world_size)
    device = pick_device(cfg.device, ctx.local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)))
    if device.type == "cpu":
        torch.set_num_threads(1)  # every rank shares the same few cores
    hooks = hooks or NoHooks()
    events = EventLog(RunDir(ctx.run_dir).rank_events(ctx.attempt, ctx.rank, os.getpid()),
                      attempt=ctx.attempt, rank=ctx.rank, world_size=ctx.world_size)
    progress = ProgressBoard(ctx.run_dir, ctx.attempt, ctx.rank)
    try:
        events.emit("start", pid=os.getpid())
        progress.publish(0, "start")
        hooks.bind(events, ctx.rank, ctx.world_size, ctx.attempt)
        init_process_group(ctx, resolve_backend(cfg, device))
        try:
            trainer_class(cfg.variant)(ctx, cfg, device, events, progress, hooks).train()
        finally:
            dist.destroy_process_group()
    finally:
        events.close()
        progress.close()
