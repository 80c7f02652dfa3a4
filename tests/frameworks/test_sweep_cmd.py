"""`trainwreck sweep --cmd "python train.py"`: the user's own save crashed at every file
operation its golden run recorded, through the frameworks table's crash-every-op path."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainwreck.harness.suites.frameworks import EVERY_OP, command_framework, run_command_sweep
from trainwreck.trainer.frameworks import EXAMPLES

PLAIN = EXAMPLES / "plain_ddp.py"


def test_a_command_becomes_a_framework_that_runs_as_given() -> None:
    fw = command_framework(f"{sys.executable} {PLAIN} --save-every 3")
    assert fw.command() == (sys.executable, str(PLAIN), "--save-every", "3") and fw.save_step == 0


def test_sweep_cmd_refuses_options_of_the_other_sweeps_with_the_fix(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "trainwreck.harness.cli", "sweep", "--cmd", "python t.py",
                             "--power-loss", "--out", str(tmp_path / "out")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "--power-loss does not apply to --cmd" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_sweep_cmd_crashes_the_plain_scripts_own_save_at_every_recorded_operation(tmp_path: Path) -> None:
    rows = run_command_sweep(f"{sys.executable} {PLAIN}", tmp_path / "out")
    golden, points = rows[0], rows[1:]
    assert golden.scenario == "golden" and golden.valid is True, golden
    # plain_ddp.py's save: open the temporary file, rename it into place (torn: the write cut short).
    assert sorted(r.scenario for r in points) == sorted(
        f"{EVERY_OP}-{when}-op{i}" for i, whens in enumerate((("before", "after", "torn"), ("before", "after")))
        for when in whens)
    for row in points:
        assert row.fired == (f"crash-{row.scenario.removeprefix(EVERY_OP + '-')}",), row  # the run's own events
        assert row.valid is True, row
    verdicts = json.loads((tmp_path / "out" / "command-golden" / "verdicts.json").read_text())
    assert verdicts["reproduce"].startswith("trainwreck run --cmd")
