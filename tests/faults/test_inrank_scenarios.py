"""In-rank faults at fault points and in DDP's communication hook, on 2 CPU gloo ranks.

Each test asserts that the fault fired (its `fault` event), that it really acted
(an exit code, a hang event, a measured delay), and what the invariants say about
the reference trainer under it, judged against a golden run of the same spec."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainwreck.faults.plan import Plan
from trainwreck.invariants import History
from tests.faults.conftest import HANG_TIMEOUT_S, run_plan
from tests.harness.conftest import silent_since
from trainwreck.trainer import hooks as fp

EXIT_CODES = {"sigkill": -9, "sigterm": -15, "exit": 1, "exception": 1}


@pytest.mark.parametrize("how", sorted(EXIT_CODES))
def test_a_rank_killed_mid_run_resumes_from_the_previous_checkpoint_and_stays_correct(
        how: str, tmp_path: Path, golden: History) -> None:
    plan = Plan().kill(rank=1, step=6, how=how).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [event] = out.fired("kill-1")
    assert (event["rank"], event["attempt"]) == (1, 0)
    assert out.exit_codes(0)[1] == EXIT_CODES[how]
    assert out.restores(1) == {4}, "the kill landed in update 6; the newest checkpoint was step 4"
    assert out.judgement.valid is True, out.explain()


def test_kill_during_commit_resumes_from_previous_checkpoint(tmp_path: Path, golden: History) -> None:
    plan = Plan().kill(rank=0, step=8, point=fp.SAVE_BEFORE_POINTER).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    out.fired("kill-1")
    assert not [e for e in out.events("save") if e["step"] == 8 and e["attempt"] == 0]
    assert out.restores(1) == {4}
    assert out.judgement.valid is True, out.explain()


@pytest.mark.parametrize("how", ["event", "gil", "sigstop"])
def test_a_hung_rank_is_named_by_a_hang_event_within_the_timeout_and_the_job_completes(
        how: str, tmp_path: Path, golden: History) -> None:
    plan = Plan().hang(rank=1, step=6, how=how).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [fault] = out.fired("hang-1")
    [hang] = out.events("hang")
    assert hang["attempt"] == 0 and 1 in hang["ranks"] and hang["t"] > fault["t"]
    assert hang["t"] - silent_since(out.run_dir, 0, 2) <= HANG_TIMEOUT_S + 1.0  # conftest: why not from the fault
    assert out.record.outcome == "completed" and out.record.attempts == 2
    assert out.judgement.valid is True, out.explain()


def test_a_straggler_slows_its_rank_every_update_without_being_called_a_hang(
        tmp_path: Path, golden: History) -> None:
    plan = Plan().straggler(rank=1, step=3, seconds=0.05).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [fault] = out.fired("straggler-1")
    steps = [e for e in out.events("step") if e["rank"] == 1]
    slow = {e["step"]: e["phases"]["data"] for e in steps}
    # The sleep sits between the step's start and its data phase mark.
    assert all(slow[s] >= 0.05 for s in range(3, 13)), slow
    # Its first sleep, which writes the fault event, came after update 2 ended: none slowed updates
    # 1-2 (their data phase under 0.05 s said so only on an idle machine).
    assert [e["step"] for e in steps if e["t"] < fault["t"]] == [1, 2]
    assert out.record.attempts == 1 and not out.events("hang")
    assert out.judgement.valid is True, out.explain()


def test_a_noisy_neighbour_slows_its_rank_only_in_its_bursts_and_leaves_no_process_behind(
        tmp_path: Path, golden: History) -> None:
    plan = Plan().add("noisy_neighbour", rank=1, step=3, every=5, steps=2, share=0.8).to_list()
    out = run_plan(plan, tmp_path / "run", golden)  # run_plan fails on a leftover process
    [event] = out.fired("noisy_neighbour-1")
    assert (event["rank"], event["step"], event["share"]) == (1, 3, 0.8)
    own = {e["step"]: sum(e["phases"][p] for p in ("data", "forward", "optimizer"))
           for e in out.events("step") if e["rank"] == 1}
    burst, calm = [own[s] for s in (3, 4, 8, 9)], [own[s] for s in (2, 5, 6, 7, 10, 11)]
    # Stopped for 0.8 of every slice, the rank's own work takes several times as long; a busy
    # machine adds noise to both sides, so the test asks for the sum, not every update.
    assert sum(burst) > 1.5 * sum(calm) * len(burst) / len(calm), own
    assert out.record.attempts == 1 and not out.events("hang")
    assert out.judgement.valid is True, out.explain()


def test_disk_contention_fires_in_its_bursts_leaves_no_scratch_file_and_the_run_stays_correct(
        tmp_path: Path, golden: History) -> None:
    plan = Plan().add("disk_contention", rank=0, step=3, every=5, steps=2, block_mb=1).to_list()
    out = run_plan(plan, tmp_path / "run", golden)  # run_plan fails on a leftover process
    [event] = out.fired("disk_contention-1")
    assert (event["rank"], event["step"]) == (0, 3) and event["mode"] in ("O_DIRECT", "O_DSYNC")
    assert not list((tmp_path / "run" / "contention").iterdir()), "each burst removes its scratch file"
    assert out.record.attempts == 1 and not out.events("hang")
    assert out.judgement.valid is True, out.explain()


def test_a_delayed_all_reduce_holds_every_rank_back_and_changes_no_digest(
        tmp_path: Path, golden: History) -> None:
    plan = Plan().comm_delay(rank=1, step=3, seconds=0.5).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [delay] = out.fired("comm_delay-1")
    # Rank 0 could end update 3 only once rank 1's delayed all-reduce had run. Its backward phase
    # (at least 0.45 s) said so only when rank 0 reached the all-reduce with rank 1; on a loaded
    # machine rank 0 came later and waited less.
    [done] = [e for e in out.events("step") if e["rank"] == 0 and e["step"] == 3]
    assert done["t"] >= delay["t"] + 0.5, "rank 0 must have waited in the all-reduce for rank 1"
    assert out.record.attempts == 1
    assert out.judgement.valid is True, out.explain()  # continuity: digests equal golden's


def test_a_failed_all_reduce_fails_the_attempt_and_the_restart_recovers(tmp_path: Path, golden: History) -> None:
    plan = Plan().comm_fail(rank=1, step=6).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    out.fired("comm_fail-1")
    assert out.exit_codes(0)[1] == 1 and out.record.attempts == 2
    assert out.restores(1) == {4}
    assert out.judgement.valid is True, out.explain()


def test_a_nan_in_one_ranks_gradient_is_caught_as_diverged_replicas(tmp_path: Path, golden: History) -> None:
    # The reference trainer has no non-finite guard, so this is silent corruption:
    # what must hold is that the judge notices it, at the poisoned update.
    plan = Plan().nan_grad(rank=1, step=5).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    out.fired("nan_grad-1")
    assert out.verdict("replicas") is False, out.explain()
    assert "step 5" in out.judgement.verdicts["replicas"].summary
    assert out.verdict("continuity") is False and out.judgement.valid is False


def test_a_rank_that_skips_the_all_reduce_and_waits_hangs_the_others_and_is_named(
        tmp_path: Path, golden: History) -> None:
    plan = Plan().skip_collective(rank=1, step=5).to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    [fault] = out.fired("skip_collective-1")
    [hang] = out.events("hang")
    # Everyone sits in the backward phase, so the watchdog cannot single out the
    # skipper; it must at least be among the named ranks.
    assert 1 in hang["ranks"] and hang["t"] > fault["t"]
    assert hang["t"] - silent_since(out.run_dir, 0, 2) <= HANG_TIMEOUT_S + 1.0
    assert out.judgement.valid is True, out.explain()


def test_a_rank_that_skips_the_all_reduce_and_goes_on_is_aborted_by_gloos_mismatch_check(
        tmp_path: Path, golden: History) -> None:
    plan = Plan().skip_collective(rank=1, step=5, then="continue").to_list()
    out = run_plan(plan, tmp_path / "run", golden)
    out.fired("skip_collective-1")
    # Its next collective (the loss all-reduce, 1 float) meets the others' gradient
    # all-reduce: gloo detects the size mismatch and aborts the process.
    assert out.exit_codes(0)[1] == -6, out.exit_codes(0)
    assert not out.events("hang") and out.record.attempts == 2
    assert out.judgement.valid is True, out.explain()
