"""The accelerate adapter, judged: 2 ranks, CPU gloo, a tiny model, offline.

Runs go through tests/frameworks/scripts/launch.py (a stand-in for `trainwreck run --cmd`)
and stand_in_probe.py (a stand-in for trainer/probe.py), and are judged by the unchanged
invariants. Each test asserts that its planned fault fired and that the verdict agrees with
what the run's own events show."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate", reason="pip install 'trainwreck[accelerate]'")

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from launch import Attempt, events, fired, ids_used_twice_in_an_epoch, judged, python, run_job  # noqa: E402

STEPS, SAVE_EVERY, DATASET, GLOBAL_BATCH = 12, 3, 64, 8
"""8 updates an epoch; saves after 3, 6, 9, 12 into checkpoints/checkpoint_<n>, the newest 2 kept."""
RESUME = ("--resume",)


def job(run_dir: Path, attempts: list[Attempt], faults: list[dict[str, Any]] | None = None) -> list[list[int]]:
    cmd = python("accelerate_train.py", "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
                 "--global-batch", str(GLOBAL_BATCH))
    return run_job(cmd, run_dir, attempts, STEPS, DATASET, GLOBAL_BATCH, faults or [])


def summaries(judgement: Any) -> dict[str, str]:
    return {name: v.summary for name, v in judgement.verdicts.items()}


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("accelerate") / "golden"
    assert job(run_dir, [Attempt(2)]) == [[0, 0]]
    return run_dir


def test_the_accelerate_golden_run_is_judged_valid(golden):
    judgement = judged(golden, None)
    assert judgement.valid is True, summaries(judgement)
    saves = events(golden, "save")
    assert [(e["step"], e["checkpoint"]) for e in saves] == [(3, "checkpoint_0"), (6, "checkpoint_1"),
                                                             (9, "checkpoint_2"), (12, "checkpoint_3")]
    assert {e["rank"] for e in saves} == {0}
    assert ids_used_twice_in_an_epoch(golden, STEPS) == set()


def kill_mid_epoch(run_dir: Path, resume_args: tuple[str, ...]) -> list[list[int]]:
    plan = [{"id": "kill-mid-epoch", "kind": "kill", "rank": 1, "step": 5}]
    codes = job(run_dir, [Attempt(2), Attempt(2, resume_args)], plan)
    assert fired(run_dir) == ["kill-mid-epoch"]
    assert [e["step"] for e in events(run_dir, "restore")] == [3, 3]
    return codes


def test_a_kill_mid_epoch_resumed_with_skip_first_batches_is_judged_valid(golden, tmp_path):
    run_dir = tmp_path / "kill"
    assert kill_mid_epoch(run_dir, RESUME)[-1] == [0, 0]
    judgement = judged(run_dir, golden)
    restores = {e["digest"] for e in events(run_dir, "restore")}
    saved = {e["digest"] for e in events(run_dir, "save") if e["step"] == 3}
    assert restores == saved  # the events say the state came back whole...
    assert ids_used_twice_in_an_epoch(run_dir, STEPS) == set()  # ...and no sample ran twice
    assert judgement.valid is True, summaries(judgement)


@pytest.mark.slow
def test_a_kill_mid_epoch_resumed_without_skip_first_batches_repeats_samples_and_is_judged_invalid(golden, tmp_path):
    run_dir = tmp_path / "kill-no-skip"
    assert kill_mid_epoch(run_dir, (*RESUME, "--no-skip"))[-1] == [0, 0]
    repeated = ids_used_twice_in_an_epoch(run_dir, STEPS)
    judgement = judged(run_dir, golden)
    assert repeated and judgement.verdicts["coverage"].valid is False
    assert judgement.valid is False


@pytest.mark.slow
def test_a_kill_inside_save_state_leaves_a_newest_folder_that_every_restart_picks_and_fails_on(golden, tmp_path):
    run_dir = tmp_path / "foreign"
    # Rank 0's save after update 6: mkdir(.), mkdir(checkpoint_1), save_file(model.safetensors),
    # torch.save(optimizer.bin): killed before the optimizer is written.
    plan = [{"id": "kill-in-save", "kind": "foreign_crash", "rank": 0, "step": 6, "op_index": 3,
             "when": "before"}]
    codes = job(run_dir, [Attempt(2), Attempt(2, RESUME), Attempt(2, RESUME)], plan)
    (fault,) = events(run_dir, "fault")
    assert fault["detail"] == ("SIGKILL before op 3 torch.save(checkpoint_1/optimizer.bin) "
                               "of the save at step 6")
    assert codes[0][0] == -9
    assert [e["step"] for e in events(run_dir, "save")] == [3]  # the probe never vouched for step 6
    assert (run_dir / "checkpoints" / "checkpoint_1" / "model.safetensors").is_file()
    assert not (run_dir / "checkpoints" / "checkpoint_1" / "optimizer.bin").exists()
    # load_state() takes the highest-numbered folder, complete or not: no restart restores.
    assert [e for e in events(run_dir, "restore")] == []
    assert all(code != 0 for attempt in codes[1:] for code in attempt)
    judgement = judged(run_dir, golden)
    assert judgement.verdicts["progress"].valid is False and judgement.valid is False


@pytest.mark.slow
def test_a_resume_on_one_rank_with_the_same_global_batch_is_judged_against_the_golden_run(golden, tmp_path):
    run_dir = tmp_path / "world-size"
    plan = [{"id": "kill-mid-epoch", "kind": "kill", "rank": 1, "step": 5}]
    codes = job(run_dir, [Attempt(2), Attempt(1, RESUME)], plan)
    assert fired(run_dir) == ["kill-mid-epoch"] and codes[-1] == [0]
    assert {e["world_size"] for e in events(run_dir, "batch") if e["attempt"] == 1} == {1}
    repeated = ids_used_twice_in_an_epoch(run_dir, STEPS)
    judgement = judged(run_dir, golden)
    assert (judgement.verdicts["coverage"].valid is False) == bool(repeated), summaries(judgement)
