"""The checker's two readers must judge every run directory alike.

The default reader streams an events file in blocks and builds compact columns
(arrays, shared digests); the reference reader is the per-event standard-library
path over the whole file at once, with every column a plain list, as the checker
read runs before it streamed. A third way keeps every column on disk
(invariants/spill.py), as a run too big for memory is read, in chunks of 3 values with
a cache of two such chunks, so that every column crosses chunk boundaries and the cache evicts.
A fourth judges every integer range through numpy's passes (invariants/vectors.py), as
a long run's are, however short the range.
`assert_readers_agree` judges a run directory all four ways and compares everything a
user sees: verdicts, summaries, counts, evidence, notes, or the input error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainwreck.invariants import InputError, judge, load_history
from trainwreck.invariants import loader, spill, vectors

COLUMNS = ("steps", "losses", "digests", "batch_steps", "epochs", "offsets", "ids")


def _judged(run_dir: Path) -> Any:
    try:
        history = load_history(run_dir)
    except InputError as exc:
        return f"InputError: {exc}"
    return {"judgement": judge(history).to_json(), "events": history.event_count}


def reference_judgement(run_dir: Path) -> Any:
    """Judge with the reference reader: one block per file, per-event path, list columns."""
    events = Path(run_dir) / "events"
    sizes = [p.stat().st_size for p in events.glob("*.jsonl") if p.is_file()] if events.is_dir() else []
    saved = loader.BLOCK, loader._ingest_columns, loader._finish, loader._ingest_typed
    def finish(history: Any, log: Any) -> None:
        saved[2](history, log)
        for name in COLUMNS:
            setattr(log, name, list(getattr(log, name)))
    loader.BLOCK = max(sizes, default=0) + 1
    loader._ingest_columns = lambda *args: False
    loader._ingest_typed = lambda *args: False
    loader._finish = finish
    try:
        return _judged(run_dir)
    finally:
        loader.BLOCK, loader._ingest_columns, loader._finish, loader._ingest_typed = saved


def spilled_judgement(run_dir: Path) -> Any:
    """Judge with every column on disk, in tiny chunks through a tiny cache."""
    saved = spill.SPILL_MIN_BYTES, spill.CHUNK, spill.CACHE_BYTES
    spill.SPILL_MIN_BYTES, spill.CHUNK, spill.CACHE_BYTES = 0, 3, 48  # two chunks of integers
    try:
        try:
            history = load_history(run_dir)
        except InputError as exc:
            return f"InputError: {exc}"
        # A log read out of update order is rebuilt in memory (loader._finish); the others stay on disk.
        assert not history.logs or any(isinstance(getattr(log, c), (spill.DiskNumbers, spill.DiskStrings))
                                       for log in history.logs.values() for c in COLUMNS), "no column on disk"
        return {"judgement": judge(history).to_json(), "events": history.event_count}
    finally:
        spill.SPILL_MIN_BYTES, spill.CHUNK, spill.CACHE_BYTES = saved


def vectorised_judgement(run_dir: Path) -> Any:
    """Judge with numpy's passes over every integer range, however short."""
    saved = vectors.VECTOR_MIN
    vectors.VECTOR_MIN = 0
    try:
        return _judged(run_dir)
    finally:
        vectors.VECTOR_MIN = saved


def assert_readers_agree(run_dir: Path) -> None:
    ours, reference = _judged(run_dir), reference_judgement(run_dir)
    assert ours == reference, f"{run_dir}: the streaming reader judged differently from the reference reader"
    assert spilled_judgement(run_dir) == reference, f"{run_dir}: the reader with columns on disk judged differently"
    assert vectorised_judgement(run_dir) == reference, f"{run_dir}: numpy's passes judged differently"


def run_dirs_under(root: Path) -> list[Path]:
    """Every run directory (a folder holding run.json) under `root`."""
    return sorted(Path(d) for d, _, files in os.walk(root) if "run.json" in files)
