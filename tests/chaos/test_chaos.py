"""Property-based chaos: the reference trainer keeps every invariant under random fault plans.

The default run has a 3-example derandomised smoke; `pytest -m chaos` runs the property
with the options' profile (`--trainwreck-chaos-profile nightly`), examples and budget.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwreck.rundir.layout import iter_events
from trainwreck.harness.suites.chaos import ChaosCase, ChaosFailure, chaos_cases, chaos_settings, check_property, parse_duration


@pytest.mark.trainwreck(chaos_profile="ci", chaos_examples=3, chaos_budget="")
def test_a_derandomised_smoke_of_three_random_plans_keeps_every_invariant(chaos: Any) -> None:
    runner = chaos.check()
    assert runner.runs == 3
    assert runner.failures == []


@pytest.mark.chaos
def test_the_reference_trainer_keeps_every_invariant_under_random_fault_plans(chaos: Any) -> None:
    runner = chaos.check()
    assert runner.runs >= 1, "the budget allowed no run at all: the property tested nothing"
    assert runner.failures == []


# ----- the machinery, without running jobs ------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(chaos_cases())
def test_every_drawn_case_is_a_valid_plan_for_its_job(case: ChaosCase) -> None:
    from trainwreck.faults.plan import validate_plan

    validate_plan(case.plan, case.config(), case.world_sizes)
    assert len({f["id"] for f in case.plan}) == len(case.plan)
    assert case.spec(Path("unused")).world_sizes == case.world_sizes


@pytest.mark.slow  # nightly: moved out of the default run to keep it near 8 minutes (README, Tests)
def test_a_failing_plan_shrinks_to_one_fault_and_prints_the_command_that_reruns_it() -> None:
    seen: list[ChaosCase] = []

    def fails_on_any_kill(case: ChaosCase) -> None:
        seen.append(case)
        if any(f["kind"] == "kill" for f in case.plan):
            raise ChaosFailure(f"kill in plan\nreproduce: {case.reproduce()}")

    with pytest.raises(ChaosFailure) as failure:
        check_property(fails_on_any_kill, chaos_settings("ci", max_examples=60))
    minimal = seen[-1]  # Hypothesis replays the shrunk example last
    assert [f["kind"] for f in minimal.plan] == ["kill"]
    assert minimal.plan[0]["step"] == 1 and minimal.plan[0]["rank"] == 0
    assert minimal.world_sizes == (2,)
    message = str(failure.value)
    assert "reproduce: trainwreck run --plan '" in message
    assert json.dumps(minimal.plan, separators=(",", ":")) in message


@pytest.mark.parametrize("text, seconds", [("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("1.5m", 90.0)])
def test_budgets_are_read_in_seconds_minutes_and_hours(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10", "10x", "m", "-5s", "0s", "ten minutes"])
def test_a_budget_without_a_unit_or_a_positive_number_is_refused_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="e.g. 90s, 10m, 1h"):
        parse_duration(text)


def test_the_profiles_are_ci_small_without_database_and_nightly_large_with_one() -> None:
    ci, nightly = chaos_settings("ci"), chaos_settings("nightly")
    assert ci.derandomize and ci.database is None and ci.max_examples <= 10
    assert nightly.database is not None and nightly.max_examples >= 100
    assert chaos_settings("ci", max_examples=7).max_examples == 7
    with pytest.raises(ValueError, match="ci, nightly"):
        chaos_settings("weekly")


def test_trainwreck_chaos_refuses_a_bad_budget_with_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.harness.commands import chaos as command

    args = argparse.Namespace(budget="10x", seed=1, out=None, launcher="warm", backend="auto")
    from trainwreck.harness.cli import run_command

    assert run_command("chaos", command, args) == 2  # the one exit path: the command raises
    assert "90s, 10m, 1h" in capsys.readouterr().err


def test_trainwreck_chaos_runs_plans_until_the_budget_is_spent_and_summarises(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], warm_launcher: Any, golden_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwreck.harness.commands import chaos as command
    from trainwreck.harness.judge.cache_dir import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(golden_cache))
    out = tmp_path / "chaos"
    args = argparse.Namespace(budget="1s", seed=7, out=out, launcher="warm", backend="auto")
    code = command.main(args)
    printed = capsys.readouterr().out
    runs = sorted(p.name for p in out.glob("plan-*"))
    assert runs and runs[0] == "plan-0001"
    assert all((out / r / "verdicts.json").exists() for r in runs)
    assert f"chaos summary: {len(runs)} plan(s) in 1s (seed 7): {len(runs)} valid" in printed
    assert code == 0


@pytest.mark.parametrize("values, code", [([True, True], 0), ([True, False, "unknown"], 1),
                                          (["unknown", True], 2), ([], 0)])
def test_trainwreck_chaos_exits_one_on_any_invalid_and_two_on_unknown_only(values: list[Any], code: int) -> None:
    from trainwreck.harness.commands.chaos import Outcome, exit_code

    outcomes = [Outcome(i, ChaosCase((2,)), Path("x"), v, "", 0.0) for i, v in enumerate(values)]
    assert exit_code(outcomes) == code


@given(st.sampled_from(["s", "m", "h"]), st.integers(1, 10**6))
def test_any_positive_whole_budget_parses(unit: str, number: int) -> None:
    assert parse_duration(f"{number}{unit}") == number * {"s": 1, "m": 60, "h": 3600}[unit]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(chaos_cases())
def test_an_fsdp_case_plans_no_comm_hook_fault_and_corrupts_only_files_a_sharded_checkpoint_has(
        case: ChaosCase) -> None:
    from trainwreck.faults.plan import KINDS
    from trainwreck.faults.strategies import FSDP_FILES

    assert case.config().parallelism == case.parallelism
    if case.parallelism != "fsdp":
        return
    assert not [f for f in case.plan if KINDS[f["kind"]].comm_hook], case.plan
    for fault in case.plan:
        if fault["kind"] == "corrupt" and fault["how"] in ("truncate", "flip"):
            assert fault["file"] in FSDP_FILES, fault
    assert "--set=parallelism=fsdp" in case.reproduce()


def test_chaos_draws_fsdp_cases_that_change_the_world_size_and_fsdp_corruptions_name_a_shard_file() -> None:
    from hypothesis import find

    from trainwreck.faults.strategies import FSDP_FILES, corruptions

    quick = settings(max_examples=500, database=None, suppress_health_check=list(HealthCheck))
    case = find(chaos_cases(), lambda c: c.parallelism == "fsdp" and len(set(c.world_sizes)) > 1, settings=quick)
    assert case.config().parallelism == "fsdp"
    fault = find(corruptions(1, ("flip",), "fsdp"), lambda f: f["file"] == "__0_0.distcp", settings=quick)
    assert fault["file"] in FSDP_FILES


def test_an_fsdp_chaos_case_with_a_kill_and_a_corrupted_shard_keeps_every_invariant(chaos: Any) -> None:
    # The derandomised smoke above may draw no FSDP case; this one always runs one.
    case = ChaosCase((2,), [{"id": "kill-1", "kind": "kill", "rank": 1, "step": 10, "how": "sigkill", "attempt": 0},
                            {"id": "corrupt-1", "kind": "corrupt", "how": "flip", "file": "__0_0.distcp",
                             "attempt": 1}], parallelism="fsdp")
    from trainwreck.harness.suites.chaos import CaseRunner

    judged = CaseRunner(chaos.out, chaos.golden_cache, chaos.settings.launcher, keep=True)(case)  # raises unless VALID
    fired = {e["fault_id"] for e in iter_events(judged.record.run_dir, batches=False) if e["kind"] == "fault"}
    assert fired == {"kill-1", "corrupt-1"} and judged.judgement.valid is True
