"""The Lightning adapter, judged: 2 ranks, CPU gloo, a tiny model, offline.

Every run is a real `trainwreck run --cmd` job of trainer/frameworks/examples/lightning_train.py
(the frameworks table's launcher), judged by the unchanged invariants against the golden run.
Each test asserts that its planned fault fired, from the run's own `fault` events, and that the
verdict agrees with what the run's own events show."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="pip install 'trainwreck[lightning]'")

from tests.frameworks.runs import (custom, events, exit_codes, ids_used_twice_in_an_epoch,  # noqa: E402
                                    scenario, with_golden)

STEPS = 12
"""8 updates an epoch; the table's Lightning trainer saves after 6 and 12 (a top-2 file and last.ckpt each)."""


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's runs, beside the golden run they are judged against."""
    return with_golden("lightning", tmp_path_factory.mktemp("lightning"))


def test_the_lightning_golden_run_is_judged_valid(out: Path) -> None:
    golden = out / "lightning-golden"
    steps = events(golden, "step")
    assert sorted({e["step"] for e in steps}) == list(range(1, STEPS + 1))
    # every rank reports every update with the same digest: the adapter sees the replicated state
    for step in range(1, STEPS + 1):
        assert len({e["digest"] for e in steps if e["step"] == step}) == 1
    saves = events(golden, "save")
    assert {e["rank"] for e in saves} == {0}
    assert sorted({e["step"] for e in saves}) == [6, 12]
    assert ids_used_twice_in_an_epoch(golden, STEPS) == set()
    # the save's file operations were recorded (the crash points of crash-every-op)
    ops = [e["ops"] for e in events(golden, "save_ops") if e["rank"] == 0 and e["step"] == 6]
    assert ops and ops[0][:2] == ["mkdir(.)", "rename(<outside the root>, epoch=0-step=6.ckpt)"]


@pytest.mark.slow
def test_a_kill_mid_epoch_and_resume_repeats_the_epochs_first_batches_and_is_judged_invalid(out: Path) -> None:
    row = scenario("lightning", "kill-mid-epoch", out)
    run_dir = out / "lightning-kill-mid-epoch"
    assert row.fired == ("kill-mid-epoch",) and exit_codes(run_dir, 0)[1] == -9
    assert [e["step"] for e in events(run_dir, "restore")] == [6, 6]  # last.ckpt of step 6, on both ranks
    repeated = ids_used_twice_in_an_epoch(run_dir, STEPS)
    # What the events show decides: ids used twice in an epoch break coverage.
    assert ("coverage" in row.invalid) == bool(repeated)
    assert repeated, "Lightning restarted the epoch's sampler order after a mid-epoch resume (see docs)"
    assert row.valid is False


@pytest.mark.slow
def test_a_kill_before_lightning_moves_a_checkpoint_into_place_leaves_nothing_and_the_restart_starts_fresh(
        out: Path) -> None:
    row = scenario("lightning", "kill-in-save", out)
    run_dir = out / "lightning-kill-in-save"
    (fault,) = events(run_dir, "fault")
    assert fault["fault_id"] == "kill-in-save"
    assert fault["detail"] == "SIGKILL before op 1 rename(<outside the root>, epoch=0-step=6.ckpt) of the save at step 6"
    assert [e["step"] for e in events(run_dir, "save") if e["attempt"] == 0] == []  # never reported
    assert events(run_dir, "restore") == []  # no last.ckpt yet: a fresh start
    assert "atomicity" not in row.invalid
    assert row.valid is True, row


@pytest.mark.slow
def test_a_truncated_last_checkpoint_stops_every_restart_and_the_run_is_judged_invalid(out: Path) -> None:
    row = scenario("lightning", "corrupt-newest", out)
    run_dir = out / "lightning-corrupt-newest"
    assert sorted(row.fired) == ["cut-newest", "kill-mid-epoch"]
    (cut,) = [e for e in events(run_dir, "fault") if e["fault_id"] == "cut-newest"]
    assert cut["checkpoint"] == "last.ckpt"
    assert [e for e in events(run_dir, "restore") if e["attempt"] >= 1] == []  # Lightning never loaded it
    assert all(code != 0 for code in exit_codes(run_dir, 1).values())
    assert "progress" in row.invalid and row.valid is False


def other_filesystem_than(path: Path) -> Path | None:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != path.stat().st_dev else None


@pytest.mark.slow
def test_with_tmpdir_on_another_filesystem_a_torn_copy_leaves_a_broken_last_checkpoint(out: Path) -> None:
    tmpdir = other_filesystem_than(out)
    if tmpdir is None:
        pytest.skip("needs a writable /dev/shm on another filesystem than the run directory")
    # last.ckpt only; fsspec's rename into place fails across filesystems (op 1), so shutil.move
    # copies the temporary file into last.ckpt (op 2): that copy is what is torn.
    plan = [{"id": "tear-copy", "kind": "foreign_crash", "rank": 0, "step": 6, "op_index": 2, "when": "torn"}]
    row = custom("lightning", "cross-device", out, restarts=2, faults=plan, args=("--top-k", "0"),
                 prefix=("env", f"TMPDIR={tmpdir}"))
    run_dir = out / "lightning-cross-device"
    (fault,) = events(run_dir, "fault")
    assert fault["fault_id"] == "tear-copy" and fault["detail"].startswith("tore op 2 open(last.ckpt)")
    assert exit_codes(run_dir, 0)[0] == -9
    assert [e for e in events(run_dir, "restore") if e["attempt"] >= 1] == []  # every restart dies loading it
    assert "progress" in row.invalid and row.valid is False
