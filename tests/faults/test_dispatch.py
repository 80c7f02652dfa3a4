"""A fault kind fires through the injector its declaration names (faults/plan.py KINDS), at
every seam a rank or the harness offers: no module branches on the kind's name, so a kind a
test declares here fires exactly like a built-in one, and a declaration that names nothing
loadable stops the build with an error that names the kind and the declaration."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from trainwreck.faults.external import ExternalFaults
from trainwreck.faults.inrank import FaultHooks
from trainwreck.faults.plan import HARNESS, IN_RANK, KINDS, STORAGE, PlanError, parse_plan
from trainwreck.trainer import hooks as fp
from trainwreck.rundir.events import EventLog
from trainwreck.trainer.storage import LocalStorage

HERE = "tests.faults.test_dispatch"


def declare(monkeypatch: pytest.MonkeyPatch, name: str, injector: str, like: str, where: str = IN_RANK) -> None:
    """Declare kind `name` for this test: `like`'s fields, its own injector."""
    monkeypatch.setitem(KINDS, name, replace(KINDS[like], name=name, where=where, injector=injector))


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[EventLog]:
    events = EventLog(tmp_path / "events" / "a000-r0.jsonl", attempt=0, rank=0, world_size=2)
    yield events
    events.close()


def bound(plan: list[dict[str, Any]], events: EventLog) -> FaultHooks:
    hooks = FaultHooks(plan)
    hooks.bind(events, rank=0, world_size=2, attempt=0)
    return hooks


def fault_events(events: EventLog) -> list[tuple[str, str]]:
    """(fault_id, fault_kind) of every `fault` event written (they are flushed at once)."""
    lines = [json.loads(line) for line in events.path.read_text().splitlines()]
    return [(e["fault_id"], e["fault_kind"]) for e in lines if e["kind"] == "fault"]


class Tick:
    """A point injector a test declares: it fires once at its update's start."""

    def __init__(self, fault: dict[str, Any], rank: Any) -> None:
        self.fault, self.rank = fault, rank

    def at_point(self, point: str, step: int, ctx: dict[str, Any]) -> None:
        if point == fp.STEP_START and step == self.fault["step"]:
            self.rank.record(self.fault, f"tick at update {step}")


class Echo:
    """A communication injector a test declares: it answers its update's all-reduce itself."""

    def __init__(self, fault: dict[str, Any], rank: Any) -> None:
        self.fault, self.rank = fault, rank

    def in_comm(self, step: int, bucket: Any) -> Any:
        if step != self.fault["step"]:
            return None
        self.rank.record(self.fault, f"echoed bucket {bucket}")
        return "echo"  # stands for the Future DDP would wait on


class Witness:
    """A storage injector a test declares: it records the first write it is told about."""

    def __init__(self, fault: dict[str, Any], store: Any) -> None:
        self.fault, self.store, self.seen = fault, store, False

    def before(self, op: Any, data: bytes | None) -> None:
        if op.name == "write" and not self.seen:
            self.seen = True
            self.store.record(self.fault, f"saw {op.describe()}")

    def after(self, op: Any) -> None:
        pass


class Ticker:
    """An update-start injector a test declares: built once for its kind, told every update's start."""

    def __init__(self, faults: list[dict[str, Any]], record: Any, rank: int, root: Path) -> None:
        self.faults, self.record, self.told = faults, record, []

    def at_step(self, step: int) -> None:
        self.told.append(step)
        for fault in self.faults:
            if fault["step"] == step:
                self.record(fault, f"told update {step}")


class Mute:
    """Names no seam: a kind declaring it could never fire."""

    def __init__(self, fault: dict[str, Any], rank: Any) -> None:
        pass


def test_a_kind_declared_with_a_point_injector_fires_at_its_point(monkeypatch: pytest.MonkeyPatch,
                                                                   rank: EventLog) -> None:
    declare(monkeypatch, "tick", f"{HERE}:Tick", like="kill")
    hooks = bound([{"id": "t", "kind": "tick", "rank": 0, "step": 2}], rank)
    for step in (1, 2, 3):
        hooks.point(fp.STEP_START, step)
    assert fault_events(rank) == [("t", "tick")]


def test_a_kind_declared_with_an_update_start_injector_is_told_every_update(monkeypatch: pytest.MonkeyPatch,
                                                                            rank: EventLog) -> None:
    declare(monkeypatch, "ticker", f"{HERE}:Ticker", like="straggler")
    hooks = bound([{"id": "t", "kind": "ticker", "rank": 0, "step": 2, "seconds": 0.01}], rank)
    for step in (1, 2, 3):
        hooks.point(fp.STEP_START, step)
    [ticker] = hooks.per_update
    assert isinstance(ticker, Ticker) and ticker.told == [1, 2, 3]
    assert fault_events(rank) == [("t", "ticker")]


def test_a_kind_declared_with_a_built_in_injector_fires_as_that_kind_does(monkeypatch: pytest.MonkeyPatch,
                                                                          rank: EventLog) -> None:
    """The straggler's injector, declared again under another name, slows its rank from its step on."""
    declare(monkeypatch, "laggard", KINDS["straggler"].injector, like="straggler")
    hooks = bound([{"id": "l", "kind": "laggard", "rank": 0, "step": 2, "seconds": 0.01}], rank)
    for step in (1, 2, 3):
        hooks.point(fp.STEP_START, step)
    assert fault_events(rank) == [("l", "laggard")]


def test_a_kind_declared_with_a_communication_injector_replaces_its_all_reduce(monkeypatch: pytest.MonkeyPatch,
                                                                               rank: EventLog) -> None:
    declare(monkeypatch, "echo", f"{HERE}:Echo", like="comm_fail")
    hooks = bound([{"id": "e", "kind": "echo", "rank": 0, "step": 3}], rank)
    hook = hooks.wrap_comm_hook(lambda state, bucket: "reduced")
    hooks.point(fp.STEP_START, 2)
    assert hook(None, 0) == "reduced"
    hooks.point(fp.STEP_START, 3)
    assert hook(None, 0) == "echo"
    assert fault_events(rank) == [("e", "echo")]


def test_a_kind_declared_with_a_storage_injector_sees_the_ranks_writes(monkeypatch: pytest.MonkeyPatch,
                                                                       rank: EventLog, tmp_path: Path) -> None:
    declare(monkeypatch, "witness", f"{HERE}:Witness", like="torn_write", where=STORAGE)
    hooks = bound([{"id": "w", "kind": "witness", "step": 4}], rank)
    (tmp_path / "checkpoints").mkdir()
    storage = hooks.wrap_storage(LocalStorage(tmp_path / "checkpoints"))
    storage.write("a.bin", b"1234")
    assert (tmp_path / "checkpoints" / "a.bin").read_bytes() == b"1234"
    assert fault_events(rank) == [("w", "witness")]


def test_a_harness_kind_declared_with_the_node_loss_injector_is_applied_by_the_harness(
        monkeypatch: pytest.MonkeyPatch) -> None:
    declare(monkeypatch, "rack_loss", KINDS["node_loss"].injector, like="node_loss", where=HARNESS)
    faults = ExternalFaults([{"id": "r", "kind": "rack_loss", "ranks": [0, 1], "step": 2},
                             {"id": "k", "kind": "kill", "rank": 0, "step": 1}])
    [fault] = faults.due(0, {0: 2, 1: 1}, 0.0, world_size=2)
    assert (fault.id, fault.ranks, fault.signal) == ("r", (0, 1), "SIGKILL")


def test_a_kind_whose_injector_cannot_be_loaded_stops_the_ranks_hooks_naming_kind_and_declaration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for injector in (f"{HERE}:NoSuchInjector", "tests.faults.no_such_module:Tick", ""):
        declare(monkeypatch, "ghost", injector, like="kill")
        with pytest.raises(PlanError, match=rf"kind 'ghost' declares injector {injector!r}, which cannot be loaded"):
            FaultHooks([{"id": "g", "kind": "ghost", "rank": 0, "step": 1}])


def test_a_harness_kind_whose_injector_cannot_be_loaded_is_refused_when_the_plan_is_parsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    declare(monkeypatch, "ghost_loss", f"{HERE}:NoSuchInjector", like="node_loss", where=HARNESS)
    with pytest.raises(PlanError, match=rf"kind 'ghost_loss' declares injector '{HERE}:NoSuchInjector'"):
        parse_plan([{"id": "g", "kind": "ghost_loss", "ranks": [0], "step": 1}])


def test_a_kind_whose_injector_acts_at_no_seam_stops_the_ranks_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    declare(monkeypatch, "mute", f"{HERE}:Mute", like="kill")
    with pytest.raises(PlanError, match=rf"kind 'mute': its injector '{HERE}:Mute' acts at no seam of a rank"):
        FaultHooks([{"id": "m", "kind": "mute", "rank": 0, "step": 1}])
