"""The FSDP trainer's restart contract on CPU gloo: sharded DCP checkpoints, resharding."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.trainer.forkranks import CRASH_CODE, CrashAt, Events, run_attempt, write_run_json
from trainwreck.trainer.config import TrainConfig

CFG = TrainConfig.tiny(total_steps=12, ckpt_interval=4, parallelism="fsdp")

# Documented in docs/TRAINER.md: a world-size change reorders float sums (and FSDP's
# reduce-scatter sums differently from DDP's all-reduce), so losses agree within this.
LOSS_RTOL = 1e-3


def golden_dir(tmp_path_factory: pytest.TempPathFactory, cfg: TrainConfig, world_size: int) -> Path:
    run_dir = tmp_path_factory.mktemp("golden")
    write_run_json(run_dir, cfg, [world_size])
    assert run_attempt(run_dir, cfg, world_size, attempt=0) == {r: 0 for r in range(world_size)}
    return run_dir


def golden(tmp_path_factory: pytest.TempPathFactory, cfg: TrainConfig, world_size: int) -> Events:
    return Events.read(golden_dir(tmp_path_factory, cfg, world_size))


@pytest.fixture(scope="module")
def golden2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return golden_dir(tmp_path_factory, CFG, 2)


@pytest.fixture(scope="module")
def golden2(golden2_dir: Path) -> Events:
    return Events.read(golden2_dir)


def test_every_rank_reports_the_same_full_state_digest_at_every_step(golden2: Events) -> None:
    assert len(golden2.digests()) == CFG.total_steps
    assert golden2.digests(rank=0) == golden2.digests(rank=1)


def test_every_rank_writes_its_own_shard_and_the_manifest_covers_them_all(golden2_dir: Path) -> None:
    manifest = json.loads((golden2_dir / "checkpoints" / "step-00000012" / "manifest.json").read_text())
    assert manifest["parallelism"] == "fsdp" and manifest["shards"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "rng.pt"} <= set(manifest["files"])


@pytest.mark.parametrize("crash_step", [6, 10])
def test_an_fsdp_kill_and_resume_gives_the_uninterrupted_digests(tmp_path: Path, golden2: Events,
                                                                 crash_step: int) -> None:
    write_run_json(tmp_path, CFG, [2, 2])
    assert run_attempt(tmp_path, CFG, 2, 0, hooks=lambda: CrashAt(crash_step))[0] == CRASH_CODE
    assert run_attempt(tmp_path, CFG, 2, 1) == {0: 0, 1: 0}
    events = Events.read(tmp_path)
    restore_step = (crash_step - 1) // CFG.ckpt_interval * CFG.ckpt_interval
    assert {e["step"] for e in events.of("restore", attempt=1)} == {restore_step}
    assert events.digests(attempt=1) == {s: d for s, d in golden2.digests().items() if s > restore_step}


def test_the_fsdp_loss_trajectory_stays_within_the_tolerance_of_ddp(tmp_path_factory: pytest.TempPathFactory,
                                                                   golden2: Events) -> None:
    ddp = golden(tmp_path_factory, replace(CFG, parallelism="ddp"), 2)
    ddp_loss = {e["step"]: e["loss"] for e in ddp.of("step", rank=0)}
    fsdp_loss = {e["step"]: e["loss"] for e in golden2.of("step", rank=0)}
    assert sorted(fsdp_loss) == sorted(ddp_loss) == list(range(1, CFG.total_steps + 1))
    worst = max(abs(fsdp_loss[s] - ddp_loss[s]) / max(1.0, abs(ddp_loss[s])) for s in ddp_loss)
    print(f"worst relative loss gap FSDP vs DDP over {CFG.total_steps} steps: {worst:.2e}")
    assert worst <= LOSS_RTOL
