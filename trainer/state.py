"""Training state: what a checkpoint holds, how it is digested, how RNG is captured."""
from __future__ import annotations

import ctypes
import hashlib
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class TrainState:
    """Everything an update depends on, besides the config."""

    model: nn.Module
    """The bare model (not the DDP wrapper), so state dict keys carry no 'module.' prefix."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    step: int = 0
    """Updates applied so far: the state is 'after update `step`'."""


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.nbytes) if t.nbytes else b""


def state_digest(state: TrainState) -> str:
    """sha256 of parameters and optimizer state, in a fixed order: equal states, equal digests."""
    h = hashlib.sha256()
    for key, tensor in state.model.state_dict().items():
        h.update(key.encode())
        h.update(_tensor_bytes(tensor))
    opt_state = state.optimizer.state_dict()["state"]
    for index in sorted(opt_state):
        for key in sorted(opt_state[index]):
            value = opt_state[index][key]
            h.update(f"{index}.{key}".encode())
            h.update(_tensor_bytes(value) if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()[:16]


def capture_rng() -> dict[str, Any]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"python": random.getstate(), "torch": torch.get_rng_state(), "cuda": cuda}


def restore_rng(saved: dict[str, Any]) -> None:
    random.setstate(_as_python_state(saved["python"]))
    torch.set_rng_state(saved["torch"])
    if saved.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


def _as_python_state(state: Any) -> tuple[Any, ...]:
    # torch.load returns lists where tuples went in; random.setstate needs tuples.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def training_files(state: TrainState, sampler_state: dict[str, int], rng_per_rank: list[dict[str, Any]],
                   identity: str) -> dict[str, bytes]:
    """The checkpoint's files; split so a torn write damages one and the sweep has many ops."""
    from trainwreck.trainer.checkpoint import to_bytes

    return {
        "model.pt": to_bytes(state.model.state_dict()),
        "optimizer.pt": to_bytes(state.optimizer.state_dict()),
        "scheduler.pt": to_bytes({
            "scheduler": state.scheduler.state_dict(),
            "scaler": state.scaler.state_dict() if state.scaler is not None else None,
        }),
        "trainer.pt": to_bytes({"step": state.step, "sampler": sampler_state, "config_identity": identity}),
        "rng.pt": to_bytes(rng_per_rank),
    }
