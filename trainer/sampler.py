"""The elastic sampler: a global sample cursor that any world size can resume from.

Each epoch's global order is a permutation derived from (seed, epoch) alone. The
state is (epoch, cursor into that order), identical on every rank, so a checkpoint
taken at world size 4 resumes at world size 2 without skipping or repeating a sample.
Each rank takes a contiguous slice of every global batch; uneven slices (only in an
epoch's final partial batch with drop_last=False) differ by at most one sample and
are never padded with duplicates.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trainwreck.trainer.data import mix_key


@dataclass
class SamplerState:
    epoch: int = 0
    cursor: int = 0
    """Samples of this epoch's order already handed out."""


class ElasticSampler:
    def __init__(self, dataset_size: int, global_batch: int, seed: int, drop_last: bool) -> None:
        self.dataset_size = dataset_size
        self.global_batch = global_batch
        self.seed = seed
        self.drop_last = drop_last
        self.state = SamplerState()
        self._order_epoch = -1
        self._order = torch.empty(0, dtype=torch.int64)

    def order(self, epoch: int) -> torch.Tensor:
        if epoch != self._order_epoch:
            generator = torch.Generator().manual_seed(mix_key(self.seed, 0x5A3F, epoch) & (2**63 - 1))
            self._order = torch.randperm(self.dataset_size, generator=generator)
            self._order_epoch = epoch
        return self._order

    def next_global_batch(self) -> tuple[int, torch.Tensor]:
        """The epoch and sample ids of the next update, advancing the cursor."""
        remaining = self.dataset_size - self.state.cursor
        if remaining == 0 or (self.drop_last and remaining < self.global_batch):
            self.state = SamplerState(epoch=self.state.epoch + 1, cursor=0)
        start = self.state.cursor
        ids = self.order(self.state.epoch)[start:start + self.global_batch]
        self.state = SamplerState(epoch=self.state.epoch, cursor=start + len(ids))
        return self.state.epoch, ids

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.state.epoch, "cursor": self.state.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor <= self.dataset_size:
            raise ValueError(f"sampler state epoch={epoch} cursor={cursor} is outside the dataset")
        self.state = SamplerState(epoch=epoch, cursor=cursor)


def rank_slice(global_ids: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous share of a global batch."""
    return torch.tensor_split(global_ids, world_size)[rank]
