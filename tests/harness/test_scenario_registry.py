"""Every suite's scenarios come from one registry (harness/supervise/scenarios.py `REGISTRY`).

A name is declared once per namespace, every family's module, job type and runner load, and
no suite keeps a scenario outside the registry: neither a module-level scenario it forgot to
declare nor a module that builds scenarios without being a family's."""
from __future__ import annotations

import argparse
import ast
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from tests.test_architecture import TOPS
from trainwreck.harness.commands import scenarios as command
from trainwreck.harness.supervise.scenarios import (FAMILIES, REGISTRY, SCENARIOS, DuplicateScenario, Family, Scenario,
                                          ScenarioRegistry, custom_scenario, load)

REPO = Path(__file__).resolve().parents[2]
JOB_TYPES = {f.job for f in FAMILIES.values()}
FAMILY_FILES = {f.module.removeprefix("trainwreck.").replace(".", "/") + ".py" for f in FAMILIES.values()}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_declares_scenarios_and_its_job_type_and_runner_load(family: str) -> None:
    kind = FAMILIES[family]
    entries = REGISTRY.entries(family)
    assert entries and all(e.family == family and e.summary for e in entries)
    assert isinstance(load(kind.job), type) and callable(load(kind.runner))


def test_the_builtins_are_the_builtin_family_in_order() -> None:
    assert [e.job for e in REGISTRY.entries("builtin")] == list(SCENARIOS)


def _registry() -> ScenarioRegistry:
    job = "trainwreck.harness.supervise.scenarios:Scenario"
    return ScenarioRegistry({"a": Family("a", "", "trainwreck.harness.supervise.scenarios", job, "x:y"),
                             "b": Family("b", "", "trainwreck.harness.supervise.scenarios", job, "x:y"),
                             "c": Family("c", "", "trainwreck.harness.supervise.scenarios", job, "x:y", namespace="other")})


def test_a_name_declared_twice_in_one_namespace_is_refused_naming_the_first_family() -> None:
    registry, one = _registry(), custom_scenario()
    registry.declare("a", [("kill", one)])
    with pytest.raises(DuplicateScenario, match="'kill' of b is already declared by a"):
        registry.declare("b", [("kill", one)])
    with pytest.raises(DuplicateScenario):
        registry.declare("a", [("twice", one), ("twice", one)])
    assert registry.declare("c", [("kill", one)]) == {"kill": one}  # another namespace may reuse it


def test_a_job_of_another_type_than_its_family_declares_is_refused() -> None:
    with pytest.raises(TypeError, match="the family declares trainwreck.harness.supervise.scenarios:Scenario"):
        _registry().declare("a", [("x", ("not", "a", "scenario"))])


def _held(value: Any, depth: int = 0) -> Iterator[Any]:
    """`value` and what its dicts, tuples and lists hold, two levels down."""
    yield value
    if depth < 2 and isinstance(value, (dict, tuple, list)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _held(item, depth + 1)


def undeclared(module: ModuleType) -> list[str]:
    """Scenario jobs a module holds at its top level that no registry entry is."""
    types = tuple(load(t) for t in JOB_TYPES)
    declared = {id(e.job) for e in REGISTRY.entries()}
    return sorted({f"{module.__name__}.{name}" for name, value in vars(module).items()
                   for held in _held(value) if isinstance(held, types) and id(held) not in declared})


@pytest.mark.parametrize("module", sorted({f.module for f in FAMILIES.values()}))
def test_every_scenario_a_family_module_holds_is_declared(module: str) -> None:
    assert undeclared(importlib.import_module(module)) == [], "declare it (harness/supervise/scenarios.py declare)"


def test_the_completeness_check_finds_a_scenario_held_outside_the_registry() -> None:
    stray = ModuleType("stray")
    stray.TABLE = {"new": custom_scenario()}  # type: ignore[attr-defined]
    assert undeclared(stray) == ["stray.TABLE"]


def scenario_builders(root: Path) -> list[str]:
    """Calls constructing a family's job type in a module that is no family's (where they escape
    the registry's completeness check), as path:line."""
    types = {tuple(t.split(":")) for t in JOB_TYPES}
    found = []
    for top in TOPS:
        for path in sorted((root / top).rglob("*.py")):
            rel = str(path.relative_to(root))
            tree = ast.parse(path.read_text(), rel)
            own = "trainwreck." + rel.removesuffix(".py").replace("/", ".")
            names = {c for m, c in types if m == own} | {
                a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names if (f"trainwreck.{n.module}" if n.module and not n.module.startswith("trainwreck")
                                     else n.module, a.name) in types}
            found += [f"{rel}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Name) and n.func.id in names and rel not in FAMILY_FILES]
    return found


def test_no_module_but_a_familys_builds_a_scenario() -> None:
    assert scenario_builders(REPO) == [], "declare a family in harness/supervise/scenarios.py FAMILIES, or use custom_scenario"


def test_the_builder_check_finds_a_scenario_built_outside_the_families(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "newsuite.py").write_text(
        "from trainwreck.harness.supervise.scenarios import Scenario\nX = Scenario('x', '', '', ())\n")
    assert scenario_builders(tmp_path) == ["harness/newsuite.py:2"]


def test_a_command_line_plan_is_an_undeclared_custom_scenario() -> None:
    assert custom_scenario().name not in {e.name for e in REGISTRY.entries()}
    assert isinstance(custom_scenario(), Scenario)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    parser = argparse.ArgumentParser()
    command.configure(parser)
    assert command.main(parser.parse_args(list(argv))) == 0
    return capsys.readouterr().out


def test_trainwreck_scenarios_lists_the_builtins_and_with_all_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _run(capsys)
    assert plain.splitlines()[0].startswith(SCENARIOS[0].name) and "resume-mid-epoch" not in plain
    every = _run(capsys, "--all")
    assert all(f"{name}: " in every for name in FAMILIES) and "resume-mid-epoch" in every
    assert {e["family"] for e in json.loads(_run(capsys, "--all", "--json"))} == set(FAMILIES)
