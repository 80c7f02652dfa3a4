"""Adapters that let trainwreck judge trainers built on a framework, the framework unchanged.

Each adapter module imports its framework (an optional extra), so import it only when the
framework is installed; this package itself imports torch only."""
from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import torch

from trainwreck.trainer.state import state_digest


class _NoOptimizer:
    def state_dict(self) -> dict[str, dict[int, dict[str, object]]]:
        return {"state": {}}


def module_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str:
    """The reference trainer's digest rule (trainer/state.py), over a framework's model and
    optimizer: equal on every DDP replica, equal states give equal digests."""
    return state_digest(SimpleNamespace(model=model, optimizer=optimizer or _NoOptimizer()))  # type: ignore[arg-type]


FETCHED: deque[int] = deque()
"""Sample ids this process fetched, oldest first (one process trains one rank)."""


class _TrackedDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Delegates to the user's dataset and notes each index fetched (num_workers=0 only:
    a worker process's notes would never reach the trainer's)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        FETCHED.append(int(index))
        return self.inner[index]


def track_samples(dataset: Any) -> torch.utils.data.Dataset:  # type: ignore[type-arg]
    """The user's dataset, noting which sample ids this rank fetches: the `batch` event's
    samples, without the model or the batch carrying them."""
    return _TrackedDataset(dataset)


def batch_rows(batch: Any) -> int:
    """Rows in a batch: the first tensor's first dimension, wherever it is nested."""
    if torch.is_tensor(batch):
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, dict) else batch
    for item in items:
        return batch_rows(item)
    raise ValueError("a batch with no tensor: track_samples cannot tell its size")


def take_samples(batch: Any) -> list[int]:
    """The ids of `batch`: frameworks fetch a batch ahead, so ids leave oldest first, as many
    as the batch has rows."""
    return [FETCHED.popleft() for _ in range(min(batch_rows(batch), len(FETCHED)))]
