"""How the reference model is parallelised: DDP (replicated) or FSDP2 (sharded).

Model, data, sampler and optimizer are the same for both; only the wrap, the
gradient-sync switch for accumulation, and the state digest differ. FSDP2 comes from
`torch.distributed.fsdp` (torch >= 2.6) or `torch.distributed._composable.fsdp` (2.4, 2.5).
"""
from __future__ import annotations

import random
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.model import MLP
from trainwreck.trainer.state import TrainState, digest_of, lr_factor, state_digest


def fsdp2() -> tuple[Any, Any]:
    """FSDP2's (MixedPrecisionPolicy, fully_shard), imported when first sharding: FSDP's and DCP's
    DTensor machinery is 1.5 s of imports here, which a process that never shards (the harness's
    CLI imports the trainer) need not pay; the fork server imports them once (harness/launch/rank.py)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4/2.5 ship FSDP2 under its composable name
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard  # type: ignore[no-redef]
    return MixedPrecisionPolicy, fully_shard


def build_state(cfg: TrainConfig, device: torch.device, grad_scaler: bool, amp: torch.dtype | None,
                world_size: int | None = None, ramp: dict[str, float] | None = None) -> TrainState:
    """The state before update 1. For FSDP the model is sharded before the optimizer is
    built, so AdamW holds (and a checkpoint stores) only this rank's shard of its moments."""
    if cfg.parallelism == "ddp":
        from trainwreck.trainer.state import fresh_state
        return fresh_state(cfg, device, grad_scaler=grad_scaler, world_size=world_size, ramp=ramp)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # the same full init on every rank, then each keeps its shard
    model = MLP(cfg).to(device)
    shard_model(model, device, amp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: lr_factor(cfg, done, world_size, ramp))
    scaler = torch.amp.GradScaler(device.type) if grad_scaler else None
    return TrainState(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)


def shard_model(model: MLP, device: torch.device, amp: torch.dtype | None) -> None:
    """fully_shard every Linear, then the root (FSDP2's usual bottom-up order). bf16 parameters
    only on CUDA: gloo cannot reduce-scatter bf16 as fast, and CPU runs are the exact reference.

    The mesh is built for `device`, never left to fully_shard: its default takes the host's
    accelerator, so on a GPU host a CPU job's shards moved to CUDA and every rank set the
    device LOCAL_RANK (rank 1 of two on one GPU: an invalid device ordinal)."""
    precision, fully_shard = fsdp2()
    kwargs: dict[str, Any] = {"mesh": device_mesh(device)}
    if device.type == "cuda" and amp == torch.bfloat16:
        kwargs["mp_policy"] = precision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in [*model.hidden, model.head]:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def device_mesh(device: torch.device) -> Any:
    """A one-dimensional mesh of the whole default group on `device`'s type (cpu or cuda)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),))


def wrap(cfg: TrainConfig, state: TrainState, device: torch.device) -> nn.Module:
    """The module the loop calls: DDP around the bare model, or the FSDP-sharded model itself."""
    if cfg.parallelism == "fsdp":
        return state.model
    return DistributedDataParallel(state.model, device_ids=[device.index] if device.type == "cuda" else None)


@contextmanager
def no_sync(wrapped: nn.Module) -> Iterator[None]:
    """Skip the gradient reduction for a micro-batch that is not the last of its step."""
    if isinstance(wrapped, DistributedDataParallel):
        with wrapped.no_sync():
            yield
        return
    if not hasattr(wrapped, "set_requires_gradient_sync"):
        with nullcontext():
            yield
        return
    wrapped.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        wrapped.set_requires_gradient_sync(True)


def full_state_digest(cfg: TrainConfig, state: TrainState) -> str:
    """One digest of the whole training state, equal on every rank.

    DDP: every rank holds the full state, hashed as trainer/state.py always has.
    FSDP: the full (unsharded) parameters and optimizer state are all-gathered (a
    collective: every rank must call this) and hashed by FQN in sorted order. The value
    therefore does not depend on how the state is sharded: the same full state on 2 or 4
    ranks gives the same digest. Training on different world sizes still gives different
    digests (reduction order changes float rounding), so it is compared with the golden run
    only at equal world sizes, which is all the contract asks."""
    if cfg.parallelism == "ddp":
        return state_digest(state)
    model_sd, optim_state = full_state(state, on_host=gathers_on_host(state))
    return digest_of(sorted(model_sd.items()), optim_state)


def gathers_on_host(state: TrainState) -> bool:
    """Whether FSDP's full state must be gathered from host copies of the shards: CUDA shards
    over gloo. torch's own full-state gather of them killed the rank with SIGSEGV (torch 2.11,
    two ranks sharing an H200 over gloo, 2026-11-27); in torch's source gloo's coalesced
    all-gather has no CUDA branch, where its plain all-gather copies through host memory."""
    import torch.distributed as dist

    device = next(state.model.parameters()).device
    return device.type != "cpu" and dist.get_backend() == "gloo"


def full_state(state: TrainState, on_host: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full model state dict and optimizer state, both keyed by FQN; gathered by torch
    (full_state_dict) or, `on_host`, by all-gathering CPU copies of the shards over gloo."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    if not on_host:
        model_sd, optim_sd = get_state_dict(state.model, state.optimizer,
                                            options=StateDictOptions(full_state_dict=True))
        return model_sd, optim_sd.get("state", {})
    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)  # sharded: DTensors, same keys
    mesh = device_mesh(torch.device("cpu"))
    return ({key: _full_on_host(value, mesh) for key, value in model_sd.items()},
            {param: {key: _full_on_host(value, mesh) for key, value in entry.items()}
             for param, entry in optim_sd.get("state", {}).items()})


def _full_on_host(value: Any, mesh: Any) -> Any:
    """A DTensor shard made whole on the CPU (a collective over `mesh`); anything else as it is."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
    if not isinstance(value, DTensor):
        return value
    local = value.to_local().detach().cpu()
    on_cpu = DTensor.from_local(local, mesh, value.placements, run_check=False, shape=value.shape,
                                stride=value.stride())
    return on_cpu.full_tensor()
