"""Config validation: every error names the value and the fix."""
from __future__ import annotations

import pytest

from trainwreck.trainer.config import ConfigError, TrainConfig


def test_a_world_size_that_does_not_divide_the_global_batch_lists_the_sizes_that_do() -> None:
    cfg = TrainConfig.tiny(global_batch=24)
    with pytest.raises(ConfigError, match=r"world size 5 .* world sizes that do: 1, 2, 3, 4, 6, 8, 12, 24"):
        cfg.check_world_size(5)


def test_gradient_accumulation_narrows_the_valid_world_sizes() -> None:
    assert TrainConfig.tiny(global_batch=16, grad_accum=4).valid_world_sizes() == [1, 2, 4]


@pytest.mark.parametrize("field, value, fix", [
    ("keep_last", 1, "keep_last >= 2"),
    ("dropout", 1.0, r"\[0, 1\)"),
    ("global_batch", 512, "lower global_batch or raise dataset_size"),
    ("backend", "mpi", "auto, gloo, nccl"),
    ("total_steps", 0, "positive integer"),
    ("width", True, "positive integer"),
])
def test_invalid_values_name_the_field_and_the_fix(field: str, value: object, fix: str) -> None:
    with pytest.raises(ConfigError, match=f"{field}.*{fix}|{fix}"):
        TrainConfig.tiny(**{field: value})


def test_unknown_fields_are_refused_with_the_known_ones_listed() -> None:
    with pytest.raises(ConfigError, match="unknown config field.*widht.*known:.*width"):
        TrainConfig.from_dict({"widht": 3})


def test_identity_ignores_operational_fields_but_not_the_trajectory() -> None:
    base = TrainConfig.tiny()
    assert base.identity() == TrainConfig.tiny(ckpt_interval=7, keep_last=5, grad_accum=2).identity()
    assert base.identity() != TrainConfig.tiny(lr=2e-3).identity()
    assert base.identity() != TrainConfig.tiny(seed=1).identity()


def test_config_round_trips_through_a_dict() -> None:
    cfg = TrainConfig.tiny(width=48)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
