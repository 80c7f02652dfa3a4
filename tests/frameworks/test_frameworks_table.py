"""`trainwreck frameworks`: the table's rows logic, and real rows through the `--cmd` launcher.

The plain torchrun script's rows run in the default suite (about 10 s a run); the other
frameworks' rows are in their own test files, and the whole command on a framework is `slow`."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.frameworks.runs import events, exit_codes, scenario
from trainwreck.harness.suites import frameworks as table
from trainwreck.harness.commands import frameworks as command
from trainwreck.harness.suites.frameworks import (EVERY_OP, FRAMEWORKS, SCENARIOS, crash_every_op_jobs, recorded_ops,
                                           rows_json, run_table)
from trainwreck.invariants.verdict import UNKNOWN, exit_code


def never(job: table.Job, run_dir: Path) -> None:
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


def test_the_crash_points_of_a_recorded_save_are_before_after_and_torn_only_for_writes():
    ops = ["mkdir(.)", "save_file(checkpoint_1/model.safetensors)", "rename(<outside the root>, last.ckpt)"]
    jobs = crash_every_op_jobs(FRAMEWORKS["accelerate"], ops)
    assert [j.faults[0]["id"] for j in jobs] == ["crash-before-op0", "crash-after-op0", "crash-before-op1",
                                                 "crash-after-op1", "crash-torn-op1", "crash-before-op2",
                                                 "crash-after-op2"]
    assert {j.faults[0]["step"] for j in jobs} == {FRAMEWORKS["accelerate"].save_step}
    assert {j.max_restarts for j in jobs} == {SCENARIOS["kill-in-save"][2]}


def test_an_unknown_scenario_name_is_bad_input_naming_the_choices():
    with pytest.raises(command.InputError, match="--scenarios 'nope' is unknown; choose from golden"):
        command.pick("nope", list(table.SCENARIOS), "--scenarios")


def test_with_the_example_trainers_missing_from_the_install_the_command_exits_2_with_the_reason(monkeypatch, tmp_path,
                                                                                               capsys):
    monkeypatch.setattr(table, "SCRIPTS", tmp_path / "not-installed")
    args = argparse.Namespace(out=tmp_path / "out", json=True, frameworks="torchrun", scenarios="golden")
    from trainwreck.harness.cli import run_command

    assert run_command("frameworks", command, args) == 2  # the one exit path: the command raises
    err = capsys.readouterr().err
    assert "missing from the installed package" in err and "reinstall" in err
    assert not (tmp_path / "out").exists()


def test_a_cmd_plan_with_an_in_rank_kind_no_probe_can_fire_is_refused_naming_the_kind(tmp_path):
    result = subprocess.run([sys.executable, "-m", "trainwreck.harness.cli", "run", "--cmd", "python t.py", "--plan",
                             '[{"id": "n1", "kind": "nan_grad", "rank": 0, "step": 3}]', "--out",
                             str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "n1 (nan_grad)" in result.stderr and "foreign_crash" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def torchrun_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torchrun")
    row = scenario("torchrun", "golden", out)
    assert row.valid is True, row
    return out


def test_the_plain_torchrun_scripts_golden_row_is_valid_and_records_its_saves_file_operations(torchrun_out):
    golden = torchrun_out / "torchrun-golden"
    assert sorted({e["step"] for e in events(golden, "save")}) == [3, 6, 9, 12]
    ops = recorded_ops(golden, FRAMEWORKS["torchrun"].save_step)
    assert [op.split("(")[0] for op in ops] == ["open", "rename"]  # tmp file written, renamed into place


def test_a_crash_inside_a_cmd_ranks_own_save_fires_from_the_plan_and_the_restart_resumes_from_the_previous_save(
        torchrun_out):
    row = scenario("torchrun", "kill-in-save", torchrun_out)
    run_dir = torchrun_out / "torchrun-kill-in-save"
    (fault,) = events(run_dir, "fault")
    assert fault["fault_kind"] == "foreign_crash" and fault["rank"] == 0 and fault["attempt"] == 0
    assert fault["detail"].startswith("SIGKILL before op 1 rename(")
    assert exit_codes(run_dir, 0)[0] == -9
    assert [e["step"] for e in events(run_dir, "save") if e["attempt"] == 0] == [3]  # step 6 never committed
    assert {e["step"] for e in events(run_dir, "restore")} == {3}
    assert row.valid is True, row


@pytest.mark.slow  # nightly: moved out of the default run to keep it near 8 minutes (README, Tests)
def test_a_crash_after_the_durable_rename_is_recovered_not_covered_up(torchrun_out):
    ops = recorded_ops(torchrun_out / "torchrun-golden", 6)
    (job,) = [j for j in crash_every_op_jobs(FRAMEWORKS["torchrun"], ops) if j.faults[0]["id"] == "crash-after-op1"]
    row = table.run_one(job, torchrun_out, table.cmd_runner)
    run_dir = torchrun_out / f"torchrun-{job.scenario}"
    assert row.fired == ("crash-after-op1",)
    # The file was renamed into place (committed) but rank 0 died before its `save` event: the
    # restart verifies the checksum, announces the save on the writer's behalf, then restores it.
    (recovered,) = [e for e in events(run_dir, "save") if e.get("recovered")]
    assert (recovered["attempt"], recovered["step"]) == (0, 6)
    assert {e["step"] for e in events(run_dir, "restore")} == {6}
    assert row.valid is True, row


@pytest.mark.slow
def test_every_torchrun_scenario_runs_its_faults_fire_and_its_verdict_follows_its_events(tmp_path, capsys):
    args = argparse.Namespace(out=tmp_path, json=True, frameworks="torchrun", scenarios=",".join(
        [*SCENARIOS, EVERY_OP]))
    code = command.main(args)
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        run_dir = tmp_path / f"torchrun-{row['scenario']}"
        planned = {f["id"] for f in json.loads((run_dir / "run.json").read_text())["faults"]}
        assert set(row["fired"]) == planned, row  # every planned fault fired, from the run's own events
        verdicts = json.loads((run_dir / "verdicts.json").read_text())["verdicts"]
        assert row["invalid"] == sorted(n for n, v in verdicts.items() if v["valid"] is False)
        assert Path(row["report"]).is_file()
    assert {r["scenario"] for r in rows} >= {s for s in SCENARIOS if FRAMEWORKS["torchrun"].runs(s)}
    assert all(r["valid"] is True for r in rows), [r for r in rows if r["valid"] is not True]
    assert code == 0 and (tmp_path / "index.html").is_file()


@pytest.mark.slow
def test_the_command_judges_accelerate_rows_from_their_own_events_and_writes_a_casebook(tmp_path, capsys):
    pytest.importorskip("accelerate", reason="pip install 'trainwreck[accelerate]'")
    args = argparse.Namespace(out=tmp_path, json=True, frameworks="accelerate", scenarios="kill-in-save")
    code = command.main(args)
    rows = json.loads(capsys.readouterr().out)
    assert [(r["framework"], r["scenario"]) for r in rows] == [("accelerate", "golden"),
                                                               ("accelerate", "kill-in-save")]
    golden, crashed = rows
    assert golden["valid"] is True and golden["invalid"] == [] and Path(golden["report"]).is_file()
    assert crashed["fired"] == ["kill-in-save"]
    # The verdict follows the run's events: no restart restored anything, so progress failed.
    assert events(tmp_path / "accelerate-kill-in-save", "restore") == []
    assert crashed["valid"] is False and "progress" in crashed["invalid"]
    assert code == 1
    assert (tmp_path / "index.html").is_file()


CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y --no-install-recommends chromium)")
def test_the_casebook_of_real_rows_opens_in_a_real_browser_with_every_row_and_its_verdict(torchrun_out, tmp_path):
    from trainwreck.report.casebook import render_casebook

    rows = [scenario("torchrun", "kill-mid-epoch", torchrun_out)]
    runs = [torchrun_out / "torchrun-golden", torchrun_out / "torchrun-kill-mid-epoch"]
    index = render_casebook(tmp_path / "book", runs, "trainwreck frameworks")
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
                           "--dump-dom", index.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert "trainwreck frameworks" in dom
    assert "torchrun golden" in dom and "torchrun kill-mid-epoch" in dom  # each row's scenario name
    # the browser's DOM holds one case row per run, with the verdict its own verdicts.json says
    assert rows[0].valid is True and dom.count('data-valid="VALID"') == 2 and 'data-verdict="VALID"' in dom


def test_a_framework_is_declared_once_for_the_table_and_the_save_sweep() -> None:
    from trainwreck.harness.suites.sweep import FOREIGN_WRITERS

    assert FOREIGN_WRITERS and all(FOREIGN_WRITERS[name] is table.FRAMEWORKS[name] for name in FOREIGN_WRITERS)
    assert all(fw.kill_in_save is not None and fw.kill_in_save.what for fw in table.FRAMEWORKS.values())
