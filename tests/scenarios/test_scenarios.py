"""The scenario table on CPU gloo: each built-in fault scenario x the invariants it threatens.

The table is data (harness/scenarios.py); this file only parametrises over it. Each
test asserts that every planned fault fired and that the reference trainer stays VALID.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest

from trainwreck.harness.scenarios import SCENARIOS, Scenario
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
