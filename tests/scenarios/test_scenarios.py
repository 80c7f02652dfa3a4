"""The scenario table on CPU gloo: each built-in fault scenario x the invariants it threatens.

The table is data (harness/supervise/scenarios.py); this file only parametrises over it. Each
test asserts that every planned fault fired and that the reference trainer stays VALID.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest

from trainwreck.harness.supervise.scenarios import SCENARIOS, Scenario
from tests.scenarios.checks import assert_every_fault_fired, assert_valid

CPU = pytest.mark.trainwreck(backend="gloo")


@CPU
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_reference_trainer_stays_valid_and_every_fault_fires(run_scenario: Callable[..., Any],
                                                                scenario: Scenario) -> None:
    judged = run_scenario(scenario)
    assert_every_fault_fired(judged)
    assert_valid(judged, scenario.threatens)


def test_the_scenario_table_threatens_every_judged_invariant_on_two_to_four_ranks() -> None:
    threatened = {name for s in SCENARIOS for name in s.threatens}
    # replicas is judged on every run; no fault the reference survives targets it alone.
    assert threatened >= {"coverage", "continuity", "atomicity", "hang", "progress"}
    assert {w for s in SCENARIOS for w in s.world_sizes} >= {2, 4}
    assert len({s.name for s in SCENARIOS}) == len(SCENARIOS), "scenario names must be unique"


@CPU
def test_a_kill_and_resume_on_four_ranks_matches_the_golden_run_digest_for_digest(
        run_scenario: Callable[..., Any]) -> None:
    # With 3+ ranks the bits of a reduced gradient depend on the order the ranks' values
    # are added; DDP's first update after a restart used another bucket layout than the
    # uninterrupted run's, and every step after the restore parted from it (trainer/gradsync.py).
    judged = run_scenario("kill-resume", world_sizes=(4,))
    assert_every_fault_fired(judged)
    continuity = judged.judgement.verdicts["continuity"]
    assert continuity.valid is True, continuity.summary
    assert "match the golden run" in continuity.summary
    assert_valid(judged)
