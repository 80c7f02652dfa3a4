"""Synthetic data and per-sample randomness, both pure functions of (seed, sample id).

A counter-based hash (splitmix64's finaliser on int64 tensors) gives every sample its
features and every (step, sample, unit) its dropout draw without any stateful
generator, so the numbers a sample sees do not depend on which rank processes it.
That is what lets a world-size change keep the trajectory within float-rounding of
the uninterrupted run.
"""
from __future__ import annotations

import torch

_MASK = (1 << 64) - 1


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 torch stores (multiplication wraps)."""
    value &= _MASK
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift on int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijective scramble of each int64 element."""
    x = x ^ _shr(x, 30)
    x = x * _M1
    x = x ^ _shr(x, 27)
    x = x * _M2
    return x ^ _shr(x, 31)


def mix_key(*parts: int) -> int:
    """Fold integers into one 64-bit key (used for seeds, epochs, layers), as a signed int64.

    `mix64` on Python ints modulo 2**64: the same bits as on a one-element int64 tensor
    (tests/trainer/test_data.py), without the ~25 tensor operations that cost 0.2 ms a
    call on 2 busy cores, twice in every forward pass."""
    key = 0
    for part in parts:
        key = (key * _GOLDEN + part) & _MASK
        key ^= key >> 30
        key = (key * _M1) & _MASK
        key ^= key >> 27
        key = (key * _M2) & _MASK
        key ^= key >> 31
    return _signed(key)


def uniform(key: int, rows: torch.Tensor, width: int) -> torch.Tensor:
    """U[0,1) float32 of shape (len(rows), width); element (i, j) depends on (key, rows[i], j) only."""
    cells = rows.to(torch.int64).unsqueeze(1) * width + torch.arange(width, device=rows.device)
    bits = mix64(mix64(cells + key) ^ key)
    return _shr(bits, 40).to(torch.float32) * (1.0 / (1 << 24))


class SyntheticDataset:
    """N samples of a learnable task: features in [-1, 1), label = argmax of a fixed teacher."""

    def __init__(self, seed: int, size: int, input_dim: int, num_classes: int) -> None:
        self.size = size
        self.input_dim = input_dim
        self._key = mix_key(seed, 0xDA7A)
        teacher_key = mix_key(seed, 0x7EAC)
        rows = torch.arange(input_dim)
        self._teacher = uniform(teacher_key, rows, num_classes) * 2.0 - 1.0

    def batch(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.size):
            raise IndexError(f"sample ids must be in 0..{self.size - 1}")
        x = uniform(self._key, ids, self.input_dim) * 2.0 - 1.0
        y = (x @ self._teacher).argmax(dim=1)
        return x, y
