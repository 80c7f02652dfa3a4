"""trainwreck demo: bad input is refused before anything runs; a real demo ends in a casebook."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainwreck.harness.cli import main as cli
from trainwreck.harness.commands.demo import DEMO_SCENARIOS, demo_names
from trainwreck.harness.supervise.scenarios import scenario_names


def test_the_demo_runs_at_least_four_scenarios_that_exist() -> None:
    names = demo_names()
    assert len(names) >= 4 and set(names) <= set(scenario_names())
    if len(scenario_names()) >= 8:
        assert names == [n for n in DEMO_SCENARIOS if n in scenario_names()]


def test_an_unknown_scenario_is_refused_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["demo", "--out", str(tmp_path / "d"), "--scenarios", "no-such-case"]) == 2
    assert "unknown scenario 'no-such-case'" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_non_empty_out_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert cli(["demo", "--out", str(tmp_path)]) == 2
    assert "pick another --out" in capsys.readouterr().err


@pytest.mark.slow
def test_a_demo_judges_each_run_reports_it_and_ends_with_the_casebook_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRAINWRECK_GOLDEN_CACHE", str(tmp_path / "golden"))  # cold, as on a fresh machine
    out = tmp_path / "demo"
    assert cli(["demo", "--out", str(out), "--scenarios", "kill-resume,hang-detect"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2] == f"casebook: {out / 'index.html'}"
    for name in ("01-kill-resume", "02-hang-detect"):
        assert (out / "runs" / name / "report" / "report.html").exists()
    index = (out / "index.html").read_text()
    assert "2 run(s): 2 valid." in index and "How do you find the rank that hangs?" in index
