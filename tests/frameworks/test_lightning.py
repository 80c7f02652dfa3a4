"""The Lightning adapter, judged: 2 ranks, CPU gloo, a tiny model, offline.

Runs go through tests/frameworks/scripts/launch.py (a stand-in for `trainwreck run --cmd`)
and stand_in_probe.py (a stand-in for trainer/probe.py), and are judged by the unchanged
invariants. Each test asserts that its planned fault fired and that the verdict agrees with
what the run's own events show."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning", reason="pip install 'trainwreck[lightning]'")

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from launch import Attempt, events, fired, ids_used_twice_in_an_epoch, judged, python, run_job  # noqa: E402

STEPS, SAVE_EVERY, DATASET, GLOBAL_BATCH = 12, 3, 64, 8
"""8 updates an epoch; saves after 3, 6, 9, 12 (a top-2 file and last.ckpt each)."""


def job(run_dir: Path, attempts: list[Attempt], faults: list[dict[str, Any]] | None = None,
        save_every: int = SAVE_EVERY, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> list[list[int]]:
    cmd = python("lightning_train.py", "--steps", str(STEPS), "--save-every", str(save_every),
                 "--global-batch", str(GLOBAL_BATCH), *args)
    return run_job(cmd, run_dir, attempts, STEPS, DATASET, GLOBAL_BATCH, faults or [], env)


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("lightning") / "golden"
    assert job(run_dir, [Attempt(2)]) == [[0, 0]]
    return run_dir


def test_the_lightning_golden_run_is_judged_valid(golden):
    judgement = judged(golden, None)
    assert judgement.valid is True, {k: v.summary for k, v in judgement.verdicts.items()}
    steps = events(golden, "step")
    assert sorted({e["step"] for e in steps}) == list(range(1, STEPS + 1))
    # every rank reports every update with the same digest: the adapter sees the replicated state
    for step in range(1, STEPS + 1):
        assert len({e["digest"] for e in steps if e["step"] == step}) == 1
    saves = events(golden, "save")
    assert {e["rank"] for e in saves} == {0}
    assert sorted({e["step"] for e in saves}) == [3, 6, 9, 12]
    assert ids_used_twice_in_an_epoch(golden, STEPS) == set()


@pytest.mark.slow
def test_a_kill_mid_epoch_and_resume_repeats_the_epochs_first_batches_and_is_judged_invalid(golden, tmp_path):
    run_dir = tmp_path / "kill"
    plan = [{"id": "kill-mid-epoch", "kind": "kill", "rank": 1, "step": 5}]
    codes = job(run_dir, [Attempt(2), Attempt(2, ("--resume",))], plan)
    assert codes[0][1] == -9 and codes[-1] == [0, 0]
    assert fired(run_dir) == ["kill-mid-epoch"]
    assert [e["step"] for e in events(run_dir, "restore")] == [3, 3]  # last.ckpt of step 3, on both ranks
    repeated = ids_used_twice_in_an_epoch(run_dir, STEPS)
    judgement = judged(run_dir, golden)
    # What the events show decides: ids used twice in an epoch break coverage.
    assert (judgement.verdicts["coverage"].valid is False) == bool(repeated)
    assert repeated, "Lightning restarted the epoch's sampler order after a mid-epoch resume (see docs)"
    assert judgement.valid is False


@pytest.mark.slow
def test_a_kill_before_lightning_moves_a_checkpoint_into_place_leaves_the_previous_one_and_resumes(golden, tmp_path):
    run_dir = tmp_path / "foreign"
    # The save after update 6: op 0 makes the folder, op 1 moves fsspec's temporary file into place.
    plan = [{"id": "kill-in-save", "kind": "foreign_crash", "rank": 0, "step": 6, "op_index": 1,
             "when": "before"}]
    codes = job(run_dir, [Attempt(2), Attempt(2, ("--resume",))], plan, save_every=6)
    assert codes[0][0] == -9 and codes[-1] == [0, 0]
    (fault,) = events(run_dir, "fault")
    assert fault["fault_id"] == "kill-in-save"
    assert fault["detail"] == "SIGKILL before op 1 rename(<outside the root>, epoch=0-step=6.ckpt) of the save at step 6"
    assert [e["step"] for e in events(run_dir, "save") if e["attempt"] == 0] == []  # never reported
    assert {e["step"] for e in events(run_dir, "restore")} == set()  # no last.ckpt yet: a fresh start
    judgement = judged(run_dir, golden)
    assert judgement.verdicts["atomicity"].valid is True
    assert judgement.valid is True, {k: v.summary for k, v in judgement.verdicts.items()}


@pytest.mark.slow
def test_a_truncated_last_checkpoint_stops_every_restart_and_the_run_is_judged_invalid(golden, tmp_path):
    run_dir = tmp_path / "corrupt"
    plan = [{"id": "kill", "kind": "kill", "rank": 1, "step": 8},
            {"id": "cut-last", "kind": "corrupt", "how": "truncate", "file": "last.ckpt", "attempt": 1}]
    codes = job(run_dir, [Attempt(2), Attempt(2, ("--resume",)), Attempt(2, ("--resume",))], plan)
    assert sorted(fired(run_dir)) == ["cut-last", "kill"]
    assert all(code != 0 for attempt in codes[1:] for code in attempt)
    assert [e for e in events(run_dir, "restore") if e["attempt"] >= 1] == []  # Lightning never loaded it
    judgement = judged(run_dir, golden)
    assert judgement.verdicts["progress"].valid is False
    assert judgement.valid is False


def other_filesystem_than(path: Path) -> Path | None:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != path.stat().st_dev else None


@pytest.mark.slow
def test_with_tmpdir_on_another_filesystem_a_torn_copy_leaves_a_broken_last_checkpoint(golden, tmp_path):
    tmpdir = other_filesystem_than(tmp_path)
    if tmpdir is None:
        pytest.skip("needs a writable /dev/shm on another filesystem than the run directory")
    run_dir = tmp_path / "cross-device"
    # last.ckpt only; fsspec's rename into place fails across filesystems (op 1), so shutil.move
    # copies the temporary file into last.ckpt (op 2): that copy is what is torn.
    plan = [{"id": "tear-copy", "kind": "foreign_crash", "rank": 0, "step": 6, "op_index": 2, "when": "torn"}]
    codes = job(run_dir, [Attempt(2), Attempt(2, ("--resume",)), Attempt(2, ("--resume",))], plan,
                args=("--top-k", "0"), env={"TMPDIR": str(tmpdir)})
    (fault,) = events(run_dir, "fault")
    assert fault["fault_id"] == "tear-copy" and fault["detail"].startswith("tore op 2 open(last.ckpt)")
    assert codes[0][0] == -9
    assert all(code != 0 for attempt in codes[1:] for code in attempt)  # every restart dies loading it
    assert [e for e in events(run_dir, "restore") if e["attempt"] >= 1] == []
    assert judged(run_dir, golden).verdicts["progress"].valid is False
