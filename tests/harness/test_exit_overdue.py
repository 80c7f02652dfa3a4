"""A rank that finished training but never exits (a teardown deadlock) is bounded: its stacks are
dumped, it is killed after the exit budget, and the run, whose training was complete, is judged
as completed and says what happened."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwreck.harness.judge.runner import run_judged
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.rundir.layout import iter_events
from trainwreck.trainer.config import TrainConfig
from tests.harness.conftest import assert_no_leftover_processes

EXIT_BUDGET_S = 2.0


# Under torchrun the agent owns the workers: the harness ends the job once every live worker is done
# and one is overdue (the agent would wait for it forever); the workers' exit codes are the agent's.
@pytest.mark.parametrize("launcher", ["warm", pytest.param("torchrun", marks=pytest.mark.slow)])
def test_a_rank_stuck_after_done_is_dumped_killed_and_the_completed_run_says_so(tmp_path: Path, launcher: str) -> None:
    run = tmp_path / "run"
    spec = JobSpec(config=TrainConfig.tiny(total_steps=4), world_sizes=(2,), run_dir=run, max_restarts=1,
                   launcher=launcher, entry="tests.harness.stuck_exit_entry:run_rank", exit_timeout_s=EXIT_BUDGET_S)
    try:
        judged = run_judged(spec, golden_cache=tmp_path / "golden")
    finally:
        assert_no_leftover_processes()
    events = list(iter_events(run, batches=False))
    overdue = [e for e in events if e["kind"] == "exit_overdue"]
    assert len(overdue) == 1, "the stuck rank is recorded once"
    # Under torchrun rank 1 was also still alive 2 s after its done, in interpreter teardown (its dump
    # holds no Python frame), seen in every try: named too, which is what the harness saw.
    assert overdue[0]["ranks"] == [0] if launcher == "warm" else overdue[0]["ranks"][0] == 0, overdue
    assert overdue[0]["budget_s"] == EXIT_BUDGET_S
    assert overdue[0]["after_s"] > EXIT_BUDGET_S, "measured from its done, past the budget"
    stack = (run / next(p for p in overdue[0]["stacks"] if "-r000-" in p)).read_text()
    assert "stuck_exit_entry.py" in stack, "the dump shows where the rank waits"
    exits = {e["rank"]: e for e in events if e["kind"] == "exit"}
    if launcher == "warm":
        assert exits[0]["code"] == -9 and exits[0]["stopped_by_harness"] and exits[1]["code"] == 0
    assert [e["attempt"] for e in events if e["kind"] == "attempt"] == [0], "a finished attempt is not rerun"
    assert judged.record.outcome == "completed" and judged.judgement.valid, judged.judgement
    assert judged.root_cause is None, "a rank the harness ended after its training is nobody's crash"
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["facts"]["exit_overdue"][0]["ranks"] == ", ".join(map(str, overdue[0]["ranks"]))
    from trainwreck.report.truth import check_report

    assert check_report(run) == []
    who = "rank 0" if launcher == "warm" else report["facts"]["exit_overdue"][0]["who"]
    words = f"{who} published done but had not exited"
    said = [c for c in report["claims"] if c["key"] == "recovery.exit_overdue"]
    assert said and said[0]["rendered"] and words in said[0]["text"], said
    assert words in (run / "report" / "report.md").read_text()
