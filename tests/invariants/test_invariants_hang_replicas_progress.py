"""hang, replicas and progress."""

from __future__ import annotations

from histories import HistoryBuilder

from trainwreck.invariants import check_hang, check_progress, check_replicas

HANG = {"id": "h1", "kind": "hang", "rank": 1, "step": 3, "expect": "hang"}


def hung_run(b: HistoryBuilder, *, named: list[int], after: float) -> HistoryBuilder:
    att = b.attempt(2).train(2, save_every=2)
    fired = att.fault("h1", rank=1)
    b.hang_detected(0, named, at=fired["t"] + after, waiting=[0], last_step=2)
    att.crash(1)
    b.attempt(2, restore="step-00000002").train(b.spec["total_steps"])
    b.end()
    return b


# -- hang ----------------------------------------------------------------------


def test_hang_detected_in_time_naming_the_rank_is_valid(builder):
    verdict = check_hang(hung_run(builder(total_steps=4, faults=[HANG]), named=[1], after=10.5).load())
    assert verdict.valid is True, verdict
    assert "within 10 s + 1 s slack" in verdict.summary


def test_hang_reported_late_is_invalid(builder):
    verdict = check_hang(hung_run(builder(total_steps=4, faults=[HANG]), named=[1], after=11.5).load())
    assert verdict.valid is False
    assert "detected 11.50 s after it fired, beyond 10 s + 1 s slack" in verdict.evidence[0]


def test_slack_comes_from_run_json(builder):
    b = hung_run(builder(total_steps=4, faults=[HANG], hang_slack_s=2.0), named=[1], after=11.5)
    assert check_hang(b.load()).valid is True


def test_hang_naming_the_wrong_rank_is_invalid(builder):
    verdict = check_hang(hung_run(builder(total_steps=4, faults=[HANG]), named=[0], after=10.2).load())
    assert verdict.valid is False
    assert "hang event names rank(s) [0], not the hung rank 1" in verdict.evidence[0]


def test_hang_never_detected_is_invalid(builder):
    b = builder(total_steps=4, faults=[HANG])
    b.attempt(2).train(2).fault("h1", rank=1)
    b.end("failed", 2)
    verdict = check_hang(b.load())
    assert verdict.valid is False
    assert "no hang event followed" in verdict.evidence[0]


def test_false_hang_alarm_is_invalid(builder):
    b = builder(total_steps=4, faults=[{"id": "s1", "kind": "stall", "rank": 1, "step": 2}])
    att = b.attempt(2).train(2)
    att.fault("s1", rank=1)
    b.hang_detected(0, [1], at=b.tick(3.0))
    verdict = check_hang(b.load())
    assert verdict.valid is False
    assert verdict.evidence[0].startswith("false alarm: hang event in attempt 0 naming rank(s) [1]")


def test_no_hang_planned_and_none_reported_is_valid(builder):
    b = builder(total_steps=2)
    b.attempt(2).train(2)
    verdict = check_hang(b.load())
    assert verdict.valid is True
    assert "nothing to detect" in verdict.summary


def test_planned_hang_that_never_fired_is_unknown(builder):
    b = builder(total_steps=2, faults=[HANG])
    b.attempt(2).train(2)
    verdict = check_hang(b.load())
    assert verdict.valid == "unknown"
    assert "never fired: h1" in verdict.summary


def test_harness_applied_hang_with_null_rank_uses_the_planned_rank(builder):
    b = builder(total_steps=2, faults=[HANG])
    b.attempt(2).train(2)
    fired = b.harness("fault", fault_id="h1", attempt=0, rank=None, detail="SIGSTOP")
    b.hang_detected(0, [1], at=fired["t"] + 10.0)
    assert check_hang(b.load()).valid is True


# -- replicas --------------------------------------------------------------------


def test_replicas_that_agree_are_valid(builder):
    b = builder(total_steps=4)
    b.attempt(4).train(4)
    verdict = check_replicas(b.load())
    assert verdict.valid is True
    assert verdict.counts["steps_compared"] == 4


def test_replicas_diverging_at_one_step_are_invalid(builder):
    b = builder(total_steps=4)
    att = b.attempt(3).train(2)
    att.train(3, ranks=(0, 1))
    att.emit(2, "batch", step=3, epoch=0, samples=b.rank_batch(3, 2, 3))
    att.emit(2, "step", step=3, loss=1.0, digest="bitflip")
    att.train(4)
    verdict = check_replicas(b.load())
    assert verdict.valid is False
    assert verdict.counts["disagreements"] == 1
    assert verdict.evidence == ["attempt 0 step 3: parameters or optimizer state differ: rank(s) 0,1 digest state-3; rank(s) 2 digest bitflip"]


def test_divergence_among_ranks_that_rank_0_never_reached_is_found(builder):
    b = builder(total_steps=4)
    att = b.attempt(3).train(2)
    att.emit(1, "step", step=3, loss=1.0, digest="a")
    att.emit(2, "step", step=3, loss=1.0, digest="b")
    assert check_replicas(b.load()).valid is False


def test_restores_that_disagree_are_invalid(builder):
    b = builder(total_steps=4)
    b.attempt(2).train(3, save_every=2).crash(1)
    att = b.attempt(2)
    att.emit(0, "restore", step=2, checkpoint="step-00000002", digest="state-2")
    att.emit(1, "restore", step=2, checkpoint="step-00000002", digest="stale")
    verdict = check_replicas(b.load())
    assert verdict.valid is False
    assert "attempt 1 restore" in verdict.evidence[0]


def test_replicas_without_digests_are_unknown(builder):
    b = builder(total_steps=2)
    b.attempt(2).train(2, digests=lambda k: None)
    assert check_replicas(b.load()).valid == "unknown"


def test_a_single_replica_cannot_disagree(builder):
    b = builder(total_steps=2)
    b.attempt(1).train(2)
    verdict = check_replicas(b.load())
    assert verdict.valid is True and "single replica" in verdict.summary


# -- progress --------------------------------------------------------------------


def test_completed_at_total_steps_within_budget_is_valid(builder):
    b = builder(total_steps=4, max_restarts=1)
    b.attempt(2).train(3, save_every=2).crash(1)
    b.attempt(2, restore="step-00000002").train(4)
    b.end()
    verdict = check_progress(b.load())
    assert verdict.valid is True, verdict


def test_no_end_event_is_unknown_since_the_job_may_still_be_running_or_was_killed(builder):
    b = builder(total_steps=4)
    b.attempt(2).train(3)
    verdict = check_progress(b.load())
    assert verdict.valid == "unknown"
    assert verdict.summary.startswith("no end event: the job is still running or was killed")
    assert verdict.evidence == ["the lineage reaches step 3 of 4 over 1 attempt(s)"]


def test_failed_job_is_invalid(builder):
    b = builder(total_steps=4)
    b.attempt(2).train(2)
    b.end("failed", 2)
    verdict = check_progress(b.load())
    assert verdict.valid is False and "'failed'" in verdict.summary


def test_completed_short_of_total_steps_is_invalid(builder):
    b = builder(total_steps=4)
    b.attempt(2).train(3)
    b.end("completed", 3)
    assert check_progress(b.load()).valid is False


def test_end_claiming_total_steps_without_the_updates_is_invalid(builder):
    b = builder(total_steps=4)
    b.attempt(2).train(3)
    b.end("completed", 4)
    verdict = check_progress(b.load())
    assert verdict.valid is False
    assert "last update of the lineage is step 3" in verdict.summary


def test_restarts_beyond_the_budget_are_invalid(builder):
    b = builder(total_steps=4, max_restarts=1)
    b.attempt(2).train(1).crash(1)
    b.attempt(2).train(1).crash(1)
    b.attempt(2).train(4)
    b.end()
    verdict = check_progress(b.load())
    assert verdict.valid is False
    assert "2 restart(s) exceed the budget max_restarts=1" in verdict.evidence


def test_a_run_without_events_is_unknown(builder):
    verdict = check_progress(builder().load())
    assert verdict.valid == "unknown"
