"""The report finds a slowdown's period and tells one slow rank from every rank slow, from the
per-step phases alone (synthetic lanes, so the arithmetic is checked without a busy machine's noise)."""
from __future__ import annotations

from trainwreck.report.period import slowdowns
from trainwreck.report.rawlog import LaneLog, RawRun

CALM = {"data": 0.01, "forward": 0.01, "backward": 0.02, "sync": 0.0, "optimizer": 0.01, "checkpoint": 0.0}


def run_with(phases_of) -> RawRun:  # type: ignore[no-untyped-def]
    raw = RawRun(spec={})
    for rank in (0, 1):
        lane = raw.lanes[(0, rank)] = LaneLog(0, rank)
        for step in range(1, 25):
            lane.step_phases[step] = (step * 0.1, phases_of(rank, step))
    return raw


def test_one_rank_slow_every_five_updates_is_a_localized_series_with_period_five() -> None:
    def phases(rank: int, step: int) -> dict[str, float]:
        burst = step >= 3 and (step - 3) % 5 < 2
        if burst and rank == 1:
            return {**CALM, "forward": 0.2}
        return {**CALM, "backward": 0.21} if burst else dict(CALM)

    [series] = slowdowns(run_with(phases))["series"]
    assert (series["where"], series["period_steps"], series["first_steps"]) == ("update", 5, [3, 8, 13, 18, 23])
    assert (series["scope"], series["ranks"], series["regular_gaps"], series["gaps"]) == ("localized", [1], 4, 4)
    rank0, rank1 = series["per_rank"]
    assert rank1["own"] > rank1["wait"] and rank0["wait"] > rank0["own"]


def test_every_rank_slow_at_every_save_is_a_systemic_checkpoint_series() -> None:
    def phases(rank: int, step: int) -> dict[str, float]:
        return {**CALM, "checkpoint": 0.3} if step % 4 == 1 and step > 1 else dict(CALM)

    [series] = slowdowns(run_with(phases))["series"]
    assert (series["where"], series["period_steps"], series["scope"], series["ranks"]) == (
        "checkpoint", 4, "systemic", [0, 1])


def test_a_run_without_slow_updates_has_no_series() -> None:
    assert slowdowns(run_with(lambda rank, step: dict(CALM)))["series"] == []
