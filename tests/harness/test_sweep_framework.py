"""`trainwreck sweep --framework <framework>`: a framework's own save crashed at every file
operation, through the frameworks table's crash-every-op rows."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainwreck.faults.foreign import WRITE_OPS
from trainwreck.harness.commands.sweep import configure, request_from
from trainwreck.harness.errors import InputError
from trainwreck.harness.suites.frameworks import FRAMEWORKS, recorded_ops

SWEEP = (sys.executable, "-m", "trainwreck.harness.cli", "sweep")


@pytest.mark.parametrize("flag", [("--points", "1:after"), ("--parallelism", "fsdp")])
def test_a_framework_sweep_refuses_options_that_only_fit_the_reference_writer(flag: tuple[str, str]) -> None:
    result = subprocess.run([*SWEEP, "--framework", "torchrun", *flag], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"{flag[0]} does not apply to --framework torchrun" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_plain_scripts_save_is_crashed_at_every_operation_its_golden_run_recorded(tmp_path: Path) -> None:
    result = subprocess.run([*SWEEP, "--framework", "torchrun", "--json", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    rows = json.loads(result.stdout)
    ops = recorded_ops(tmp_path / "torchrun-golden", FRAMEWORKS["torchrun"].save_step)
    writes = sum(op.startswith(tuple(f"{name}(" for name in WRITE_OPS)) for op in ops)
    crash_rows = [r for r in rows if r["scenario"] != "golden"]
    assert ops and len(crash_rows) == 2 * len(ops) + writes
    for row in crash_rows:  # each row's planned crash fired, by the run's own fault events
        assert row["fired"] == ["crash-" + row["scenario"].removeprefix("crash-every-op-")], row
    assert result.returncode == (0 if all(r["valid"] is True for r in rows) else 1)


@pytest.mark.parametrize(("argv", "says"), [
    (["--writer", "hf"], "--writer hf names a framework, not a writer of the reference trainer; use --framework hf"),
    (["--framework", "no_such"], "--framework 'no_such' is not a framework the crash sweep takes; frameworks: "),
    (["--framework", "torchrun", "--power-loss"], "'torchrun' is not a framework the power-loss sweep takes"),
    (["--framework", "hf", "--writer", "naive_writer"], "--writer does not apply to --framework hf"),
])
def test_the_sweep_takes_a_framework_by_framework_and_a_trainer_writer_by_writer(argv: list[str], says: str) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    with pytest.raises(InputError) as raised:
        request_from(parser.parse_args(argv))
    assert says in str(raised.value)
