"""The watchdog's checkpoint budget covers the writer's storage, not a rank that hung meanwhile."""
from __future__ import annotations

from pathlib import Path

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.invariants import judge, load_history
from tests.harness.conftest import assert_no_leftover_processes, harness_events, rank_events, silent_since
from trainwreck.trainer.config import TrainConfig


def test_a_rank_that_hangs_while_rank_0_saves_is_reported_within_the_timeout(tmp_path: Path) -> None:
    run, timeout = tmp_path / "run", 2.0
    # Rank 1 stops itself exactly where it waits for rank 0's save of step 4. Before the
    # writer had a phase of its own, every rank sat in "checkpoint" here, the watchdog
    # applied the 3x checkpoint budget, and the hang invariant judged the run late.
    plan = [{"id": "h1", "kind": "hang", "rank": 1, "step": 4, "point": "save.wait", "how": "sigstop",
             "expect": "hang"}]
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=8, ckpt_interval=4), world_sizes=(2,),
                             plan=plan, hang_timeout_s=timeout, run_dir=run))
    assert (record.outcome, record.hangs, record.attempts) == ("completed", 1, 2)
    [fault] = [e for e in rank_events(run, "fault") if e["fault_id"] == "h1"]
    [hang] = harness_events(run, "hang")
    assert 1 in hang["ranks"] and hang["t"] > fault["t"]
    # Counted from the last progress published (rank 0's save ended after the fault, and took what
    # the disk gave it): a 3x checkpoint budget would put this at 6 s.
    assert hang["t"] - silent_since(run, 0, 2) <= timeout + 1.0
    verdicts = judge(load_history(run)).verdicts
    assert verdicts["hang"].valid is True, verdicts["hang"].summary
    assert_no_leftover_processes()
