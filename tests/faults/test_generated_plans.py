"""Generated plans end to end: the reference trainer stays correct under any of them."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from trainwreck.faults.plan import Plan
from trainwreck.faults.strategies import plans
from trainwreck.invariants import History
from tests.faults.conftest import CFG, golden_history, run_plan

_golden: list[History] = []


def golden_once() -> History:
    if not _golden:
        with tempfile.TemporaryDirectory(prefix="trainwreck-golden-") as tmp:
            _golden.append(golden_history(Path(tmp) / "run"))
    return _golden[0]


@pytest.mark.slow
@pytest.mark.chaos
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(CFG, (2,)))
def test_the_reference_trainer_is_valid_under_every_generated_plan(plan: Plan) -> None:
    golden = golden_once()
    with tempfile.TemporaryDirectory(prefix="trainwreck-chaos-") as tmp:
        out = run_plan(plan.to_list(), Path(tmp) / "run", golden)
        assert out.judgement.valid is True, f"{plan.to_json()}\n{out.explain()}"
