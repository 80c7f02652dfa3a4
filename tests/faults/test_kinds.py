"""A fault kind is declared once (faults/plan.py KINDS): its fields, where it runs, what it
threatens, its injector, its Hypothesis strategy, its report topics, whether a --cmd job
takes it and what chaos does with it. Every other piece is derived from that declaration
or checked against it here, so a kind with a piece missing fails a test that names it."""
from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwreck.faults.plan import (BETWEEN, DAMAGE, FOREIGN, HARNESS, IN_RANK, KIND_TOPICS, KINDS, SLOW, STOP, STORAGE,
                                    CORRUPTIONS, Kind, PlanError, command_kinds, parse_plan, validate_plan)
from trainwreck.faults.strategies import Slot, chaos_kinds, plans, strategy_for
from trainwreck.trainer.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
CFG = TrainConfig.tiny(total_steps=16, ckpt_interval=4)
COMMON = {"id", "kind", "attempt", "from_attempt", "expect", "rank", "step", "point"}
"""The fields docs/FAULTS.md describes once, in its common-fields table."""
SECTIONS = {IN_RANK: "### In-rank, at fault points", STORAGE: "### In-rank, through the Storage seam",
            FOREIGN: "### In-rank, through the Storage seam", BETWEEN: "### Between attempts",
            HARNESS: "### Applied by the harness"}
"""Where each kind's row stands in docs/FAULTS.md, by where it runs."""


def load_attribute(dotted: str) -> Any:
    module, _, path = dotted.partition(":")
    found: Any = importlib.import_module(module)
    for part in path.split("."):
        found = getattr(found, part)
    return found


def doc_problems(text: str, kinds: dict[str, Kind]) -> list[str]:
    """What docs/FAULTS.md's kind tables lack or contradict, one line per problem."""
    rows: dict[str, tuple[str, str]] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("### "):
            section = line
        match = re.match(r"\| `([a-z_]+)` \|", line) if section.startswith(tuple(SECTIONS.values())) else None
        if match and match.group(1) in rows:
            return [f"kind {match.group(1)!r} has two rows"]
        if match:
            rows[match.group(1)] = (section, line)
    problems = []
    for name, kind in kinds.items():
        if name not in rows:
            problems.append(f"kind {name!r} has no row in docs/FAULTS.md")
            continue
        section, line = rows[name]
        if not section.startswith(SECTIONS[kind.where]):
            problems.append(f"kind {name!r} is documented under {section!r}, not {SECTIONS[kind.where]!r}")
        threatens = {re.sub(r"\s*\(.*?\)", "", t).strip() for t in line.rstrip(" |").rsplit("|", 1)[1].split(",")}
        if threatens != set(kind.threatens):
            problems.append(f"kind {name!r}: the doc says it threatens {sorted(threatens)}, "
                            f"the declaration {sorted(kind.threatens)}")
        problems += [f"kind {name!r}: its row does not name field {f!r}" for f in set(kind.fields) - COMMON
                     if f"`{f}`" not in line]
    return problems


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_declares_an_injector_that_exists(name: str) -> None:
    assert callable(load_attribute(KINDS[name].injector)), KINDS[name].injector
    assert KINDS[name].load_injector() is load_attribute(KINDS[name].injector)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kinds_injector_acts_at_the_seam_its_where_says(name: str) -> None:
    """What fires a kind is its injector; `where` (the docs' table, the plan checks) must agree with it."""
    from trainwreck.faults.external import HarnessKind
    from trainwreck.faults.inrank import SEAMS, seams_of
    from trainwreck.faults.storage import StorageFault

    kind, injector = KINDS[name], KINDS[name].load_injector()
    if kind.where in (IN_RANK, STORAGE):
        assert (StorageFault in seams_of(name)) == (kind.where == STORAGE) and set(seams_of(name)) <= set(SEAMS)
    else:
        assert (isinstance(injector, type) and issubclass(injector, HarnessKind)) == (kind.where == HARNESS), injector


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_declares_report_topics_the_report_can_answer(name: str) -> None:
    from trainwreck.report.angles import ANSWERS, KIND_TOPICS as REPORT_TOPICS, QUESTIONS

    assert KINDS[name].topics and REPORT_TOPICS[name] == KINDS[name].topics
    assert set(KINDS[name].topics) <= set(QUESTIONS) & set(ANSWERS)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_either_takes_a_role_in_chaos_or_says_why_not(name: str) -> None:
    kind = KINDS[name]
    assert (kind.chaos in (STOP, SLOW, DAMAGE)) != bool(kind.no_chaos), (kind.chaos, kind.no_chaos)


@pytest.mark.parametrize("name", sorted(KINDS))
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_kind_declares_a_strategy_whose_faults_the_job_accepts(name: str, data: st.DataObject) -> None:
    for cfg in (CFG, TrainConfig.tiny(total_steps=16, ckpt_interval=4, parallelism="fsdp")):
        strategy = strategy_for(name, Slot(cfg, (2,), attempt=1, low=1, committed=2))
        if strategy is None:
            assert KINDS[name].comm_hook and cfg.parallelism == "fsdp"
            continue
        fault = data.draw(strategy)
        assert fault["kind"] == name
        validate_plan([{"id": "f", **fault}], cfg, (2,))


def test_chaos_draws_every_kind_declared_for_it_and_none_other() -> None:
    wide = Slot(CFG, (2,), attempt=1, low=1, committed=2)
    drawable = {name for role in (STOP, SLOW, DAMAGE) for name in chaos_kinds(role, wide)}
    assert drawable == {k.name for k in KINDS.values() if k.chaos}
    fsdp = Slot(TrainConfig.tiny(total_steps=16, ckpt_interval=4, parallelism="fsdp"), (2,), 1, 1, committed=2)
    assert {name for role in (STOP, SLOW, DAMAGE) for name in chaos_kinds(role, fsdp)} == {
        k.name for k in KINDS.values() if k.chaos and not k.comm_hook}


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(plans(CFG, (2,)))
def test_a_chaos_plan_holds_no_kind_that_says_chaos_must_not_draw_it(plan: Any) -> None:
    assert not plan.kinds() & {k.name for k in KINDS.values() if k.no_chaos}


def test_every_kind_has_its_row_in_the_fault_catalog_doc() -> None:
    assert doc_problems((REPO / "docs" / "FAULTS.md").read_text(), KINDS) == []


def test_the_doc_check_names_a_missing_row_and_a_wrong_threat() -> None:
    text = "### In-rank, at fault points\n| `kill` | `how` | dies | progress |\n"
    kinds = {"kill": KINDS["kill"], "hang": KINDS["hang"]}
    assert doc_problems(text, kinds) == [
        "kind 'kill': the doc says it threatens ['progress'], the declaration "
        f"{sorted(KINDS['kill'].threatens)}", "kind 'hang' has no row in docs/FAULTS.md"]


def test_a_cmd_job_takes_exactly_the_kinds_declared_for_commands() -> None:
    from trainwreck.faults.foreign import CMD_KINDS
    from trainwreck.harness.supervise.command.target import check_cmd_plan
    from trainwreck.faults.between_attempts import HOWS

    assert set(CMD_KINDS) <= set(command_kinds()) and set(HOWS) <= set(CORRUPTIONS)
    check_cmd_plan([{"id": "k", "kind": "kill", "rank": 0, "step": 2},
                    {"id": "s", "kind": "signal", "rank": 0, "signal": "SIGKILL", "step": 2}])
    with pytest.raises(PlanError, match=r"t \(torn_write\).*takes only " + ", ".join(command_kinds())):
        check_cmd_plan([{"id": "t", "kind": "torn_write", "step": 4}])


def test_a_new_fault_kind_is_one_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A declaration alone makes a kind that plans accept, chaos draws, the report raises
    topics for, and the doc check asks a row of; a --cmd job refuses it unless it says so.
    That it fires, through the injector it declares, tests/faults/test_dispatch.py shows."""
    straggler = KINDS["straggler"]
    monkeypatch.setitem(KINDS, "laggard", Kind(
        "laggard", IN_RANK, straggler.fields, "the straggler, declared again", straggler.threatens,
        injector=straggler.injector, strategy="tests.faults.test_kinds:laggards", topics=("hang",), chaos=SLOW))
    assert parse_plan([{"id": "l", "kind": "laggard", "rank": 0, "step": 3, "seconds": 0.01}]).kinds() == {"laggard"}
    assert KIND_TOPICS["laggard"] == ("hang",) and "laggard" not in command_kinds()
    assert "laggard" in chaos_kinds(SLOW, Slot(CFG, (2,)))
    text = (REPO / "docs" / "FAULTS.md").read_text()
    assert doc_problems(text, KINDS) == ["kind 'laggard' has no row in docs/FAULTS.md"]


def laggards(slot: Slot) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"kind": st.just("laggard"), "rank": st.just(0), "step": slot.steps(),
                                  "seconds": st.just(0.01)})
