"""A world-size schedule under kills, and the harness-applied kinds, judged like the rest."""
from __future__ import annotations

from pathlib import Path

from trainwreck.faults.plan import Plan, validate_plan
from tests.faults.conftest import golden_history, run_plan
from trainwreck.invariants import History
from trainwreck.trainer.config import TrainConfig

ELASTIC = TrainConfig.tiny(total_steps=12, global_batch=24)  # 4, 2 and 3 ranks all divide 24


def test_a_job_shrinking_from_4_to_2_ranks_and_growing_to_3_keeps_every_invariant(tmp_path: Path) -> None:
    sizes = (4, 2, 3)
    plan = Plan().kill(rank=3, step=6).kill(rank=1, step=10, attempt=1)
    validate_plan(plan, ELASTIC, sizes)
    golden = golden_history(tmp_path / "golden", ELASTIC, sizes)
    out = run_plan(plan.to_list(), tmp_path / "run", golden, cfg=ELASTIC, world_sizes=sizes)
    out.fired("kill-1")
    out.fired("kill-2")
    worlds = {e["attempt"]: e["world_size"] for e in out.events("step")}
    assert worlds == {0: 4, 1: 2, 2: 3}
    assert (out.restores(1), out.restores(2)) == ({4}, {8})
    assert out.judgement.valid is True, out.explain()


def test_a_signal_from_the_harness_is_recorded_before_it_kills_the_rank(tmp_path: Path, golden: History) -> None:
    out = run_plan(Plan().signal(rank=1, signal="SIGKILL", step=6).to_list(), tmp_path / "run", golden)
    [event] = out.fired("signal-1")
    assert event["rank"] == 1 and out.exit_codes(0)[1] == -9
    assert out.judgement.valid is True, out.explain()


def test_losing_a_whole_node_restarts_the_job_from_the_newest_checkpoint(tmp_path: Path, golden: History) -> None:
    out = run_plan(Plan().node_loss(ranks=[0, 1], step=6).to_list(), tmp_path / "run", golden)
    [event] = out.fired("node_loss-1")
    assert event["ranks"] == [0, 1] and set(out.exit_codes(0).values()) == {-9}
    assert out.restores(1) == {4}
    assert out.judgement.valid is True, out.explain()


def test_a_harness_signal_lands_exactly_at_its_step_because_the_rank_waits_for_it(tmp_path: Path,
                                                                                    golden: History) -> None:
    # The harness polls the progress boards; without the rank's wait at the step's start a
    # fast rank ran an update or two past it, and a save in between changed the restore point.
    # The slowest polling a job allows, so that without the wait the rank would run ahead.
    out = run_plan(Plan().signal(rank=1, signal="SIGKILL", step=7).to_list(), tmp_path / "run", golden,
                   poll_interval_s=0.1)
    [event] = out.fired("signal-1")
    assert "ranks were at steps {1: 7}" in event["detail"]
    applied = {e["step"] for e in out.events("step") if e["attempt"] == 0 and e["rank"] == 1}
    assert max(applied) == 6, "the killed rank applied updates past the fault's step"
    assert out.restores(1) == {4}
    assert out.judgement.valid is True, out.explain()
