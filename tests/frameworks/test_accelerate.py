"""The accelerate adapter, judged: 2 ranks, CPU gloo, a tiny model, offline.

Every run is a real `trainwreck run --cmd` job of trainer/frameworks/examples/accelerate_train.py
(the frameworks table's launcher), judged by the unchanged invariants against the golden run.
Each test asserts that its planned fault fired, from the run's own `fault` events, and that the
verdict agrees with what the run's own events show."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="pip install 'trainwreck[accelerate]'")

from tests.frameworks.runs import (custom, events, exit_codes, ids_used_twice_in_an_epoch,  # noqa: E402
                                    scenario, with_golden)

STEPS = 12
"""8 updates an epoch; saves after 3, 6, 9, 12 into checkpoints/checkpoint_<n>, the newest 2 kept."""


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_golden("accelerate", tmp_path_factory.mktemp("accelerate"))


def test_the_accelerate_golden_run_is_judged_valid(out: Path) -> None:
    golden = out / "accelerate-golden"
    saves = events(golden, "save")
    assert [(e["step"], e["checkpoint"]) for e in saves] == [(3, "checkpoint_0"), (6, "checkpoint_1"),
                                                             (9, "checkpoint_2"), (12, "checkpoint_3")]
    assert {e["rank"] for e in saves} == {0}
    assert ids_used_twice_in_an_epoch(golden, STEPS) == set()


@pytest.mark.slow  # nightly: moved out of the default run to keep it near 8 minutes (README, Tests)
def test_a_kill_mid_epoch_resumed_with_skip_first_batches_is_judged_valid(out: Path) -> None:
    row = scenario("accelerate", "kill-mid-epoch", out)
    run_dir = out / "accelerate-kill-mid-epoch"
    assert row.fired == ("kill-mid-epoch",)
    assert [e["step"] for e in events(run_dir, "restore")] == [3, 3]
    restores = {e["digest"] for e in events(run_dir, "restore")}
    saved = {e["digest"] for e in events(run_dir, "save") if e["step"] == 3}
    assert restores == saved  # the events say the state came back whole...
    assert ids_used_twice_in_an_epoch(run_dir, STEPS) == set()  # ...and no sample ran twice
    assert row.valid is True, row


@pytest.mark.slow
def test_a_kill_mid_epoch_resumed_without_skip_first_batches_repeats_samples_and_is_judged_invalid(out: Path) -> None:
    plan = [{"id": "kill-mid-epoch", "kind": "kill", "rank": 1, "step": 5}]
    row = custom("accelerate", "no-skip", out, restarts=1, faults=plan, args=("--no-skip",))
    run_dir = out / "accelerate-no-skip"
    assert row.fired == ("kill-mid-epoch",)
    repeated = ids_used_twice_in_an_epoch(run_dir, STEPS)
    assert repeated and "coverage" in row.invalid
    assert row.valid is False


@pytest.mark.slow
def test_a_kill_inside_save_state_leaves_a_newest_folder_that_every_restart_picks_and_fails_on(out: Path) -> None:
    # Rank 0's save after update 6: mkdir(.), mkdir(checkpoint_1), save_file(model.safetensors),
    # torch.save(optimizer.bin): killed before the optimizer is written.
    row = scenario("accelerate", "kill-in-save", out)
    run_dir = out / "accelerate-kill-in-save"
    (fault,) = events(run_dir, "fault")
    assert fault["detail"] == "SIGKILL before op 3 torch.save(checkpoint_1/optimizer.bin) of the save at step 6"
    assert exit_codes(run_dir, 0)[0] == -9
    assert [e["step"] for e in events(run_dir, "save")] == [3]  # the probe never vouched for step 6
    assert (run_dir / "checkpoints" / "checkpoint_1" / "model.safetensors").is_file()
    assert not (run_dir / "checkpoints" / "checkpoint_1" / "optimizer.bin").exists()
    # load_state() takes the highest-numbered folder, complete or not: no restart restores.
    assert events(run_dir, "restore") == []
    assert "progress" in row.invalid and row.valid is False


@pytest.mark.slow
def test_a_resume_on_one_rank_with_the_same_global_batch_is_judged_against_the_golden_run(out: Path) -> None:
    row = scenario("accelerate", "world-size", out)
    run_dir = out / "accelerate-world-size"
    assert row.fired == ("kill-mid-epoch",)
    assert {e["world_size"] for e in events(run_dir, "batch") if e["attempt"] == 1} == {1}
    repeated = ids_used_twice_in_an_epoch(run_dir, STEPS)
    assert ("coverage" in row.invalid) == bool(repeated), row
