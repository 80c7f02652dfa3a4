"""Several small 2-rank jobs meant to run side by side under pytest-xdist.

Not collected by default (the name does not start with test_); test_parallel.py runs
it with ``pytest -n 2``. Every job binds its own store on port 0, so none can
collide with another, whatever the number of workers.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from tests.harness.conftest import assert_no_leftover_processes, harness_events
from trainwreck.trainer.config import TrainConfig


@pytest.mark.parametrize("job", range(6))
def test_a_small_two_rank_job_completes_next_to_others(tmp_path: Path, job: int) -> None:
    plan = [{"id": "k", "kind": "signal", "rank": job % 2, "signal": "SIGKILL", "step": 3}] if job % 3 == 0 else []
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=6), world_sizes=(2,), plan=plan,
                             run_dir=tmp_path / "run"))
    assert record.outcome == "completed"
    assert len(harness_events(tmp_path / "run", "fault")) == len(plan)
    assert_no_leftover_processes()
