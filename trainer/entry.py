"""The function every rank calls: pick the trainer by name, join the job, train.

Trainers are listed here explicitly, the reference and its planted defects, so that
`trainer.loop` (the reference) never imports the defects that subclass it."""
from __future__ import annotations

import gc
import importlib
import os

import torch
import torch.distributed as dist

from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.defects import DEFECTS
from trainwreck.trainer.hooks import Hooks, NoHooks
from trainwreck.trainer.launch import RankContext, check_nccl_devices, cuda_count, init_process_group, pick_device
from trainwreck.trainer.loop import Trainer, resolve_backend
from trainwreck.trainer.probe import Probe

VARIANTS: dict[str, type[Trainer]] = {"reference": Trainer, **DEFECTS}
"""TrainConfig.variant -> the Trainer class that runs it."""


def trainer_class(name: str) -> type[Trainer]:
    if name not in VARIANTS:
        raise ValueError(f"variant={name!r} is unknown; known variants: {', '.join(sorted(VARIANTS))}")
    return VARIANTS[name]


def run_rank(ctx: RankContext, cfg: TrainConfig, hooks: Hooks | None = None) -> None:
    """Train one rank of one attempt to cfg.total_steps (raises on any failure)."""
    cfg.check_world_size(ctx.world_size)
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
    device = pick_device(cfg.device, ctx.local_rank, local_world_size)
    backend = resolve_backend(cfg, device, local_world_size, cuda_count())
    if backend == "nccl":
        check_nccl_devices(local_world_size, cuda_count())
    if device.type == "cpu":
        torch.set_num_threads(1)  # every rank shares the same few cores
    hooks = hooks or NoHooks()
    # An optimizer's constructor imports torch._dynamo lazily (2.5 s here): paid before the probe's
    # first publish, so it never counts as a hang. Here, not at module level, where every process
    # that merely imports the trainer (the harness's CLI) paid it too; a fork server holds it already.
    importlib.import_module("torch._dynamo")  # not `import torch._dynamo`: that makes `torch` local here
    probe = Probe(ctx.run_dir, ctx.rank, ctx.world_size, ctx.attempt, hooks)
    try:
        probe.start(device=str(device), backend=backend)
        hooks.bind(probe.events, ctx.rank, ctx.world_size, ctx.attempt)
        init_process_group(ctx, backend)
        try:
            trainer = trainer_class(cfg.variant)(ctx, cfg, device, probe, hooks)
            trainer.train()
            # The trainer's DDP/FSDP state holds the process group through reference cycles;
            # left to the interpreter's teardown, gloo's threads were destroyed still running
            # and rank 1 aborted ("terminate called without an active exception", no Python
            # frame) in about 1 torchrun run in 30. Free it while the interpreter is alive.
            del trainer
            gc.collect()
            # Every rank done before any tears the group down: a gloo peer whose connection
            # closed under it while it still finished its side aborted (SIGABRT) now and then
            # under torchrun, once in CI and in 1 of 4 plain-script runs without this.
            dist.barrier()
        finally:
            dist.destroy_process_group()
    finally:
        probe.close()
