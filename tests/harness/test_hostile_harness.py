"""A FIFO checkpoint file under the real harness (issue 24, item 3): the resumed attempt
rejects it and restores the previous checkpoint; no rank blocks on it, so the watchdog
sees no false hang and the run completes. And a resume refuses a run directory whose
folders lead out of it (item 1), before it writes anything."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from trainwreck.harness.supervise.create_rundir import RunDirError, create_run_dir
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.trainer.config import TrainConfig
from trainwreck.rundir.layout import iter_events


def test_a_fifo_checkpoint_file_under_the_harness_is_rejected_with_fallback_not_a_false_hang(tmp_path: Path) -> None:
    run = tmp_path / "run"
    spec = JobSpec(config=TrainConfig.tiny(total_steps=12, ckpt_interval=4), world_sizes=(2,), run_dir=run,
                   keep=True, max_restarts=0, hang_timeout_s=5.0,
                   plan=[{"id": "k1", "kind": "kill", "rank": 1, "step": 10}])
    first = run_job(spec)
    assert first.status == "failed"
    assert any(e["kind"] == "fault" and e.get("fault_id") == "k1" for e in iter_events(run, batches=False))
    model = run / "checkpoints" / "step-00000008" / "model.pt"
    model.unlink()
    os.mkfifo(model)
    second = run_job(replace(spec, plan=[]), resume=True)
    events = list(iter_events(run, batches=False))
    assert [e for e in events if e["kind"] == "hang"] == [], "a rank blocked on the FIFO"
    rejects = {e["checkpoint"]: e["reason"] for e in events if e["kind"] == "reject" and e.get("attempt") == 1}
    assert "not a regular file (a FIFO)" in rejects.get("step-00000008", ""), rejects
    assert {e["checkpoint"] for e in events if e["kind"] == "restore" and e.get("attempt") == 1} == {"step-00000004"}
    assert second.status == "completed", second.outcome


def test_a_resume_refuses_a_run_directory_whose_events_folder_links_outside(tmp_path: Path) -> None:
    # Found by tests/report/test_hostile_property.py: `events -> /elsewhere` took a resume's
    # event writes out of the run directory. create_run_dir now refuses the link, writing nothing.
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    run.mkdir()
    (run / "events").symlink_to(outside)
    spec = JobSpec(config=TrainConfig.tiny(total_steps=4), world_sizes=(1,), run_dir=run)
    with pytest.raises(RunDirError, match="events is a symlink, not a folder"):
        create_run_dir(spec, resume=True)
    assert list(outside.iterdir()) == [] and not (run / "run.json").exists()
