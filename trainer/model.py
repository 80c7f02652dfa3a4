"""A small MLP whose dropout is keyed by (step key, sample id, layer, unit).

The key is drawn once per step from the torch RNG (identical on every rank), so
randomness still flows through the RNG state (a forgotten RNG restore changes every
later step), yet each sample's mask is the same whichever rank computes it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.data import mix_key, uniform


class MLP(nn.Module):
    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        dims = [cfg.input_dim] + [cfg.width] * cfg.depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(cfg.width, cfg.num_classes)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, sample_ids: torch.Tensor, noise_key: int) -> torch.Tensor:
        for layer_index, layer in enumerate(self.hidden):
            x = F.relu(layer(x))
            if self.training and self.dropout > 0:
                draw = uniform(mix_key(noise_key, layer_index), sample_ids, x.shape[1])
                x = x * (draw >= self.dropout).to(x.dtype) / (1.0 - self.dropout)
        return self.head(x)


def draw_noise_key() -> int:
    """One 62-bit draw from the torch RNG; all ranks share the RNG state, so the draw too."""
    return int(torch.randint(0, 2**62, (1,)).item())
