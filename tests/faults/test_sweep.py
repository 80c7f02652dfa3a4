"""The crash-point sweep: crash a save at each storage operation and judge each run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwreck.harness.suites.sweep import SweepRequest, SweepResult, run_sweep

# The reference save's mutating ops (tests/faults/test_injectors.py checks the recording):
# 2 = write(.tmp-step-00000016-PID/model.pt), 9 = rename(.tmp..., step-00000016),
# 11 = rename(latest.tmp, latest), the commit. The naive writer's op 1 is
# mkdir(step-00000016), right after it advanced the pointer and announced the save.


def test_the_reference_writer_survives_a_torn_file_and_a_crash_after_the_directory_rename(tmp_path: Path) -> None:
    result = run_sweep(SweepRequest("reference", points=((0, 2, "torn"), (0, 9, "after"))), out=tmp_path)
    assert [(r.op_index, r.when) for r in result.rows] == [(2, "torn"), (9, "after")]
    assert result.first_failure is None, [r.to_json() for r in result.rows]
    rows = json.loads(json.dumps(result.to_json()))["rows"]
    assert [r["verdict"] for r in rows] == [True, True] and rows[1]["op"].startswith("rename(.tmp-step-00000016")


def test_the_naive_writer_breaks_when_it_crashes_after_announcing_a_save_it_has_not_written(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_sweep(SweepRequest("naive_writer", points=((0, 0, "before"), (0, 1, "before"))), out=tmp_path,
                       progress=lines.append)
    first = result.first_failure
    assert first is not None and (first.op_index, first.when, first.op) == (1, "before", "mkdir(step-00000016)")
    assert first.failing == ["atomicity"] and "needless lost work" in first.summary
    assert result.rows[0].verdict is True, "crashing before the pointer write loses nothing"
    assert any("INVALID" in line and "mkdir(step-00000016)" in line for line in lines)


def test_a_crash_right_after_the_commit_pointer_is_renamed_is_judged_valid(tmp_path: Path) -> None:
    # The writer dies after committing but before its `save` event: the next attempt
    # restores the committed checkpoint and announces the commit on its behalf.
    result = run_sweep(SweepRequest("reference", points=((0, 11, "after"),)), out=tmp_path)
    assert result.rows[0].op == "rename(latest.tmp, latest)"
    assert result.first_failure is None, result.rows[0].summary
    recovered = [line for p in Path(result.rows[0].run_dir, "events").glob("a001-r000-*.jsonl")
                 for line in p.read_text().splitlines() if '"recovered":true' in line]
    assert len(recovered) == 1 and '"attempt":0' in recovered[0], "the commit was not announced by attempt 1"


def test_every_crash_point_is_judged_through_run_and_judge_with_its_verdicts_and_report(tmp_path: Path) -> None:
    result = run_sweep(SweepRequest("reference", points=((0, 12, "before"),)), out=tmp_path)
    run_dir = Path(result.rows[0].run_dir)
    verdicts = json.loads((run_dir / "verdicts.json").read_text())
    assert verdicts["valid"] is True and verdicts["reproduce"] == "trainwreck sweep --writer reference --points 12:before"
    assert (run_dir / "report" / "report.html").is_file()
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert [f["id"] for f in report["faults"]] == ["crash-before-op12"], "the crash never fired"


@pytest.fixture(scope="module")
def reference_sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepResult:
    """The full reference sweep (37 jobs), run once for the slow tests that read it."""
    return run_sweep(SweepRequest("reference"), out=tmp_path_factory.mktemp("sweep"))


@pytest.mark.slow
def test_the_reference_writer_survives_a_crash_at_every_storage_operation(reference_sweep: SweepResult) -> None:
    result = reference_sweep
    assert len(result.ops) >= 10 and len(result.rows) == len(json.loads(json.dumps(result.to_json()))["rows"])
    assert result.failures == [], [r.label for r in result.failures]


@pytest.mark.slow
def test_the_naive_writer_sweep_names_its_first_failing_operation(tmp_path: Path) -> None:
    result = run_sweep(SweepRequest("naive_writer"), out=tmp_path)
    data = result.to_json()
    assert data["crash_points"] == len(data["rows"]) == 27 and data["failures"] >= 1
    assert data["first_failure"]["op"] == "mkdir(step-00000016)" and data["first_failure"]["when"] == "before"
