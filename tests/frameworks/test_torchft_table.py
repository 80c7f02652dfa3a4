"""torchft's rows in `trainwreck frameworks` without torchft installed: unknown, saying how to install it."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.frameworks.runs import without_extra
from trainwreck.harness.commands import frameworks as command


def test_without_torchft_its_rows_are_unknown_with_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    without_extra(monkeypatch, "torchft")
    args = argparse.Namespace(out=tmp_path / "out", json=True, frameworks="torchft",
                              scenarios="golden,kill-lighthouse")
    assert command.main(args) == 2
    rows = json.loads(capsys.readouterr().out)
    assert [(r["framework"], r["scenario"], r["valid"]) for r in rows] == [
        ("torchft", "golden", "unknown"), ("torchft", "kill-lighthouse", "unknown")]
    assert all("pip install 'trainwreck[torchft]'" in r["reason"] for r in rows)



def test_every_torchft_row_and_restart_scope_is_a_replica_group_job_that_checks(tmp_path: Path) -> None:
    from trainwreck.harness.suites import restart_compare, torchft_rows

    specs = [torchft_rows.job_for(name, tmp_path / name) for name in torchft_rows.SCENARIOS]
    specs += [restart_compare.job_for(scope, tmp_path / scope, "python") for scope in restart_compare.SCOPES]
    assert {s.launcher for s in specs} == {"replica-groups"}
    assert [s.target.groups for s in specs] == [s.world_sizes[0] for s in specs]  # one rank per group
