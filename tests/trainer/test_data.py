"""The per-sample hash (trainer/data.py): the key fold on Python ints gives the tensor hash's bits."""
from __future__ import annotations

import random

import torch

from trainwreck.trainer.data import _GOLDEN, _signed, mix64, mix_key


def tensor_fold(*parts: int) -> int:
    """The fold as the tensors compute it: every step on a one-element int64 tensor, wrapping."""
    key = torch.zeros(1, dtype=torch.int64)
    for part in parts:
        key = mix64(key * _GOLDEN + _signed(part))
    return int(key.item())


def test_the_key_fold_on_python_ints_equals_the_fold_on_int64_tensors() -> None:
    draw = random.Random(0)
    widths = (2, 7, 62, 63, 64, 70)  # small ids, steps, the 62-bit noise key, the int64 edges, past them
    cases = [()] + [tuple(draw.randrange(-(1 << w), 1 << w) for _ in range(draw.randrange(1, 4)))
                    for w in widths for _ in range(200)]
    assert [mix_key(*c) for c in cases] == [tensor_fold(*c) for c in cases]
    assert mix_key(0, 0xDA7A) == tensor_fold(0, 0xDA7A) and -(1 << 63) <= mix_key(1 << 63) < 1 << 63
