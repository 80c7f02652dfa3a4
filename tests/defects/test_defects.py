"""The planted-defect self-test: every invariant can fail, and the reference passes the same scenario.

One test per defect (the table is data: harness/suites/defects.py). A representative defect per
invariant runs by default; the rest of the table is `slow` (`pytest -m slow tests/defects`,
or `trainwreck defects`). Controls of one scenario run once per module.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from trainwreck.harness.suites.defects import DEFECTS, Defect, Row, run_control, run_defect, judge_row
from trainwreck.harness.pytest_plugin import record_run
from trainwreck.harness.supervise.watchdog_variants import watchdog_class
from trainwreck.invariants.judge import CHECKERS
from trainwreck.trainer.entry import trainer_class

# A cheap defect per invariant in the default run. progress is caught by the CLI test
# below (sigterm_exits_clean); the watchdog defect waits out two timeouts, so it is slow.
DEFAULT = {"resume_restarts_epoch", "optimizer_not_saved", "naive_writer", "rank_restores_different",
           "truncate_uneven_shards", "scaler_not_saved"}


def _param(defect: Defect) -> Any:
    marks = () if defect.name in DEFAULT else (pytest.mark.slow,)
    return pytest.param(defect, id=defect.name, marks=marks)


@pytest.fixture(scope="module")
def controls(tmp_path_factory: pytest.TempPathFactory, golden_cache: Path,
             warm_launcher: Any) -> Iterator[Callable[[Defect], Any]]:
    """control(defect) -> the reference's JudgedRun on the defect's scenario (one per scenario)."""
    out = tmp_path_factory.mktemp("controls")
    cache: dict[str, Any] = {}

    def control(defect: Defect) -> Any:
        name = defect.scenario.name
        if name not in cache:
            cache[name] = run_control(defect.scenario, out / name, golden_cache)
        return cache[name]

    yield control


@pytest.mark.parametrize("defect", [_param(d) for d in DEFECTS])
def test_each_planted_defect_is_caught_by_its_invariant_while_the_reference_passes(
        request: pytest.FixtureRequest, tmp_path: Path, golden_cache: Path, warm_launcher: Any,
        controls: Callable[[Defect], Any], defect: Defect) -> None:
    judged = run_defect(defect, tmp_path / defect.name, golden_cache)
    control = controls(defect)
    record_run(request, judged)
    record_run(request, control)
    row: Row = judge_row(defect, judged, control, 0.0)
    assert judged.judgement.unfired_faults == [], "the exposing fault never fired: the defect was not tested"
    assert row.caught, f"{defect.name} escaped {defect.invariant}: {row.summary}"
    assert control.judgement.unfired_faults == []
    assert row.control_valid, f"the reference failed {defect.scenario.name}: {control.judgement.to_json()}"
    assert_check_rejudges(judged.record.run_dir, control.record.run_dir)


def assert_check_rejudges(defect_dir: Path, control_dir: Path) -> None:
    """`trainwreck check DIR` with no --golden, as a nightly job re-judging stored runs calls it:
    it finds the golden run verdicts.json names, so the defect is INVALID and the control VALID."""
    from trainwreck.invariants.cli import main as check

    assert check([str(defect_dir)]) == 1, f"trainwreck check {defect_dir} passed a broken trainer"
    assert check([str(control_dir)]) == 0, f"trainwreck check {control_dir} failed the reference"


def test_check_without_golden_rejudges_a_defect_only_the_golden_run_catches(
        tmp_path: Path, golden_cache: Path, warm_launcher: Any, controls: Callable[[Defect], Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    """rng_not_restored restores every byte it saved: each restore digest equals its save, and
    only the uninterrupted run shows the trajectory leaving it (it was VALID under check)."""
    defect = next(d for d in DEFECTS if d.name == "rng_not_restored")
    judged = run_defect(defect, tmp_path / defect.name, golden_cache)
    assert judged.judgement.verdicts["continuity"].valid is False
    assert_check_rejudges(judged.record.run_dir, controls(defect).record.run_dir)
    assert f"note: golden run: {judged.golden_dir.absolute()}, which verdicts.json names" in capsys.readouterr().out


def test_the_table_plants_at_least_twelve_defects_and_every_invariant_can_fail() -> None:
    assert len(DEFECTS) >= 12
    assert len({d.name for d in DEFECTS}) == len(DEFECTS)
    assert {d.invariant for d in DEFECTS} == set(CHECKERS), "an invariant no defect can make fail is untested"
    for defect in DEFECTS:
        # Each is a selectable implementation, not a flag in the reference path.
        found = trainer_class(defect.name) if defect.component == "trainer" else watchdog_class(defect.name)
        assert found.__name__ and defect.scenario.plan, defect.name
    assert {d.name for d in DEFECTS} >= DEFAULT


def test_trainwreck_defects_json_prints_one_row_per_defect_and_exits_zero(
        capsys: pytest.CaptureFixture[str], warm_launcher: Any, golden_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwreck.harness.commands import defects as command
    from trainwreck.harness.judge.cache_dir import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(golden_cache))
    args = argparse.Namespace(json=True, only="sigterm_exits_clean", out=None, launcher="warm")
    assert command.main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [{k: r[k] for k in ("defect", "invariant", "caught", "control_valid")} for r in rows] == [
        {"defect": "sigterm_exits_clean", "invariant": "progress", "caught": True, "control_valid": True}]


def test_trainwreck_defects_rejects_an_unknown_defect_name(capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.harness.commands import defects as command

    args = argparse.Namespace(json=False, only="no_such_defect", out=None, launcher="warm")
    from trainwreck.harness.cli import run_command

    assert run_command("defects", command, args) == 2  # the one exit path: the command raises
    assert "unknown defect 'no_such_defect'" in capsys.readouterr().err
