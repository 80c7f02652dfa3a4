"""report/json_text.py writes report.json byte for byte as the standard library's encoder would."""
from __future__ import annotations

import enum
import json
import math
import random
from decimal import Decimal
from typing import Any

import pytest

from trainwreck.report import json_text


class Level(enum.IntEnum):
    HIGH = 7


class Tag(str):
    pass


_ODD = [float("nan"), math.inf, -math.inf, -0.0, 1e-7, 1e16, 2.5, Level.HIGH, Tag("t\u00e9\n"), Decimal("1.10"),
        None, True, False, 0, -(10**30), "", "\"quoted\" \\ \x00 \u2603 \U0001f600"]


def _library(value: Any, indent: int) -> str:
    return "".join(json.JSONEncoder(indent=indent, default=str).iterencode(value))


def _ours(value: Any, indent: int) -> str:
    return "".join(json_text.iterencode(value, indent))


def _random_value(rng: random.Random, depth: int) -> Any:
    pick = rng.random()
    if depth >= 4 or pick < 0.4:
        return rng.choice(_ODD + [rng.random(), rng.randrange(-1000, 1000), f"s{rng.random()}"])
    if pick < 0.55:  # a long list of one kind: the fast path
        kind = rng.choice([float, int, str, None])
        return [kind(rng.random() * 100) if kind else None for _ in range(rng.randrange(0, 40))]
    if pick < 0.75:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    if pick < 0.8:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4)))
    keys = ["a", "b\u00e9", 3, 2.5, True, None, float("nan")]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


@pytest.mark.parametrize("seed", range(40))
def test_random_documents_are_written_as_the_library_writes_them(seed: int) -> None:
    rng = random.Random(seed)
    value = _random_value(rng, 0)
    for indent in (1, 2):
        assert _ours(value, indent) == _library(value, indent)


def test_a_list_longer_than_a_batch_mixing_kinds_and_specials_is_the_library_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_text, "BATCH", 7)
    losses = [0.5 * i for i in range(30)]
    losses[9] = float("nan")  # a batch of floats with a NaN in it
    value = {"loss": {"steps": list(range(30)), "values": losses}, "mixed": [1, "a", None, 2.0, True] * 5}
    assert _ours(value, 1) == _library(value, 1)


def test_a_key_the_library_refuses_is_refused_with_its_type_named() -> None:
    with pytest.raises(TypeError, match="tuple"):
        _ours({(1, 2): 3}, 1)
