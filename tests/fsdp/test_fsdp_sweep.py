"""The crash-point sweep against a sharded (FSDP) save: every rank is crashed at each of its
own storage operations, DCP's `.metadata` commit included, and every crash point is judged."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainwreck.faults.storage import MUTATING
from trainwreck.faults.sweep import describe
from trainwreck.harness.suites.sweep import SweepRequest, SweepResult, observe_sharded, run_sweep
from trainwreck.rundir.layout import iter_events


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list]:
    return observe_sharded("reference", tmp_path_factory.mktemp("observed") / "run")


def index_of(ops: list, text: str) -> int:
    return next(i for i, op in enumerate(ops) if text in describe(op))


def fired(row_run_dir: str) -> list[tuple[str, int]]:
    return [(e["fault_id"], e["rank"]) for e in iter_events(Path(row_run_dir), batches=False) if e["kind"] == "fault"]


def test_every_rank_records_its_own_shard_write_and_rank_0_records_dcps_metadata_commit(recorded: dict) -> None:
    assert sorted(recorded) == [0, 1] and all(op.name in MUTATING for ops in recorded.values() for op in ops)
    for rank, ops in recorded.items():
        assert any(op.name == "write" and op.args[0].endswith(f"/__{rank}_0.distcp") for op in ops), rank
    rank0 = [describe(op) for op in recorded[0]]
    assert any(d.startswith("rename(") and d.endswith("/.metadata)") for d in rank0), rank0
    assert not any(".metadata" in describe(op) for op in recorded[1]), "only DCP's coordinator writes .metadata"


def test_rank_1_torn_in_its_shard_write_and_rank_0_crashed_after_dcps_metadata_rename_both_resume_valid(
        tmp_path: Path, recorded: dict) -> None:
    shard = index_of(recorded[1], "__1_0.distcp")
    metadata = index_of(recorded[0], "/.metadata)")
    result = run_sweep(SweepRequest(parallelism="fsdp", observed=recorded,
                                    points=((1, shard, "torn"), (0, metadata, "after"))), out=tmp_path)
    assert [(r.rank, r.op_index, r.when) for r in result.rows] == [(0, metadata, "after"), (1, shard, "torn")]
    for row in result.rows:
        assert fired(row.run_dir) == [(f"crash-r{row.rank}-{row.when}-op{row.op_index}", row.rank)], row.label
    assert result.first_failure is None, [r.to_json() for r in result.rows]


@pytest.mark.slow
def test_the_sharded_sweep_reports_every_crash_point_of_every_rank_and_each_is_valid(
        tmp_path: Path, recorded: dict) -> None:
    result: SweepResult = run_sweep(SweepRequest(parallelism="fsdp", observed=recorded), out=tmp_path)
    expected = {(rank, i, when) for rank, ops in recorded.items() for i, op in enumerate(ops)
                for when in ("before", "after", "torn") if when != "torn" or op.name == "write"}
    assert sorted((r.rank, r.op_index, r.when) for r in result.rows) == sorted(expected)
    assert {r.rank for r in result.rows} == {0, 1}
    for row in result.rows:
        assert fired(row.run_dir) == [(f"crash-r{row.rank}-{row.when}-op{row.op_index}", row.rank)], row.label
    assert result.failures == [], [r.label + ": " + r.summary for r in result.failures]
    data = result.to_json()
    assert data["crash_points"] == len(expected) and data["parallelism"] == "fsdp"
