"""`trainwreck report` on hostile run directories (issue 24, items 1-3): it never writes
through a planted link or into a folder linked elsewhere, never copies a file outside
stacks/ into the report, and never waits on a FIFO. Runs the real command in-process
(`harness.cli.main`) in a worker thread with a deadline, so a blocked open fails the test."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.report.rundirs import clean_run, hung_run
from tests.hostile import mkfifo, within_deadline
from trainwreck.harness.cli import main as trainwreck


def report(run: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = within_deadline(lambda: trainwreck(["report", str(run)]))
    return code, capsys.readouterr().err


def test_a_link_planted_at_the_reports_temporary_name_is_never_written_through(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = clean_run(tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("must survive")
    (run / "report").mkdir(exist_ok=True)
    for name in ("report.md.tmp", "report.html.tmp", "report.json.tmp"):
        (run / "report" / name).symlink_to(victim)
    code, err = report(run, capsys)
    assert code == 0, err
    assert victim.read_text() == "must survive"
    assert (run / "report" / "report.md").is_file() and not (run / "report" / "report.md").is_symlink()


def test_a_report_folder_linked_out_of_the_run_directory_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = clean_run(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "report").symlink_to(elsewhere)
    code, err = report(run, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "outside" in err, err
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("where", ["outside", "absolute"])
def test_a_hang_events_stack_path_outside_stacks_is_never_read_into_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    run = hung_run(tmp_path / "run")
    secret = tmp_path / "secret.txt"
    secret.write_text('  File "/home/someone/secret_project/trainer/keys.py", line 7 in SECRET_TOKEN\n')
    harness = run / "events" / "harness.jsonl"
    path = "../secret.txt" if where == "outside" else str(secret)
    harness.write_text(harness.read_text().replace('"stacks/a000-r001-p1.txt"', json.dumps(path)))
    code, err = report(run, capsys)
    assert "Traceback" not in err
    for name in ("report.json", "report.md", "report.html"):
        assert "SECRET_TOKEN" not in (run / "report" / name).read_text(), name


def test_the_stack_dump_inside_stacks_is_still_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = hung_run(tmp_path / "run")
    report(run, capsys)
    assert "forward_backward" in (run / "report" / "report.json").read_text()


@pytest.mark.parametrize("planted", ["stacks/a000-r001-p1.txt", "verdicts.json"])
def test_a_fifo_where_the_report_reads_a_file_is_skipped_without_blocking(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], planted: str) -> None:
    run = hung_run(tmp_path / "run")
    if (run / planted).exists():
        (run / planted).unlink()
    mkfifo(run / planted)
    code, err = report(run, capsys)
    assert code in (0, 1, 2) and "Traceback" not in err, err
    assert (run / "report" / "report.json").is_file()


def test_a_fifo_as_a_golden_entrys_manifest_makes_it_damaged_not_a_wait(tmp_path: Path) -> None:
    from trainwreck.harness.judge.golden import MANIFEST, _intact

    entry = clean_run(tmp_path / "entry")
    mkfifo(entry / MANIFEST)
    assert within_deadline(lambda: _intact(entry)) is False
    os.unlink(entry / MANIFEST)


def test_a_process_the_harness_ended_after_its_attempt_is_named_by_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.report.model import build_report
    from trainwreck.report.truth import check_report  # the sentence is a claim: re-derived from the events
    run = clean_run(tmp_path / "run")
    harness = run / "events" / "harness.jsonl"
    lines = harness.read_text().splitlines()
    t = json.loads(lines[-1])["t"]
    lines.insert(-1, json.dumps({"kind": "leftover", "t": t - 0.01, "attempt": 0, "pid": 4242, "sid": 4242,
                                 "cmdline": "python -c import time; time.sleep(600)"}))
    harness.write_text("\n".join(lines) + "\n")
    judged = build_report(run)  # stored as verdicts.json, which the truth check reads
    (run / "verdicts.json").write_text(json.dumps({"valid": judged["valid"], "verdicts": judged["verdicts"], "notes": [],
                                                   "unfired_faults": [], "outcome": "completed", "attempts": 1}))
    code, err = report(run, capsys)
    assert code == 0, err
    text = (run / "report" / "report.md").read_text()
    assert "Attempt 0 left 1 process(es) running after its ranks were done (pid 4242: python -c import time" in text
    assert "the harness ended them with the attempt" in (run / "report" / "report.html").read_text()
    assert check_report(run) == []
