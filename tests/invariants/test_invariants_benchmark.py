"""The checker benchmark runs and reports its figures (tiny size: this is not the
measurement), and the loader's orjson fast path reads exactly what the stdlib
reference path reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainwreck.benchmarks.checker import bench_checker, write_run
from trainwreck.invariants import InputError, judge, load_history
from trainwreck.invariants import loader
from trainwreck.invariants.history import History


def test_bench_checker_reports_events_rate_cpu_and_peak_memory():
    result = bench_checker(steps=200, ranks=2, batch_per_rank=2)
    assert set(result) == {"checker_events", "checker_seconds", "checker_events_per_s", "checker_cpu_seconds",
                           "checker_events_per_cpu_s", "checker_peak_rss_mb", "checker_worker_peak_rss_mb"}
    assert result["checker_events"] > 800
    assert result["checker_peak_rss_mb"] > 0


def _snapshot(history: History) -> dict[str, Any]:
    logs = {key: (log.world_size, log.steps, log.losses, log.digests, log.batch_steps, log.epochs, log.ids,
                  log.offsets, log.first_pos) for key, log in history.logs.items()}
    return {"logs": logs, "events": history.events, "notes": history.notes, "count": history.event_count}


def test_the_orjson_fast_path_loads_the_same_history_as_the_stdlib_reference(tmp_path: Path, monkeypatch):
    write_run(str(tmp_path), steps=300, ranks=3, batch_per_rank=2)
    monkeypatch.setattr(loader, "_ingest_typed", lambda *args: False)  # the orjson path, msgspec or not
    calls: list[int] = []
    fast = loader._parse_fast
    monkeypatch.setattr(loader, "_parse_fast", lambda data: calls.append(1) or fast(data))
    with_orjson = _snapshot(load_history(tmp_path))
    assert calls, "the fast path was never tried"
    monkeypatch.setattr(loader, "_parse_fast", lambda data: None)
    reference = _snapshot(load_history(tmp_path))
    assert with_orjson == reference and reference["count"] > 1000


def _one_rank_run(tmp_path: Path, step_line: str) -> Path:
    write_run(str(tmp_path), steps=100, ranks=1, batch_per_rank=2)
    rank_file = sorted((tmp_path / "events").glob("a000-r000-*.jsonl"))[0]
    with open(rank_file, "a") as f:
        f.write(step_line + "\n")
    return tmp_path


def test_an_integer_beyond_64_bits_is_judged_by_the_reference_path_not_as_an_orjson_float(tmp_path: Path):
    # orjson would read 2**64 as 1.8446744073709552e+19; the error must name the integer as written.
    run = _one_rank_run(tmp_path, '{"kind": "save", "t": 1.0, "attempt": 0, "step": 18446744073709551616, '
                                  '"checkpoint": "step-x"}')
    with pytest.raises(InputError, match="field 'step'.*18446744073709551616"):
        load_history(run)


def test_the_msgspec_typed_path_loads_the_same_history_as_the_stdlib_reference(tmp_path: Path, monkeypatch):
    pytest.importorskip("msgspec")
    write_run(str(tmp_path), steps=300, ranks=3, batch_per_rank=2)
    taken: list[tuple[bool, bool]] = []  # (the block holds bulk events, the typed path read it)
    typed = loader._ingest_typed
    monkeypatch.setattr(loader, "_ingest_typed",
                        lambda h, data, *rest: taken.append((b'"step"' in data, typed(h, data, *rest))) or taken[-1][1])
    with_msgspec = _snapshot(load_history(tmp_path))
    assert taken and all(read for bulk, read in taken if bulk), "the typed path should read every rank's block"
    monkeypatch.setattr(loader, "_ingest_typed", lambda *args: False)
    monkeypatch.setattr(loader, "_parse_fast", lambda data: None)
    reference = _snapshot(load_history(tmp_path))
    assert with_msgspec == reference and reference["count"] > 1000


@pytest.mark.parametrize("line", [
    '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 1, "step": 75, "loss": 1, "digest": "d", "kind": "save"}',
    '{"kind": "step", "t": true, "attempt": 0, "rank": 0, "world_size": 1, "step": 75}',
    '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 1, "step": 75.0}',
    '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 1, "step": -1}',
    '{"kind": "step", "t": 1e301, "attempt": 0, "rank": 0, "world_size": 1, "step": 75}',
    '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 1, "step": 75, "step": 18446744073709551616}',
    '{"kind": "batch", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 1, "step": 75, "epoch": 0, "samples": [1, false]}',
    '{"kind": "note", "t": 2.0}',
    '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 1, "step": 75, "loss": 18446744073709551616}',
    # With every field present, so that the orjson path (msgspec refusing) must decide too:
    '{"kind": "step", "t": 1e301, "attempt": 0, "rank": 0, "world_size": 1, "step": 75, "loss": 1.0, "digest": "x"}',
    '{"kind": "step", "t": 2.0, "attempt": 0.0, "rank": 0, "world_size": 1, "step": 75, "loss": 1.0, "digest": "x"}',
    '{"kind": "step", "t": 2.0, "attempt": false, "rank": 0, "world_size": 1, "step": 75, "loss": 1.0, "digest": "x"}',
    '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 1.0, "step": 75, "loss": 1.0, "digest": "x"}',
    # Another process's head in this file (the typed path's decoder holds the block's first head):
    '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 2, "step": 75, "loss": 1.0, "digest": "x"}',
    '{"kind": "batch", "t": 2.0, "attempt": 1, "rank": 0, "world_size": 1, "step": 75, "epoch": 0, "samples": [1, 2]}',
    '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 1, "world_size": 1, "step": 75, "loss": 1.0, "digest": "x"}',
])
@pytest.mark.parametrize("typed", [True, False], ids=["msgspec", "orjson"])
def test_lines_the_fast_paths_refuse_or_read_are_judged_as_the_reference_path_judges_them(
        tmp_path: Path, monkeypatch, line: str, typed: bool):
    from readers import reference_judgement
    run = _one_rank_run(tmp_path, line)
    if not typed:
        monkeypatch.setattr(loader, "_ingest_typed", lambda *args: False)
    try:
        ours: Any = {"judgement": judge(load_history(run)).to_json(), "events": load_history(run).event_count}
    except InputError as exc:
        ours = f"InputError: {exc}"
    monkeypatch.undo()
    assert ours == reference_judgement(run)


def test_a_file_the_fast_path_refuses_still_loads_through_the_reference_path(tmp_path: Path, monkeypatch):
    run = _one_rank_run(tmp_path, '{"kind": "step", "t": 2.0, "attempt": 0, "rank": 0, "world_size": 1, "step": 100')
    refused: list[bool] = []
    fast = loader._parse_fast
    monkeypatch.setattr(loader, "_parse_fast", lambda data: refused.append(fast(data) is None) or fast(data))
    history = load_history(run)
    assert any(refused), "the torn line should have sent a file to the reference path"
    assert any("torn last line" in note for note in history.notes)
    # Attempt 0 of write_run stops before update 75; the torn update-100 line is not read.
    assert history.logs[(0, 0)].steps[-1] == 74


def test_a_block_that_names_its_process_only_past_its_first_lines_is_still_read_by_the_typed_path(
        tmp_path: Path, monkeypatch):
    pytest.importorskip("msgspec")
    write_run(str(tmp_path), steps=60, ranks=1, batch_per_rank=2)
    rank_file = sorted((tmp_path / "events").glob("a000-r000-*.jsonl"))[0]
    lines = rank_file.read_text().splitlines(keepends=True)
    seeds = [f'{{"kind": "seed", "t": 1699999999.0, "n": {n}}}\n' for n in range(loader._HEAD_PROBE + 2)]
    rank_file.write_text("".join(seeds + lines))
    typed, taken = loader._ingest_typed, []
    monkeypatch.setattr(loader, "_ingest_typed", lambda *args: taken.append(typed(*args)) or taken[-1])
    heads = loader._block_head
    monkeypatch.setattr(loader, "_block_head", lambda *args: taken.append(heads(*args)) or taken[-1])
    with_msgspec = _snapshot(load_history(tmp_path))
    assert None in taken and True in taken, "the block should be read by the typed path with no head known"
    monkeypatch.undo()
    monkeypatch.setattr(loader, "_ingest_typed", lambda *args: False)
    monkeypatch.setattr(loader, "_parse_fast", lambda data: None)
    assert with_msgspec == _snapshot(load_history(tmp_path))


def _middle_of(tmp_path: Path, transform: Any) -> Path:
    """A 300-update run whose rank-0 file has four batch and step lines from line 100 on rewritten by
    `transform` (a list of lines in, out). Only batch and step: a save or prune line among them would
    be read again as text, which would find a fault the one-call decoding let through."""
    write_run(str(tmp_path), steps=300, ranks=2, batch_per_rank=2)
    rank_file = sorted((tmp_path / "events").glob("a000-r000-*.jsonl"))[0]
    lines = rank_file.read_text().splitlines()
    at = next(i for i in range(100, len(lines)) if all('"kind": "batch"' in line or '"kind": "step"' in line
                                                       for line in lines[i - 8 : i + 12]))
    rank_file.write_text("\n".join(lines[:at] + transform(lines[at : at + 4]) + lines[at + 4 :]) + "\n")
    return tmp_path


@pytest.mark.parametrize("transform", [
    lambda four: four,  # untouched: decoded in one call
    lambda four: [four[0] + four[1], "", four[2], four[3]],  # two values on a line, and a blank line to even the count
    lambda four: [four[0] + four[1], four[2][:20], four[2][20:], four[3]],  # and a value over two lines
    lambda four: [line + " " for line in four],  # a blank after the value
    lambda four: [line + "\r" for line in four],  # CRLF endings
    lambda four: [four[0], "  " + four[1], four[2], four[3]],
], ids=["clean", "two-values-and-a-blank-line", "two-values-and-a-split-value", "trailing-blank", "crlf",
        "leading-blanks"])
def test_a_block_cut_from_the_middle_of_a_file_is_judged_as_the_reference_path_judges_it(
        tmp_path: Path, monkeypatch, transform: Any):
    pytest.importorskip("msgspec")
    from readers import reference_judgement
    run = _middle_of(tmp_path, transform)
    monkeypatch.setattr(loader, "BLOCK", 4096)  # every file cut into blocks: all but the last are mid-file
    calls: list[bool] = []
    decode = loader._decode_block
    monkeypatch.setattr(loader, "_decode_block", lambda *args: (lambda out: calls.append(out[1] is None) or out)(
        decode(*args)))
    try:
        ours: Any = {"judgement": judge(load_history(run)).to_json(), "events": load_history(run).event_count}
    except InputError as exc:
        ours = f"InputError: {exc}"
    assert True in calls, "no block was decoded in one call"
    monkeypatch.undo()
    assert ours == reference_judgement(run)
