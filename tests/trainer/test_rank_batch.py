"""A per-device batch (TrainConfig.rank_batch) and the LR rules that follow the global batch it makes."""
from __future__ import annotations

import math

import pytest

from trainwreck.trainer.config import TrainConfig
from trainwreck.rundir.errors import ConfigError
from trainwreck.trainer.state import lr_factor


def test_a_per_device_batch_makes_the_global_batch_follow_the_world_size() -> None:
    cfg = TrainConfig.tiny(rank_batch=4, global_batch=16)
    assert [cfg.step_batch(w) for w in (1, 2, 4)] == [4, 8, 16]
    assert TrainConfig.tiny().step_batch(4) == TrainConfig.tiny().global_batch


@pytest.mark.parametrize("rule, expected", [("none", 1.0), ("linear", 0.5), ("sqrt", math.sqrt(0.5))])
def test_each_lr_rule_scales_the_schedule_by_its_multiplier_of_the_new_batch(rule: str, expected: float) -> None:
    cfg = TrainConfig.tiny(rank_batch=4, global_batch=16, lr_scaling=rule)
    assert cfg.lr_scale(2) == pytest.approx(expected) and cfg.lr_scale(4) == 1.0
    for done in (0, 5, 20):  # warmup and decay alike
        assert lr_factor(cfg, done, 2) == pytest.approx(expected * lr_factor(cfg, done))


def test_the_new_fields_at_their_defaults_leave_every_identity_as_it_was() -> None:
    assert TrainConfig.tiny().identity() == TrainConfig.tiny(rank_batch=0, lr_scaling="none").identity()
    assert TrainConfig.tiny(rank_batch=4).identity() != TrainConfig.tiny().identity()


def test_an_lr_rule_without_a_per_device_batch_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="needs rank_batch"):
        TrainConfig.tiny(lr_scaling="linear")
    with pytest.raises(ConfigError, match="multiple of grad_accum"):
        TrainConfig.tiny(rank_batch=3, grad_accum=2)


def test_a_rewarmup_moves_the_multiplier_from_the_old_worlds_to_the_new_over_its_updates() -> None:
    cfg = TrainConfig.tiny(rank_batch=4, global_batch=16, lr_scaling="linear", lr_rewarmup=3, warmup_steps=0)
    ramp = {"start": 8, "from": cfg.lr_scale(4)}
    scales = [lr_factor(cfg, d, 2, ramp) / lr_factor(cfg, d) for d in range(8, 13)]
    assert scales == pytest.approx([0.875, 0.75, 0.625, 0.5, 0.5])
    assert lr_factor(cfg, 9, 2, {}) == pytest.approx(0.5 * lr_factor(cfg, 9))
