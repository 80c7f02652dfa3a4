"""DCP's own writer on its own (its `.metadata` rename commit, no trainwreck pointer), crashed
at each of its file operations: what its protocol does and does not guarantee."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwreck.faults.storage import MUTATING
from trainwreck.harness.cli import main as cli
from trainwreck.harness.suites.sweep import DCP_LOAD, SweepRequest, SweepResult, run_sweep


def every_point_ran_its_own_crash(result: SweepResult) -> None:
    """Each crash point's recorded fault fired, at that op (verdicts.json, written by the one publish
    path, keeps the fault's own detail as the load check's evidence)."""
    for row in result.rows:
        fault = json.loads((Path(row.run_dir) / "verdicts.json").read_text())["verdicts"][DCP_LOAD]["evidence"]
        path = row.op.split("(", 1)[1].split(",")[0].split(")")[0]
        assert len(fault) == 1 and path in fault[0] and ("tore" if row.when == "torn" else row.when) in fault[0], \
            (row.label, fault)


def expected_points(result: SweepResult) -> int:
    """Crash points from the recorded ops: before and after each, torn for each write."""
    return sum(3 if op.startswith("write(") else 2 for op in result.ops)


def test_in_a_new_directory_per_save_every_crash_leaves_the_earlier_checkpoint_and_a_committed_or_absent_new_one(
        tmp_path: Path) -> None:
    result = run_sweep(SweepRequest("dcp"), out=tmp_path)
    assert len(result.rows) == expected_points(result) and all(o.split("(")[0] in MUTATING for o in result.ops)
    assert result.ops[-1].startswith("rename(") and result.ops[-1].endswith("/.metadata)"), result.ops
    every_point_ran_its_own_crash(result)
    assert result.failures == [], [r.label + ": " + r.summary for r in result.failures]


def test_saving_in_place_loses_the_checkpoint_when_dcp_crashes_between_its_shard_overwrite_and_metadata_rename(
        tmp_path: Path) -> None:
    result = run_sweep(SweepRequest("dcp_in_place"), out=tmp_path)
    assert len(result.rows) == expected_points(result)
    every_point_ran_its_own_crash(result)
    failing = {(r.op.split("(")[0], r.when) for r in result.failures}
    # DCP removes the old .metadata before renaming the new one into place: in between
    # the directory has none. A torn shard overwrite leaves a file the old .metadata cannot read.
    assert {("remove", "after"), ("rename", "before"), ("write", "torn")} <= failing, failing
    assert all(r.failing == ["dcp_load"] and ("does not load" in r.summary or "missing" in r.summary)
               for r in result.failures), [r.summary for r in result.failures]
    rename = next(r for r in result.rows if r.op.startswith("rename(") and r.when == "after")
    assert rename.verdict is True, "after the rename the new save must load"


def test_the_cli_sweeps_dcps_own_writer_and_exits_1_when_a_crash_point_loses_the_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli(["sweep", "--writer", "dcp_in_place", "--points", "3:after", "--json", "--out", str(tmp_path)])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["parallelism"] == "dcp" and [r["verdict"] for r in data["rows"]] == [False]
    assert data["rows"][0]["op"].startswith("remove(") and data["rows"][0]["op"].endswith("/.metadata)")
    verdicts = json.loads((Path(data["rows"][0]["run_dir"]) / "verdicts.json").read_text())
    assert {"valid", "verdicts", "reproduce", "outcome", "attempts"} <= set(verdicts), "not runner.publish's shape"
    assert verdicts["reproduce"] == "trainwreck sweep --writer dcp_in_place --points 3:after"


@pytest.mark.parametrize("flags, says", [
    (["--writer", "dcp_in_place", "--power-loss"], "--writer"),
    (["--writer", "dcp", "--parallelism", "fsdp"], "leave out --parallelism"),
    (["--power-loss", "--parallelism", "fsdp"], "not implemented"),
    (["--parallelism", "fsdp", "--points", "r1:torn"], "[rRANK:]OP_INDEX:WHEN"),
])
def test_a_sweep_flag_combination_that_cannot_run_exits_2_with_one_line_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str) -> None:
    assert cli(["sweep", *flags, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
