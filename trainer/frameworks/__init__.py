"""Adapters that let a framework's own trainer write the run format through the probe,
with no change to the framework. Each one imports its framework; install the extra
(`pip install 'trainwreck[hf]'`, `[lightning]`, `[accelerate]`) before importing it. This
package itself imports torch only: the sample-id tracking the adapters share."""
from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import torch

EXAMPLES = Path(__file__).resolve().parent / "examples"
"""The example training scripts users copy (installed with the package): public torchrun scripts
instrumented with the probe, and one example trainer per framework adapter."""

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
