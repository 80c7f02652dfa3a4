"""Whole jobs with async checkpoints: a kill, a storage error and a torn write during the
background persist of the step-8 save. Each must leave the commit record at step 4, the
next attempt must restore step 4 (the newest committed checkpoint), and every invariant
must hold. The scenarios are rows of harness/supervise/scenarios.py, so the scenario table runs
them too; here the restore point itself is asserted."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.scenarios.checks import assert_every_fault_fired, assert_valid
from tests.trainer.forkranks import Events
from trainwreck.harness.supervise.scenarios import get_scenario

CPU = pytest.mark.trainwreck(backend="gloo")


@CPU
@pytest.mark.parametrize("name", ["async-kill-persist", "async-disk-full", "async-torn-persist"])
def test_a_fault_in_the_background_persist_resumes_from_the_newest_committed_checkpoint(
        run_scenario: Callable[..., Any], name: str) -> None:
    scenario = get_scenario(name)
    assert scenario.train_config().ckpt_mode == "async"
    judged = run_scenario(scenario)
    assert_every_fault_fired(judged)
    events = Events.read(judged.record.run_dir)
    assert [e["step"] for e in events.of("save", attempt=0)] == [4], "the faulted save 8 must never commit"
    assert [e["checkpoint"] for e in events.of("restore", attempt=1, rank=0)] == ["step-00000004"]
    assert_valid(judged, scenario.threatens)
