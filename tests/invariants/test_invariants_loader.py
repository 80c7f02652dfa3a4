"""The loader: tolerant of crash marks, strict about untrustworthy input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from histories import HistoryBuilder

from trainwreck.invariants import InputError, judge, load_history
from trainwreck.invariants import loader


def simple_run(b: HistoryBuilder) -> HistoryBuilder:
    b.attempt(2).train(4, save_every=2)
    b.end(final_step=4)
    return b


def test_torn_last_line_is_skipped_with_a_note(builder):
    b = simple_run(builder(total_steps=4))
    b.raw_line(b.attempts[0].file(1), '{"kind": "step", "t": 1001.5, "attem')
    history = b.load()
    assert any("torn last line" in note and "r001" in note for note in history.notes)
    assert list(history.logs[(0, 1)].steps) == [1, 2, 3, 4]


def test_last_line_cut_inside_a_utf8_character_is_a_torn_line(builder):
    b = simple_run(builder(total_steps=4))
    path = b.write() / "events" / b.attempts[0].file(0)
    path.write_bytes(path.read_bytes() + '{"kind": "fault", "detail": "é'.encode()[:-1])
    history = load_history(b.dir)
    assert any("torn last line" in note for note in history.notes)


def test_bad_line_in_the_middle_names_file_and_line(builder):
    b = simple_run(builder(total_steps=4))
    lines = b.files[b.attempts[0].file(0)]
    lines.insert(3, "this is not json")
    with pytest.raises(InputError, match=r"events/a000-r000-p4000\.jsonl line 4: not valid JSON"):
        b.load()


def test_event_missing_a_required_field_names_file_line_and_field(builder):
    b = simple_run(builder(total_steps=4))
    b.raw_line(b.attempts[0].file(0), json.dumps({"kind": "step", "t": 1.0, "attempt": 0, "rank": 0, "world_size": 2}))
    b.raw_line(b.attempts[0].file(0), json.dumps({"kind": "end", "t": 2.0, "status": "completed", "final_step": 4}))
    with pytest.raises(InputError, match=r"a000-r000-p4000\.jsonl line \d+: step event: missing field 'step'"):
        b.load()


@pytest.mark.parametrize(
    "event, message",
    [
        ({"kind": "batch", "t": 1.0, "attempt": 0, "rank": 0, "world_size": 2, "step": 9, "epoch": 0, "samples": [1, "x"]}, "field 'samples'"),
        ({"kind": "restore", "t": 1.0, "attempt": 0, "rank": 0, "world_size": 2, "step": 2}, "missing field 'checkpoint'"),
        ({"kind": "save", "t": 1.0, "attempt": "0", "step": 2, "checkpoint": "c"}, "field 'attempt' must be"),
        ({"t": 1.0, "attempt": 0}, "missing field 'kind'"),
        ({"kind": "step", "attempt": 0}, "missing field 't'"),
        ([1, 2, 3], "expected a JSON object"),
    ],
)
def test_malformed_events_are_input_errors(builder, event, message):
    b = simple_run(builder(total_steps=4))
    b.files[b.attempts[0].file(1)].insert(2, json.dumps(event))
    with pytest.raises(InputError, match=message):
        b.load()


def test_missing_run_json_is_an_input_error(tmp_path: Path):
    (tmp_path / "events").mkdir()
    with pytest.raises(InputError, match="run.json: missing"):
        load_history(tmp_path)


def test_malformed_run_json_names_the_line(tmp_path: Path):
    (tmp_path / "run.json").write_text('{\n  "format": "trainwreck-run/1",\n  "dataset_size": ,\n}')
    with pytest.raises(InputError, match="run.json: line 3"):
        load_history(tmp_path)


def test_another_format_version_is_refused(builder):
    b = simple_run(builder(total_steps=4))
    b.spec["format"] = "trainwreck-run/2"
    with pytest.raises(InputError, match="'format' is 'trainwreck-run/2'"):
        b.load()


@pytest.mark.parametrize("field", ["dataset_size", "global_batch", "drop_last", "total_steps", "hang_timeout_s", "faults"])
def test_run_json_missing_a_field_names_it(builder, field):
    b = simple_run(builder(total_steps=4))
    del b.spec[field]
    with pytest.raises(InputError, match=f"missing field '{field}'"):
        b.load()


def test_fault_plan_entries_need_unique_ids(builder):
    b = simple_run(builder(total_steps=4, faults=[{"id": "k", "kind": "kill"}, {"id": "k", "kind": "hang"}]))
    with pytest.raises(InputError, match=r"faults\[1\]: duplicate fault id 'k'"):
        b.load()


def test_unknown_kinds_are_ignored_with_a_note(builder):
    b = simple_run(builder(total_steps=4))
    b.attempts[0].emit(0, "phase", name="forward")
    history = b.load()
    assert any("unknown kind 'phase'" in note for note in history.notes)


def test_every_jsonl_file_is_read_whatever_its_name(builder):
    b = builder(total_steps=2)
    b.write_event("my-trainer.jsonl", "batch", attempt=0, rank=0, world_size=1, step=1, epoch=0, samples=[0, 1, 2, 3])
    b.write_event("my-trainer.jsonl", "step", attempt=0, rank=0, world_size=1, step=1, loss=1.0, digest="d1")
    b.write_event("zz.jsonl", "end", status="completed", final_step=1)
    history = b.load()
    assert list(history.logs[(0, 0)].steps) == [1]
    assert [ev["kind"] for ev in history.events] == ["end"]


def test_sparse_events_are_ordered_by_time_then_file_then_line(builder):
    b = builder()
    b.write_event("b.jsonl", "prune", t=5.0, attempt=0, checkpoint="x")
    b.write_event("a.jsonl", "prune", t=5.0, attempt=0, checkpoint="y")
    b.write_event("a.jsonl", "prune", t=4.0, attempt=0, checkpoint="z")
    history = b.load()
    assert [ev["checkpoint"] for ev in history.events] == ["z", "y", "x"]


def test_fast_and_reference_paths_load_the_same_history(builder):
    b = builder(total_steps=6, faults=[{"id": "k1", "kind": "kill"}])
    b.attempt(2).train(5, save_every=2).crash(1, "k1")
    b.attempt(2, restore="step-00000004").train(6)
    b.end()
    b.write()
    fast = load_history(b.dir)
    original = loader._ingest_columns, loader._ingest_typed
    loader._ingest_columns = loader._ingest_typed = lambda *args: False  # force the per-event path
    try:
        slow = load_history(b.dir)
    finally:
        loader._ingest_columns, loader._ingest_typed = original
    assert fast.logs == slow.logs
    assert fast.events == slow.events
    assert fast.event_count == slow.event_count


def test_a_file_mixing_ranks_takes_the_reference_path(builder):
    b = builder(total_steps=1)
    for rank in (0, 1):
        b.write_event("one.jsonl", "batch", attempt=0, rank=rank, world_size=2, step=1, epoch=0, samples=[rank])
        b.write_event("one.jsonl", "step", attempt=0, rank=rank, world_size=2, step=1, loss=1.0, digest="d")
    history = b.load()
    assert sorted(history.logs) == [(0, 0), (0, 1)]
    assert list(history.logs[(0, 1)].ids) == [1]


def test_repeated_step_events_are_set_aside(builder):
    b = builder(total_steps=2)
    att = b.attempt(1).train(2)
    att.emit(0, "step", step=2, loss=1.0, digest="other")
    history = b.load()
    assert list(history.logs[(0, 0)].steps) == [1, 2]
    assert [(a, s, r, d) for a, s, r, _, d, _ in history.duplicate_steps] == [(0, 2, 0, "other")]


def test_parallel_loading_builds_the_history_the_sequential_loop_builds(tmp_path, builder, monkeypatch):
    from trainwreck.benchmarks.checker import write_run
    write_run(str(tmp_path / "big"), 300, 4, 2)
    b = builder(total_steps=6, faults=[{"id": "k1", "kind": "kill"}])
    b.attempt(2).train(5, save_every=2).crash(1, "k1")
    b.attempt(4, restore="step-00000004").train(6)
    b.raw_line(b.attempts[1].file(3), '{"kind": "step", "t": 9')  # a torn line
    b.end()
    for run_dir in (tmp_path / "big", b.write()):
        sequential = load_history(run_dir)
        monkeypatch.setattr(loader, "PARALLEL_MIN_BYTES", 0)
        monkeypatch.setattr(loader, "_may_fork", lambda: True)
        used, real = [], loader._load_parallel
        monkeypatch.setattr(loader, "_load_parallel", lambda *a: used.append(real(*a)) or used[-1])
        parallel = load_history(run_dir)
        monkeypatch.undo()
        assert used == [True], "the files were not parsed by the workers"
        assert parallel.notes == sequential.notes and parallel.event_count == sequential.event_count
        assert list(parallel.logs) == list(sequential.logs) and parallel.logs == sequential.logs
        assert parallel.events == sequential.events
        assert judge(parallel).to_json() == judge(sequential).to_json()


def test_parse_workers_die_at_sigterm_and_leave_ctrl_c_to_the_harness(tmp_path, monkeypatch):
    """Pool.terminate's SIGTERM must kill a worker whatever it is doing: the harness's handler,
    inherited through the fork, could miss it just before the worker blocked on the task queue."""
    import os
    import signal

    from trainwreck.benchmarks.checker import write_run
    from trainwreck.harness.supervise.interrupts import stop_on_signals

    write_run(str(tmp_path / "big"), 300, 4, 2)
    seen = tmp_path / "seen"
    seen.mkdir()
    real = loader._worker_signals

    def recording() -> None:
        real()
        dispositions = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
        (seen / str(os.getpid())).write_text(json.dumps([int(d) for d in dispositions]))

    monkeypatch.setattr(loader, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(loader, "_may_fork", lambda: True)
    monkeypatch.setattr(loader, "_worker_signals", recording)
    with stop_on_signals():  # as under `trainwreck report`: the handlers the workers inherit
        load_history(tmp_path / "big")
    workers = {int(p.name): json.loads(p.read_text()) for p in seen.iterdir()}
    assert len(workers) == loader.WORKERS
    assert all(d == [int(signal.SIG_DFL), int(signal.SIG_IGN)] for d in workers.values()), workers
    for pid in workers:  # ended and reaped by the pool's own join, not left for a signal
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_ranks_that_report_alike_share_columns_and_a_rank_that_grows_later_copies_first(builder):
    # Files load in name order: rank 0, then rank 1's first file (equal to rank 0's so far:
    # its columns become rank 0's objects), then rank 1's second file, which must not grow
    # rank 0's columns through them.
    b = builder(total_steps=3)
    for file, rank, steps in (("a.jsonl", 0, (1, 2)), ("b.jsonl", 1, (1, 2)), ("c.jsonl", 1, (3,))):
        for step in steps:
            common = {"attempt": 0, "rank": rank, "world_size": 2, "step": step}
            b.write_event(file, "batch", epoch=0, samples=[2 * step + rank], **common)
            b.write_event(file, "step", loss=1.0 / step, digest=f"state-{step}", **common)
    b.write()
    history = load_history(b.dir)
    zero, one = history.logs[(0, 0)], history.logs[(0, 1)]
    assert list(zero.steps) == [1, 2] and list(zero.digests) == ["state-1", "state-2"] and list(zero.offsets) == [0, 1, 2]
    assert list(one.steps) == [1, 2, 3] and list(one.digests) == ["state-1", "state-2", "state-3"]
    assert list(one.ids) == [3, 5, 7] and list(one.offsets) == [0, 1, 2, 3]
    two = builder("two", total_steps=2)
    for rank in (0, 1):
        for step in (1, 2):
            common = {"attempt": 0, "rank": rank, "world_size": 2, "step": step}
            two.write_event(f"r{rank}.jsonl", "batch", epoch=0, samples=[2 * step + rank], **common)
            two.write_event(f"r{rank}.jsonl", "step", loss=0.5, digest=f"state-{step}", **common)
    two.write()
    shared = load_history(two.dir)
    first, second = shared.logs[(0, 0)], shared.logs[(0, 1)]
    assert all(getattr(first, name) is getattr(second, name) for name in loader._SHAREABLE)
    assert first.ids is not second.ids and list(second.ids) == [3, 5]
    assert "_borrowed" not in vars(first) and "_borrowed" not in vars(second)
