"""The trainer's restart contract, on CPU gloo with 2-4 forked ranks."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.forkranks import CRASH_CODE, CrashAt, Events, run_attempt, write_run_json
from trainwreck.trainer.config import TrainConfig

CFG = TrainConfig.tiny(total_steps=12, ckpt_interval=4)

# Documented in docs/TRAINER.md: a world-size change only reorders float sums, so the
# loss must stay within this relative distance of the uninterrupted run.
LOSS_RTOL = 1e-3


def golden(tmp_path_factory: pytest.TempPathFactory, cfg: TrainConfig, world_size: int) -> Events:
    run_dir = tmp_path_factory.mktemp("golden")
    write_run_json(run_dir, cfg, [world_size])
    assert run_attempt(run_dir, cfg, world_size, attempt=0) == {r: 0 for r in range(world_size)}
    return Events.read(run_dir)


@pytest.fixture(scope="module")
def golden2(tmp_path_factory: pytest.TempPathFactory) -> Events:
    return golden(tmp_path_factory, CFG, 2)


def crash_then_resume(run_dir: Path, cfg: TrainConfig, sizes: tuple[int, int], crash_step: int) -> Events:
    write_run_json(run_dir, cfg, list(sizes))
    codes = run_attempt(run_dir, cfg, sizes[0], attempt=0, hooks=lambda: CrashAt(crash_step))
    assert codes[0] == CRASH_CODE, "the planted crash did not fire"
    assert run_attempt(run_dir, cfg, sizes[1], attempt=1) == {r: 0 for r in range(sizes[1])}
    return Events.read(run_dir)


def test_same_config_gives_bit_identical_digests(tmp_path_factory: pytest.TempPathFactory,
                                                  golden2: Events) -> None:
    again = golden(tmp_path_factory, CFG, 2)
    assert again.digests() == golden2.digests()
    assert len(golden2.digests()) == CFG.total_steps


def test_replicas_report_the_same_digest_at_every_step(golden2: Events) -> None:
    assert golden2.digests(rank=0) == golden2.digests(rank=1)


@pytest.mark.parametrize("crash_step", [3, 6, 10])
def test_resume_after_a_crash_matches_the_uninterrupted_digests(tmp_path: Path, golden2: Events,
                                                                crash_step: int) -> None:
    events = crash_then_resume(tmp_path, CFG, (2, 2), crash_step)
    restore_step = (crash_step - 1) // CFG.ckpt_interval * CFG.ckpt_interval
    restores = events.of("restore", attempt=1)
    if restore_step == 0:
        assert restores == []
    else:
        assert {e["step"] for e in restores} == {restore_step}
        saved = {e["checkpoint"]: e["digest"] for e in events.of("save")}
        assert all(e["digest"] == saved[e["checkpoint"]] for e in restores)
    resumed = events.digests(attempt=1)
    assert min(resumed) == restore_step + 1
    assert resumed == {s: d for s, d in golden2.digests().items() if s > restore_step}


def test_forgetting_nothing_matters_rng_changes_the_trajectory(tmp_path_factory: pytest.TempPathFactory,
                                                               golden2: Events) -> None:
    # Control for the RNG-restore test above: another seed's dropout stream must change
    # the digests, or a forgotten RNG restore would be invisible.
    other = golden(tmp_path_factory, TrainConfig.tiny(total_steps=12, ckpt_interval=4, dropout=0.3), 2)
    assert other.digests()[1] != golden2.digests()[1]


def global_batches(events: Events, attempt: int) -> dict[int, list[int]]:
    batches: dict[int, list[int]] = {}
    for e in events.of("batch", attempt=attempt):
        batches.setdefault(e["step"], []).extend(e["samples"])
    return batches


@pytest.mark.parametrize("sizes", [(4, 2), (2, 4)])
def test_resume_on_another_world_size_covers_every_sample_once(tmp_path: Path,
                                                               tmp_path_factory: pytest.TempPathFactory,
                                                               sizes: tuple[int, int]) -> None:
    cfg = TrainConfig.tiny(total_steps=20, ckpt_interval=4, dataset_size=64)  # 4 steps per epoch
    reference = golden(tmp_path_factory, cfg, sizes[0])
    events = crash_then_resume(tmp_path, cfg, sizes, crash_step=7)
    lineage = {**{s: b for s, b in global_batches(events, 0).items() if s <= 4},
               **global_batches(events, 1)}
    assert sorted(lineage) == list(range(1, cfg.total_steps + 1))
    # Each epoch is 4 steps; the lineage must see every id exactly once per epoch.
    for epoch in range(cfg.total_steps // 4):
        seen = sorted(i for s in range(epoch * 4 + 1, epoch * 4 + 5) for i in lineage[s])
        assert seen == list(range(cfg.dataset_size)), f"epoch {epoch} is not covered exactly once"
    golden_batches = global_batches(reference, 0)
    assert all(sorted(lineage[s]) == sorted(golden_batches[s]) for s in lineage)
    golden_loss = {e["step"]: e["loss"] for e in reference.of("step", rank=0)}
    resumed_loss = {e["step"]: e["loss"] for e in events.of("step", rank=0, attempt=1)}
    for step, loss in resumed_loss.items():
        assert abs(loss - golden_loss[step]) <= LOSS_RTOL * max(1.0, abs(golden_loss[step])), step


def test_corrupted_newest_checkpoint_is_rejected_and_the_previous_restored(tmp_path: Path,
                                                                           golden2: Events) -> None:
    write_run_json(tmp_path, CFG, [2])
    assert run_attempt(tmp_path, CFG, 2, 0, hooks=lambda: CrashAt(10))[0] == CRASH_CODE
    damaged = tmp_path / "checkpoints" / "step-00000008" / "optimizer.pt"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert run_attempt(tmp_path, CFG, 2, 1) == {0: 0, 1: 0}
    events = Events.read(tmp_path)
    rejects = events.of("reject", attempt=1)
    assert [(e["checkpoint"], "fails its blake3 check" in e["reason"]) for e in rejects] == [("step-00000008", True)]
    assert {e["step"] for e in events.of("restore", attempt=1)} == {4}
    assert events.digests(attempt=1) == {s: d for s, d in golden2.digests().items() if s > 4}
