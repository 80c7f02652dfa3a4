"""Resharding a DCP checkpoint on a world-size change, and refusing the other parallelism."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.fsdp.test_fsdp_restart import LOSS_RTOL, golden
from tests.trainer.forkranks import CRASH_CODE, CrashAt, Events, run_attempt, write_run_json
from trainwreck.trainer.config import ConfigError, TrainConfig

# 96 samples, global batch 24: 4 steps per epoch, served by 4, 2 and 3 ranks alike.
CFG = TrainConfig.tiny(total_steps=16, ckpt_interval=4, dataset_size=96, global_batch=24, parallelism="fsdp")


def global_batches(events: Events, attempt: int) -> dict[int, list[int]]:
    batches: dict[int, list[int]] = {}
    for e in events.of("batch", attempt=attempt):
        batches.setdefault(e["step"], []).extend(e["samples"])
    return batches


def test_resharding_4_to_2_to_3_covers_every_sample_once_and_keeps_the_loss(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    reference = golden(tmp_path_factory, CFG, 4)
    write_run_json(tmp_path, CFG, [4, 2, 3])
    assert run_attempt(tmp_path, CFG, 4, 0, hooks=lambda: CrashAt(7))[0] == CRASH_CODE
    assert run_attempt(tmp_path, CFG, 2, 1, hooks=lambda: CrashAt(11))[0] == CRASH_CODE
    assert run_attempt(tmp_path, CFG, 3, 2) == {0: 0, 1: 0, 2: 0}
    events = Events.read(tmp_path)
    # Each resume loaded shards written by another world size.
    assert {e["step"] for e in events.of("restore", attempt=1)} == {4}
    assert {e["step"] for e in events.of("restore", attempt=2)} == {8}
    lineage = {**{s: b for s, b in global_batches(events, 0).items() if s <= 4},
               **{s: b for s, b in global_batches(events, 1).items() if 4 < s <= 8},
               **global_batches(events, 2)}
    assert sorted(lineage) == list(range(1, CFG.total_steps + 1))
    for epoch in range(CFG.total_steps // 4):
        seen = sorted(i for s in range(epoch * 4 + 1, epoch * 4 + 5) for i in lineage[s])
        assert seen == list(range(CFG.dataset_size)), f"epoch {epoch} is not covered exactly once"
    golden_loss = {e["step"]: e["loss"] for e in reference.of("step", rank=0)}
    for attempt in (1, 2):
        for e in events.of("step", rank=0, attempt=attempt):
            assert abs(e["loss"] - golden_loss[e["step"]]) <= LOSS_RTOL * max(1.0, abs(golden_loss[e["step"]]))
    # The restored state is the saved one, resharded: the full-state digest survives the move.
    saved = {e["checkpoint"]: e["digest"] for e in events.of("save")}
    assert all(e["digest"] == saved[e["checkpoint"]] for e in events.of("restore"))


@pytest.mark.parametrize("written, resumed", [("ddp", "fsdp"), ("fsdp", "ddp")])
def test_a_checkpoint_of_the_other_parallelism_is_refused_with_the_reason(tmp_path: Path, written: str,
                                                                          resumed: str) -> None:
    first = replace(CFG, total_steps=4, parallelism=written)
    write_run_json(tmp_path, first, [2, 2])
    assert run_attempt(tmp_path, first, 2, 0) == {0: 0, 1: 0}
    codes = run_attempt(tmp_path, replace(first, total_steps=8, parallelism=resumed), 2, 1)
    assert set(codes.values()) == {1}, "a checkpoint of the other parallelism was used"
    events = Events.read(tmp_path)
    rejects = events.of("reject", attempt=1)
    assert [e["checkpoint"] for e in rejects] == ["step-00000004"]
    assert f"parallelism={written}" in rejects[0]["reason"]
    assert events.of("restore", attempt=1) == [] and events.of("step", attempt=1) == []


def test_an_unknown_parallelism_names_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"parallelism='zero3' is not one of ddp, fsdp"):
        TrainConfig.tiny(parallelism="zero3")


def test_fp16_with_fsdp_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="use amp_dtype='bf16'"):
        TrainConfig.tiny(parallelism="fsdp", amp_dtype="fp16")


def test_async_checkpoints_with_fsdp_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="use ckpt_mode='sync' with fsdp"):
        TrainConfig.tiny(parallelism="fsdp", ckpt_mode="async")
    assert TrainConfig.tiny(parallelism="ddp", ckpt_mode="async").ckpt_mode == "async"
