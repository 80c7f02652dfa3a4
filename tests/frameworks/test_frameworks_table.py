"""`trainwreck frameworks`: the table's rows logic, and real rows through the stand-in launcher."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from trainwreck.harness import frameworks as table
from trainwreck.harness.commands import frameworks as command
from trainwreck.harness.frameworks import FRAMEWORKS, Job, Row, crash_every_op_jobs, rows_json, run_table
from trainwreck.invariants.verdict import UNKNOWN, exit_code

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import launch  # noqa: E402


def stand_in(job: Job, run_dir: Path) -> None:
    """The Launcher interface over tests/frameworks/scripts/launch.py (until --cmd is merged)."""
    attempts = [launch.Attempt(a.world_size, job.resume_args if a.resume else ()) for a in job.attempts]
    launch.run_job(list(job.cmd), run_dir, attempts, job.total_steps, job.dataset_size, job.global_batch,
                   list(job.faults), dict(job.env))


def never(job: Job, run_dir: Path) -> None:
    raise AssertionError(f"no run should start: {job.framework} {job.scenario}")


def test_a_framework_that_is_not_installed_gets_rows_that_say_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(table.Framework, "installed", lambda self: False)
    rows = run_table(tmp_path, never, ["lightning"], ["golden", "kill-mid-epoch"])
    assert [(r.framework, r.scenario, r.valid) for r in rows] == [("lightning", "golden", UNKNOWN),
                                                                   ("lightning", "kill-mid-epoch", UNKNOWN)]
    assert all("pip install 'trainwreck[lightning]'" in r.reason for r in rows)
    assert rows_json(rows)[0] == {"framework": "lightning", "scenario": "golden", "valid": "unknown", "invalid": [],
                                  "report": None, "reason": rows[0].reason, "fired": []}
    assert exit_code(table.table_validity(rows)) == 2


def test_without_a_launcher_every_row_is_unknown_with_the_reason_never_a_pass(tmp_path):
    rows = run_table(tmp_path, table.default_launcher(), ["accelerate"], ["golden"])
    assert [r.valid for r in rows] == [UNKNOWN]
    assert "--cmd" in rows[0].reason
    assert table.table_validity([*rows, Row("x", "y", True)]) == UNKNOWN


def test_the_crash_points_of_a_recorded_save_are_before_after_and_torn_only_for_writes():
    ops = ["mkdir(.)", "save_file(checkpoint_1/model.safetensors)", "rename(<outside the root>, last.ckpt)"]
    jobs = crash_every_op_jobs(FRAMEWORKS["accelerate"], ops)
    assert [j.faults[0]["id"] for j in jobs] == ["crash-before-op0", "crash-after-op0", "crash-before-op1",
                                                 "crash-after-op1", "crash-torn-op1", "crash-before-op2",
                                                 "crash-after-op2"]
    assert {j.faults[0]["step"] for j in jobs} == {FRAMEWORKS["accelerate"].save_step}


def test_an_unknown_scenario_name_is_bad_input_naming_the_choices():
    with pytest.raises(command.InputError, match="--scenarios 'nope' is unknown; choose from golden"):
        command.pick("nope", list(table.SCENARIOS), "--scenarios")


@pytest.mark.slow
def test_the_command_judges_accelerate_rows_from_their_own_events_and_writes_a_casebook(monkeypatch, tmp_path,
                                                                                         capsys):
    pytest.importorskip("accelerate", reason="pip install 'trainwreck[accelerate]'")
    monkeypatch.setattr(table, "default_launcher", lambda: stand_in)
    args = argparse.Namespace(out=tmp_path, json=True, frameworks="accelerate", scenarios="kill-in-save")
    code = command.main(args)
    rows = json.loads(capsys.readouterr().out)
    assert [(r["framework"], r["scenario"]) for r in rows] == [("accelerate", "golden"),
                                                               ("accelerate", "kill-in-save")]
    golden, crashed = rows
    assert golden["valid"] is True and golden["invalid"] == [] and Path(golden["report"]).is_file()
    assert crashed["fired"] == ["kill-in-save"]
    # The verdict follows the run's events: no restart restored anything, so progress failed.
    run_dir = tmp_path / "accelerate-kill-in-save"
    assert launch.events(run_dir, "restore") == []
    assert crashed["valid"] is False and "progress" in crashed["invalid"]
    assert code == 1
    assert (tmp_path / "index.html").is_file()
