"""The in-rank recording of the power-loss sweep (faults/powerloss.py ShippedRecorder):
what it ships to the run directory reads back as the op log the model was given."""
from __future__ import annotations

from pathlib import Path

from trainwreck.faults.powerloss import OpLog, ShippedRecorder, crash_states, load_oplog, materialise, record_save
from trainwreck.trainer.storage import LocalStorage


def ship(root: Path, out: Path) -> ShippedRecorder:
    materialise({"old": b"before the save", "keep": None}, root)
    recorder = ShippedRecorder(LocalStorage(root), root, out)
    recorder.start()
    recorder.mkdir("tmp")
    recorder.write("tmp/a", b"x" * 5000, durable=False)
    recorder.write("tmp/b", b"y" * 10)
    recorder.rename("tmp", "final")
    recorder.fsync_dir(".")
    recorder.remove("old")
    return recorder


def comparable(log: OpLog) -> tuple[object, ...]:
    return log.before, log.ids, [vars(op) for op in log.ops]


def test_a_shipped_recording_reads_back_as_the_op_log_it_recorded(tmp_path: Path) -> None:
    recorder = ship(tmp_path / "root", tmp_path / "ship" / "ops-a000.jsonl")
    loaded = load_oplog(tmp_path / "ship" / "ops-a000.jsonl")
    assert comparable(loaded) == comparable(recorder.log)
    assert [op.kind for op in loaded.ops] == ["mkdir", "create", "data", "create", "data", "fsync_file", "rename",
                                              "fsync_dir", "unlink"]
    # Data is kept once per content beside the log, not inline.
    assert len(list((tmp_path / "ship" / "blobs").iterdir())) == 3  # "before the save", x*5000, y*10
    times = [op.t for op in loaded.ops]
    assert times == sorted(times) and times[0] > 0, "every op carries the time it was issued"
    assert crash_states(loaded)[1].explored == crash_states(recorder.log)[1].explored > 1


def test_a_recording_without_its_header_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "ops-a000.jsonl"
    path.write_text('{"index": 0}\n')
    try:
        load_oplog(path)
    except ValueError as exc:
        assert "first line must hold 'before'" in str(exc)
    else:
        raise AssertionError("a recording without its header was accepted")


def test_every_save_of_the_in_process_replay_is_in_the_durable_state_before_the_recorded_one() -> None:
    # The in-process recording (record_save) and the in-rank one share PowerLossRecorder:
    # ops of an in-process replay carry times too, so either can feed the sweep.
    log = record_save("reference")
    assert log.before and all(op.t > 0 for op in log.ops)


def test_one_tree_under_two_different_event_logs_counts_as_two_states(tmp_path: Path) -> None:
    root = tmp_path / "root"
    materialise({}, root)
    recorder = ShippedRecorder(LocalStorage(root), root, tmp_path / "ops.jsonl")
    recorder.start()
    recorder.mkdir("d")  # never made durable: after it, the disk may still hold nothing
    by_tree = crash_states(recorder.log)[0]
    by_tree_and_log = crash_states(recorder.log, epoch=lambda point: point)[0]
    assert sorted(map(sorted, (s.tree for s in by_tree))) == [[], ["d"]]
    assert sorted((s.point, sorted(s.tree)) for s in by_tree_and_log) == [(0, []), (1, []), (1, ["d"])]


def test_dcp_commit_is_recorded_through_the_same_recorder_with_file_fsyncs_and_no_directory_fsync(
        tmp_path: Path) -> None:
    from trainwreck.faults.powerloss import DCP_DIR, record_dcp_save

    log = record_dcp_save(tmp_path / "root")
    kinds = [op.kind for op in log.ops]
    assert kinds.count("fsync_file") == kinds.count("data") >= 2 and "fsync_dir" not in kinds
    assert log.ops[-1].describe() == f"rename({DCP_DIR}/.metadata.tmp -> {DCP_DIR}/.metadata)"
