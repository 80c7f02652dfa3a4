"""Hugging Face Trainer (tiny GPT-2 from config, offline, 2 gloo ranks) under `--cmd`: its golden
run and its kill-and-resume are judged valid, and every table scenario runs, its faults fire and
its verdict follows from the run's own events. About 30-60 s a run here: importing transformers'
Trainer costs ~6 s per process, so all but the golden run are `slow`."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.frameworks.runs import custom, events, exit_codes, ids_used_twice_in_an_epoch, scenario, with_golden

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
    reason="needs the hf extra: pip install -e '.[hf]'")
STEPS = 12


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_golden("hf", tmp_path_factory.mktemp("hf"))


def test_hf_trainers_uninterrupted_run_is_judged_valid_with_the_trainers_global_loss(out: Path) -> None:
    golden = out / "hf-golden"
    batches = events(golden, "batch")
    assert len(batches) == 24 and all(len(e["samples"]) == 4 for e in batches)  # 12 updates x 2 ranks x 4 ids
    assert sorted(e["step"] for e in events(golden, "save")) == [3, 6, 9, 12]
    steps = events(golden, "step")
    # the loss the Trainer gathered from both ranks and logged: one value per update, equal on both ranks
    for step in range(1, STEPS + 1):
        losses = {e["loss"] for e in steps if e["step"] == step}
        assert len(losses) == 1 and isinstance(next(iter(losses)), float)


@pytest.mark.slow
def test_hf_trainer_killed_mid_epoch_resumes_bit_identical_and_is_judged_valid(out: Path) -> None:
    row = scenario("hf", "kill-mid-epoch", out)
    run_dir = out / "hf-kill-mid-epoch"
    assert row.fired == ("kill-mid-epoch",) and exit_codes(run_dir, 0)[1] == -9
    restores = sorted((e["attempt"], e["rank"], e["step"]) for e in events(run_dir, "restore"))
    assert restores == [(1, 0, 3), (1, 1, 3)]  # mid-epoch: 8 updates an epoch
    assert row.valid is True, row


@pytest.mark.slow
def test_a_kill_inside_hf_trainers_save_leaves_a_newest_checkpoint_every_restart_dies_on(out: Path) -> None:
    row = scenario("hf", "kill-in-save", out)
    run_dir = out / "hf-kill-in-save"
    (fault,) = events(run_dir, "fault")
    assert fault["detail"] == "SIGKILL before op 8 torch.save(checkpoint-6/optimizer.pt) of the save at step 6"
    assert [e["step"] for e in events(run_dir, "save")] == [3]  # step 6 was never reported
    # get_last_checkpoint() takes checkpoint-6, which has no trainer_state.json: no restart restores.
    assert not (run_dir / "checkpoints" / "checkpoint-6" / "trainer_state.json").exists()
    assert events(run_dir, "restore") == []
    assert "progress" in row.invalid and row.valid is False


@pytest.mark.slow
def test_a_truncated_newest_hf_checkpoint_stops_every_restart(out: Path) -> None:
    row = scenario("hf", "corrupt-newest", out)
    run_dir = out / "hf-corrupt-newest"
    assert sorted(row.fired) == ["cut-newest", "kill-mid-epoch"]
    (cut,) = [e for e in events(run_dir, "fault") if e["fault_id"] == "cut-newest"]
    assert cut["checkpoint"] == "checkpoint-6"
    assert [e for e in events(run_dir, "restore") if e["attempt"] >= 1] == []
    assert "progress" in row.invalid and row.valid is False


@pytest.mark.slow
def test_an_hf_resume_on_one_rank_sees_the_same_samples_and_continuity_compares_the_loss(out: Path) -> None:
    row = scenario("hf", "world-size", out)
    run_dir = out / "hf-world-size"
    assert row.fired == ("kill-mid-epoch",)
    assert {e["world_size"] for e in events(run_dir, "step") if e["attempt"] == 1} == {1}
    assert "coverage" not in row.invalid  # a fixed global batch: the same samples per update
    resumed = {e["step"]: e["loss"] for e in events(run_dir, "step") if e["attempt"] == 1}
    golden = {e["step"]: e["loss"] for e in events(out / "hf-golden", "step")}
    differs = any(abs(resumed[s] - golden[s]) > 1e-3 for s in resumed)
    assert ("continuity" in row.invalid) == differs, row


@pytest.mark.slow
def test_a_hung_hf_rank_is_seen_by_the_watchdog_restarted_and_judged(out: Path) -> None:
    row = scenario("hf", "hang", out)
    run_dir = out / "hf-hang"
    assert row.fired == ("hang",)
    (hang,) = events(run_dir, "hang")
    assert 1 in hang["ranks"]
    assert row.valid is True, row


@pytest.mark.slow
@pytest.mark.parametrize("batch, repeated", [(("--global-batch", "8"), False), (("--per-device", "4"), True)])
def test_without_dropout_an_hf_resume_on_one_rank_is_valid_only_with_a_fixed_global_batch(
        tmp_path: Path, batch: tuple[str, str], repeated: bool) -> None:
    args = ("--dropout", "0", *batch)
    assert custom("hf", "golden", tmp_path, args=args).valid is True
    plan = [{"id": "kill-mid-epoch", "kind": "kill", "rank": 1, "step": 5}]
    row = custom("hf", "world-size", tmp_path, world_sizes=(2, 1), restarts=1, faults=plan, args=args)
    run_dir = tmp_path / "hf-world-size"
    assert row.fired == ("kill-mid-epoch",)
    twice = ids_used_twice_in_an_epoch(run_dir, STEPS)
    assert bool(twice) == repeated and ("coverage" in row.invalid) == repeated, row
    assert row.valid is (not repeated), row
