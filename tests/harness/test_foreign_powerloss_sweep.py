"""Power loss for the framework writers (harness/suites/sweep.py ForeignPowerLoss): a
framework's own saves recorded in its ranks (faults/foreign_record.py), each crash state
materialised with the event log cut at the power cut, and the framework's own example
script resumed from it through `trainwreck run --cmd`'s launcher, judged by every invariant.
Each resume imports the framework on 2 ranks (5-10 s each here): the runs are `slow`."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.conftest import assert_no_leftover_processes, harness_events, rank_events
from trainwreck.faults.powerloss import CrashState, OpLog, issued_state, states_at
from trainwreck.harness.registry import COMMAND
from trainwreck.harness.suites.sweep import (FOREIGN_WRITERS, Framework, crash_run_dir, foreign_spec, judge_resumed_cmd,
                                      observe_foreign)


def test_a_framework_writer_that_is_not_installed_exits_2_naming_the_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(FOREIGN_WRITERS, "lightning",
                        Framework("lightning", "trainwreck_no_such_framework", "lightning", "lightning_train.py", sweep_args=("--resume",)))
    from trainwreck.harness.cli import main

    # Through the real parser (every option's default), then the one exit path: the command raises.
    assert main(["sweep", "--power-loss", "--framework", "lightning", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'trainwreck[lightning]'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists(), "nothing may start before the check"


def test_the_framework_writers_command_runs_their_script_under_the_recording_wrapper() -> None:
    spec = foreign_spec(FOREIGN_WRITERS["accelerate"], Path("/nonexistent/run"), record=True)
    assert spec.target.kind == COMMAND and spec.world_sizes == (2,)
    words = spec.target.command.split()
    assert words[1:4] == ["-m", "trainwreck.faults.foreign_record", "--record"]
    assert words[words.index("--") + 1].endswith("trainer/frameworks/examples/accelerate_train.py")
    assert "--record" not in foreign_spec(FOREIGN_WRITERS["accelerate"], Path("/r")).target.command


def judge_state(observed: Path, log: OpLog, state: CrashState, writer: str, run_dir: Path):  # type: ignore[no-untyped-def]
    crash_run_dir(observed, log, state, run_dir)
    return judge_resumed_cmd(foreign_spec(FOREIGN_WRITERS[writer], run_dir), None, f"test {writer}")


def whole(log: OpLog, point: int) -> CrashState:
    """The state of `point` in which every issued op reached the disk (nothing lost or torn)."""
    state = issued_state(log, point)
    assert not state.damage, state.damage
    return state


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OpLog]:
    pytest.importorskip("lightning")
    return observe_foreign(FOREIGN_WRITERS["lightning"], tmp_path_factory.mktemp("lightning") / "observed")


@pytest.mark.slow
def test_lightnings_own_moves_are_recorded_each_followed_by_the_adapters_fsyncs(lightning_run) -> None:  # type: ignore[no-untyped-def]
    _, log = lightning_run
    renames = [op for op in log.ops if op.kind == "rename"]
    assert [op.dst for op in renames] == ["epoch=0-step=4.ckpt", "last.ckpt", "epoch=0-step=8.ckpt", "last.ckpt",
                                          "epoch=1-step=12.ckpt", "last.ckpt"]
    for op in renames:  # fsspec wrote it in $TMPDIR and moved it in; trainwreck's CheckpointIO then fsyncs
        assert op.path == "<outside the root>" and log.ops[op.index - 1].kind == "data"
        assert [o.kind for o in log.ops[op.index + 1:op.index + 3]] == ["fsync_file", "fsync_dir"]


@pytest.mark.slow
def test_a_cut_after_lightning_replaced_last_ckpt_resumes_a_state_no_save_announced(
        lightning_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    observed, log = lightning_run
    second = [op for op in log.ops if op.kind == "rename" and op.dst == "last.ckpt"][1]
    judged = judge_state(observed, log, whole(log, second.index + 1), "lightning", tmp_path / "cut")
    run_dir = judged.record.run_dir
    # The cut is in the run's own events: attempt 0 announced last.ckpt at step 4 only, then attempt 1 ran.
    saves = [(e["checkpoint"], e["step"]) for e in rank_events(run_dir, "save") if e["attempt"] == 0]
    assert ("last.ckpt", 4) in saves and ("last.ckpt", 8) not in saves, saves
    assert {e["attempt"] for e in harness_events(run_dir, "attempt")} == {0, 1}
    continuity = judged.judgement.verdicts["continuity"]
    assert continuity.valid is False
    assert any("restored last.ckpt as step 8, but it was saved at step 4" in line for line in continuity.evidence)
    assert_no_leftover_processes()


@pytest.mark.slow
def test_a_cut_after_the_barriers_of_lightnings_second_save_resumes_validly(
        lightning_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    observed, log = lightning_run
    second = [op for op in log.ops if op.kind == "rename" and op.dst == "last.ckpt"][1]
    judged = judge_state(observed, log, whole(log, second.index + 3), "lightning", tmp_path / "synced")
    assert judged.judgement.valid is True, judged.judgement.to_json()
    assert {(e["checkpoint"], e["step"]) for e in rank_events(judged.record.run_dir, "restore")} == {("last.ckpt", 8)}
    assert_no_leftover_processes()


@pytest.fixture(scope="module")
def accelerate_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OpLog]:
    pytest.importorskip("accelerate")
    return observe_foreign(FOREIGN_WRITERS["accelerate"], tmp_path_factory.mktemp("accelerate") / "observed")


def first_save_settled(log: OpLog) -> int:
    """The crash point right before accelerate starts its second save (mkdir(checkpoint_1))."""
    return next(op.index for op in log.ops if op.kind == "mkdir" and op.path == "checkpoint_1")


@pytest.mark.slow
def test_accelerate_announces_a_checkpoint_whose_counter_file_a_power_cut_can_empty(
        accelerate_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    observed, log = accelerate_run
    point = first_save_settled(log)
    counter = "checkpoint_0/custom_checkpoint_0.pkl"
    assert not any(op.kind == "fsync_file" and op.path == counter for op in log.ops[:point]), "nobody fsyncs it"
    state = next(s for s in states_at(log, point, cap=4096)
                 if s.tree.get(counter) == b"" and s.damage == (f"{counter} is empty (its "
                                                                f"{len(s.ops[_write_of(log, counter)].data)} bytes "
                                                                "were never made durable)",))
    judged = judge_state(observed, log, state, "accelerate", tmp_path / "cut")
    run_dir = judged.record.run_dir
    assert ("checkpoint_0", 3) in [(e["checkpoint"], e["step"]) for e in rank_events(run_dir, "save")]
    assert not [e for e in rank_events(run_dir, "restore") if e["attempt"] >= 1], "load_state cannot load it"
    verdicts = judged.judgement.verdicts
    assert verdicts["progress"].valid is False and verdicts["atomicity"].valid is False
    assert "checkpoint_0 (step 3) was announced by the save event at" in verdicts["atomicity"].evidence[0]
    assert_no_leftover_processes()


@pytest.mark.slow
def test_the_same_accelerate_cut_with_every_issued_byte_on_disk_resumes_validly(
        accelerate_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    observed, log = accelerate_run
    judged = judge_state(observed, log, whole(log, first_save_settled(log)), "accelerate", tmp_path / "whole")
    assert judged.judgement.valid is True, judged.judgement.to_json()
    assert [e["checkpoint"] for e in rank_events(judged.record.run_dir, "restore") if e["attempt"] == 1] \
        == ["checkpoint_0", "checkpoint_0"]


def _write_of(log: OpLog, path: str) -> int:
    return next(op.index for op in log.ops if op.kind == "data" and op.path == path)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OpLog]:
    pytest.importorskip("transformers")
    return observe_foreign(FOREIGN_WRITERS["hf"], tmp_path_factory.mktemp("hf") / "observed")


def second_save_begins(log: OpLog) -> int:
    """The crash point right before the Trainer makes checkpoint-8's folder: checkpoint-4 is
    announced by then (a cut after that mkdir leaves an empty checkpoint-8, which
    get_last_checkpoint picks: the process-crash failure, not this one)."""
    return next(op.index for op in log.ops if op.kind == "mkdir" and op.path == "checkpoint-8")


@pytest.mark.slow
def test_a_power_cut_can_tear_a_checkpoint_the_hf_trainer_already_announced(hf_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    observed, log = hf_run
    assert not [op for op in log.ops if op.kind.startswith("fsync")], "the Trainer fsyncs nothing"
    model = "checkpoint-4/model.safetensors"
    state = next(s for s in states_at(log, second_save_begins(log), cap=4096)
                 if s.tree.get(model) == b"")
    judged = judge_state(observed, log, state, "hf", tmp_path / "cut")
    run_dir = judged.record.run_dir
    assert ("checkpoint-4", 4) in [(e["checkpoint"], e["step"]) for e in rank_events(run_dir, "save")]
    assert not [e for e in rank_events(run_dir, "restore") if e["attempt"] >= 1], "nothing loadable was resumed"
    assert judged.judgement.verdicts["progress"].valid is False, judged.judgement.to_json()
    assert_no_leftover_processes()


@pytest.mark.slow
def test_the_same_hf_cut_with_every_issued_byte_on_disk_resumes_validly(hf_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    observed, log = hf_run
    judged = judge_state(observed, log, whole(log, second_save_begins(log)), "hf", tmp_path / "whole")
    assert judged.judgement.valid is True, judged.judgement.to_json()
    assert {(e["checkpoint"], e["step"]) for e in rank_events(judged.record.run_dir, "restore")} \
        == {("checkpoint-4", 4)}
