"""A fault kind fires through the injector its declaration names (faults/plan.py KINDS): no
module branches on the kind's name, so a kind a test declares here fires exactly like a
built-in one, and a declaration that names nothing loadable stops the build with an error that
names the kind and the declaration."""
from __future__ import annotations

from dataclasses import replace

import pytest

from trainwreck.faults.external import ExternalFaults
from trainwreck.faults.plan import HARNESS, IN_RANK, KINDS, PlanError, parse_plan

HERE = "tests.faults.test_dispatch"


def declare(monkeypatch: pytest.MonkeyPatch, name: str, injector: str, like: str, where: str = IN_RANK) -> None:
    """Declare kind `name` for this test: `like`'s fields, its own injector."""
    monkeypatch.setitem(KINDS, name, replace(KINDS[like], name=name, where=where, injector=injector))


def test_a_harness_kind_declared_with_the_node_loss_injector_is_applied_by_the_harness(
        monkeypatch: pytest.MonkeyPatch) -> None:
    declare(monkeypatch, "rack_loss", KINDS["node_loss"].injector, like="node_loss", where=HARNESS)
    faults = ExternalFaults([{"id": "r", "kind": "rack_loss", "ranks": [0, 1], "step": 2},
                             {"id": "k", "kind": "kill", "rank": 0, "step": 1}])
    [fault] = faults.due(0, {0: 2, 1: 1}, 0.0, world_size=2)
    assert (fault.id, fault.ranks, fault.signal) == ("r", (0, 1), "SIGKILL")


def test_a_harness_kind_whose_injector_cannot_be_loaded_is_refused_when_the_plan_is_parsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    declare(monkeypatch, "ghost_loss", f"{HERE}:NoSuchInjector", like="node_loss", where=HARNESS)
    with pytest.raises(PlanError, match=rf"kind 'ghost_loss' declares injector '{HERE}:NoSuchInjector'"):
        parse_plan([{"id": "g", "kind": "ghost_loss", "ranks": [0], "step": 1}])
