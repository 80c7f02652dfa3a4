"""One rule for the attempt number a run directory continues with (rundir/layout.py
next_attempt), which both the harness's attempt loop and a standalone rank ask.

The two earlier rules each missed a case the other saw: counting rank event files misses
an attempt the harness started whose ranks all died before opening their files (it then
reused that attempt's number, and its `attempt`/`exit` events); counting the harness's
`attempt` events misses a standalone or torchrun rank's attempts (no harness log)."""
from __future__ import annotations

import json
from pathlib import Path

from trainwreck.rundir.layout import next_attempt


def harness_log(run_dir: Path, *attempts: int) -> None:
    (run_dir / "events").mkdir(exist_ok=True)
    (run_dir / "events" / "harness.jsonl").write_text(
        "".join(json.dumps({"kind": "attempt", "attempt": a, "t": float(a)}) + "\n" for a in attempts))


def rank_file(run_dir: Path, attempt: int, rank: int = 0) -> None:
    (run_dir / "events").mkdir(exist_ok=True)
    (run_dir / "events" / f"a{attempt:03d}-r{rank:03d}-p{100 + rank}.jsonl").write_text("")


def test_a_new_run_directory_starts_at_attempt_0(tmp_path: Path) -> None:
    assert next_attempt(tmp_path) == 0


def test_an_attempt_the_harness_started_counts_even_when_no_rank_wrote_a_file(tmp_path: Path) -> None:
    rank_file(tmp_path, 0)
    harness_log(tmp_path, 0, 1)  # attempt 1's ranks died at start-up
    assert next_attempt(tmp_path) == 2


def test_a_standalone_ranks_attempts_count_without_a_harness_log(tmp_path: Path) -> None:
    rank_file(tmp_path, 0)
    rank_file(tmp_path, 1, rank=1)
    assert next_attempt(tmp_path) == 2


def test_a_torn_harness_log_line_is_skipped_not_raised(tmp_path: Path) -> None:
    harness_log(tmp_path, 0)
    with open(tmp_path / "events" / "harness.jsonl", "a") as f:
        f.write('{"kind": "attempt", "att')
    assert next_attempt(tmp_path) == 1
