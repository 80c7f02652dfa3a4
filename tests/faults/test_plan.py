"""Plans as data: the builder, JSON round trips, and bad input refused before anything runs."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from trainwreck.faults.plan import KINDS, Plan, PlanError, parse_plan, validate_plan
from trainwreck.harness.cli import main as cli
from trainwreck.faults.strategies import corruptions, hangs, kills, plans
from trainwreck.trainer.config import TrainConfig

CFG = TrainConfig.tiny(total_steps=12)  # saves after 4, 8, 12


def test_the_builder_assigns_ids_per_kind_and_round_trips_through_json() -> None:
    plan = Plan().kill(rank=1, step=12).hang(rank=0, step=5).kill(rank=0, step=3, how="exit")
    assert [f["id"] for f in plan] == ["kill-1", "hang-1", "kill-2"]
    assert plan.faults[1]["expect"] == "hang", "a hang must be declared for the hang checker"
    again = parse_plan(plan.to_json())
    assert again == plan and json.loads(plan.to_json()) == plan.to_list()
    assert validate_plan(plan, CFG, [2]) == plan


def test_the_design_documents_example_plans_parse() -> None:
    parse_plan('[{"id": "k1", "kind": "kill", "rank": 1, "step": 12}]')
    parse_plan('[{"id": "h1", "kind": "hang", "rank": 1, "step": 10, "expect": "hang"}]')


def test_every_kind_is_in_the_catalog_including_the_harness_kinds() -> None:
    assert {"signal", "node_loss", "kill", "hang", "corrupt", "crash_op", "torn_write"} <= set(KINDS)


@pytest.mark.parametrize("plan,names", [
    ('[{"id": "x1", "kind": "meteor", "rank": 0, "step": 1}]', ["'x1'", "'kind'", "'meteor'"]),
    ('[{"id": "k1", "kind": "kill", "rank": "one", "step": 3}]', ["'k1'", "'rank'", "'one'"]),
    ('[{"id": "k1", "kind": "kill", "rank": 0, "step": 3.5}]', ["'k1'", "'step'", "3.5"]),
    ('[{"id": "k1", "kind": "kill", "rank": 0, "step": true}]', ["'k1'", "'step'", "True"]),
    ('[{"id": "k1", "kind": "kill", "rank": 0, "step": 3, "how": "gently"}]', ["'k1'", "'how'", "'gently'"]),
    ('[{"id": "k1", "kind": "kill", "rank": 0}]', ["'k1'", "'step'"]),
    ('[{"id": "k1", "kind": "kill", "rank": 0, "step": 3, "colour": 1}]', ["'k1'", "'colour'"]),
    ('[{"id": "h1", "kind": "hang", "rank": 0, "step": 3}]', ["'h1'", "expect"]),
    ('[{"id": "k1", "kind": "kill", "rank": 0, "step": 3, "expect": "hang"}]', ["'k1'", "'expect'"]),
    ('[{"id": "s1", "kind": "signal", "rank": 0, "signal": "SIGHUP", "step": 3}]', ["'s1'", "signal", "SIGHUP"]),
    ('[{"id": "n1", "kind": "node_loss", "ranks": [0, "x"], "step": 3}]', ["'n1'", "'ranks'"]),
    ('[{"id": "c1", "kind": "corrupt", "how": "shred"}]', ["'c1'", "'how'", "'shred'"]),
    ('[{"id": "a", "kind": "kill", "rank": 0, "step": 1}, {"id": "a", "kind": "kill", "rank": 1, "step": 2}]',
     ["'a'", "twice"]),
    ('[{"id": ["k1"], "kind": "kill", "rank": 0, "step": 1}]', ["#0", "'id'", "['k1']"]),
    ('[{"id": {"a": 1}, "kind": "kill", "rank": 0, "step": 1}]', ["#0", "'id'", "{'a': 1}"]),
    ('[{"id": "k1", "kind": ["kill"], "rank": 0, "step": 1}]', ["'k1'", "'kind'", "['kill']"]),
    ('[{"id": "k1", "kind": {"a": 1}, "rank": 0, "step": 1}]', ["'k1'", "'kind'"]),
    ('[{"id": "s1", "kind": "straggler", "rank": 0, "step": 1, "seconds": 1e999}]', ["'s1'", "'seconds'", "finite"]),
    ('[{"id": "s1", "kind": "signal", "rank": 0, "signal": "SIGKILL", "at_s": 1e999}]', ["'s1'", "'at_s'", "finite"]),
    ('[{"id": "s1", "kind": "signal", "rank": 0, "signal": "SIGKILL", "at_s": [1]}]', ["'s1'", "'at_s'"]),
])
def test_a_malformed_fault_is_refused_naming_its_id_and_field(plan: str, names: list[str]) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan(plan)
    for name in names:
        assert name in str(caught.value), str(caught.value)


@pytest.mark.parametrize("fault", [{"id": "s1", "kind": "signal", "rank": 1, "signal": "SIGSTOP", "step": 6},
                                   {"id": "n1", "kind": "node_loss", "ranks": [1], "signal": "SIGSTOP", "step": 6}])
def test_a_sigstop_without_expect_hang_is_refused_with_the_fix_instead_of_judged_a_false_alarm(
        fault: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    # The watchdog detects the stopped rank; without the expectation the hang checker called that INVALID.
    with pytest.raises(PlanError, match=f"fault '{fault['id']}': signal 'SIGSTOP'.*add \"expect\": \"hang\""):
        parse_plan([fault])
    assert cli(["run", "--plan", json.dumps([fault]), "--world-sizes", "2"]) == 2
    assert "add \"expect\": \"hang\"" in capsys.readouterr().err
    parse_plan([{**fault, "expect": "hang"}])


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_constants_that_are_not_finite_numbers_are_refused(constant: str) -> None:
    # Python's json accepts them; a straggler of Infinity seconds was judged VALID though its rank crashed.
    with pytest.raises(PlanError, match=f"{constant}.*not a finite number"):
        parse_plan(f'[{{"id": "s1", "kind": "straggler", "rank": 0, "step": 1, "seconds": {constant}}}]')
    parse_plan('[{"id": "s1", "kind": "straggler", "rank": 0, "step": 1, "seconds": 0.5}]')


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_the_builder_refuses_a_non_finite_number(value: float) -> None:
    with pytest.raises(PlanError, match="'seconds'.*not a finite number"):
        Plan().straggler(rank=0, step=1, seconds=value)


def test_a_deeply_nested_plan_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(PlanError, match="nested too deeply"):
        parse_plan("[" * 100_000 + "]" * 100_000)


def test_malformed_json_is_refused_with_an_example_of_a_plan() -> None:
    with pytest.raises(PlanError, match="not valid JSON.*kind"):
        parse_plan('[{"id": "k1", "kind": "kill",')
    with pytest.raises(PlanError, match="list"):
        parse_plan('{"id": "k1"}')


@pytest.mark.parametrize("fault,names", [
    ({"id": "k1", "kind": "kill", "rank": 2, "step": 3}, ["'k1'", "'rank'", "world size 2"]),
    ({"id": "k1", "kind": "kill", "rank": 4, "step": 3, "attempt": 1}, ["'k1'", "'rank'", "world size 4 of attempt 1"]),
    ({"id": "s1", "kind": "signal", "rank": 4, "signal": "SIGKILL", "step": 3}, ["'s1'", "rank 4"]),
    ({"id": "n1", "kind": "node_loss", "ranks": [0, 5], "step": 3}, ["'n1'", "'ranks'"]),
    ({"id": "k1", "kind": "kill", "rank": 0, "step": 13}, ["'k1'", "'step'", "total_steps=12"]),
    ({"id": "s1", "kind": "signal", "rank": 0, "signal": "SIGKILL", "step": 99}, ["'s1'", "'step'"]),
    ({"id": "t1", "kind": "torn_write", "step": 7}, ["'t1'", "'step'", "4, 8, 12"]),
    ({"id": "k1", "kind": "kill", "rank": 1, "step": 8, "point": "save.before_rename"}, ["'k1'", "rank 0"]),
    ({"id": "k1", "kind": "kill", "rank": 0, "step": 0}, ["'k1'", "'step'"]),
    ({"id": "c1", "kind": "corrupt", "how": "flip", "attempt": 0}, ["'c1'", "'attempt'"]),
])
def test_a_fault_that_cannot_fire_in_this_job_is_refused_naming_its_id_and_field(
        fault: dict, names: list[str]) -> None:
    with pytest.raises(PlanError) as caught:
        validate_plan([fault], CFG, [2, 4])
    for name in names:
        assert name in str(caught.value), str(caught.value)


def test_a_rank_that_exists_only_in_a_later_attempt_is_accepted_there() -> None:
    validate_plan([{"id": "k1", "kind": "kill", "rank": 3, "step": 3, "attempt": 1}], CFG, [2, 4])
    validate_plan([{"id": "s1", "kind": "signal", "rank": 3, "signal": "SIGKILL", "step": 3}], CFG, [2, 4])


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(plans(CFG, (4, 2)))
def test_generated_plans_are_valid_for_their_job_and_round_trip(plan: Plan) -> None:
    assert validate_plan(plan.to_json(), CFG, (4, 2)) == plan
    assert sum(f["kind"] == "hang" for f in plan) <= 1
    assert all(f.get("rank", 0) < 2 for f in plan)


@settings(max_examples=50, deadline=None)
@given(kills(CFG, (2,)), hangs(CFG, (2,)), corruptions())
def test_single_fault_strategies_give_faults_the_builder_accepts(kill: dict, hang: dict, corrupt: dict) -> None:
    plan = Plan()
    for fault in (kill, hang, corrupt):
        fault = dict(fault)
        plan.add(fault.pop("kind"), **fault)
    validate_plan(plan, CFG, (2,))
