"""`check` on hostile or unfinished run directories (issue 24, items 3, 4, 10 and 11 as
the checker reads): never blocks, never reads without a bound, never follows a symlink
out of the run directory, says UNKNOWN for a run that has not ended, reads JSON null as
an absent field and orders harness damage by its time."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from histories import HistoryBuilder

from trainwreck.invariants import check_atomicity, load_history
from trainwreck.invariants import loader
from trainwreck.invariants.cli import main

# A guard against a hang, not a timing: a correct `check` answers in about a second.
GUARD_S = 60
MEMORY_LIMIT = 1 << 30


def valid_run(b: HistoryBuilder) -> HistoryBuilder:
    b.attempt(2).train(4, save_every=2)
    b.end(final_step=4)
    return b


def check_in_child(run_dir: Path) -> subprocess.CompletedProcess[str]:
    """`python -m trainwreck.invariants RUN_DIR --json` under a 1 GiB address-space limit."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    return subprocess.run([sys.executable, "-m", "trainwreck.invariants", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=GUARD_S, preexec_fn=limit, check=False)


def test_the_untouched_run_is_valid_in_a_child_under_the_memory_limit(builder):
    done = check_in_child(valid_run(builder(total_steps=4)).write())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["valid"] is True


@pytest.mark.parametrize("name", ["run.json", "events/a000-r000-p4000.jsonl"])
def test_a_fifo_where_a_file_is_expected_is_refused_without_blocking(builder, name):
    run_dir = valid_run(builder(total_steps=4)).write()
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    done = check_in_child(run_dir)
    assert done.returncode == 2, done.stderr
    assert f"{name}: not a regular file (a FIFO)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["run.json", "events/a000-r000-p4000.jsonl", "events/zzz.jsonl"])
def test_dev_zero_behind_a_symlink_is_refused_as_leaving_the_run_directory(builder, name):
    run_dir = valid_run(builder(total_steps=4)).write()
    if (run_dir / name).exists():
        (run_dir / name).unlink()
    (run_dir / name).symlink_to("/dev/zero")
    done = check_in_child(run_dir)
    assert done.returncode == 2, done.stderr
    assert f"{name}: a symlink leading out of the run directory (to /dev/zero)" in done.stderr


def test_a_symlink_to_a_regular_file_outside_the_run_directory_is_refused(builder, tmp_path):
    run_dir = valid_run(builder(total_steps=4)).write()
    outside = tmp_path / "outside.jsonl"
    (run_dir / "events" / "a000-r000-p4000.jsonl").rename(outside)
    (run_dir / "events" / "a000-r000-p4000.jsonl").symlink_to(outside)
    with pytest.raises(loader.InputError, match="a symlink leading out of the run directory"):
        load_history(run_dir)


def test_a_symlink_inside_the_run_directory_is_read(builder):
    run_dir = valid_run(builder(total_steps=4)).write()
    events = run_dir / "events"
    (events / "a000-r000-p4000.jsonl").rename(run_dir / "kept.jsonl")
    (events / "a000-r000-p4000.jsonl").symlink_to(run_dir / "kept.jsonl")
    assert load_history(run_dir).logs[(0, 0)].steps


def test_a_run_json_larger_than_its_bound_is_refused_unread(builder, monkeypatch):
    run_dir = valid_run(builder(total_steps=4)).write()
    monkeypatch.setattr(loader, "MAX_SPEC_BYTES", 64)
    with pytest.raises(loader.InputError, match=r"run.json: larger than 64 bytes"):
        load_history(run_dir)


@pytest.mark.readers_may_differ  # the reference reader would read the 2 GiB whole: the bug fixed here
def test_a_two_gib_nul_tail_is_a_torn_last_line_judged_in_bounded_memory(builder):
    run_dir = valid_run(builder(total_steps=4)).write()
    path = run_dir / "events" / "a000-r000-p4000.jsonl"
    with open(path, "ab") as f:
        f.truncate(path.stat().st_size + (2 << 30))  # a sparse tail of NULs, as a crashed filesystem leaves
    done = check_in_child(run_dir)
    assert done.returncode == 0, done.stderr
    notes = json.loads(done.stdout)["notes"]
    assert any("skipped a torn last line (2147483648 bytes" in note for note in notes), notes


def test_an_overlong_line_in_the_middle_names_its_line(builder, monkeypatch):
    b = valid_run(builder(total_steps=4))
    b.files[b.attempts[0].file(0)].insert(2, '{"kind": "note", "t": 1.0, "pad": "' + "x" * 5000 + '"}')
    monkeypatch.setattr(loader, "MAX_LINE", 1000)
    monkeypatch.setattr(loader, "BLOCK", 512)
    with pytest.raises(loader.InputError, match=r"a000-r000-p4000\.jsonl line 3: a line longer than 1000 bytes"):
        b.load()


def test_small_blocks_load_the_same_history_as_one_block(builder, monkeypatch):
    b = valid_run(builder(total_steps=4))
    b.raw_line(b.attempts[0].file(1), '{"kind": "step", "t": 9')  # torn
    whole = b.load()
    monkeypatch.setattr(loader, "BLOCK", 64)
    small = b.load()
    assert small.notes == whole.notes and small.event_count == whole.event_count
    assert {k: vars(v) for k, v in small.logs.items()} == {k: vars(v) for k, v in whole.logs.items()}
    assert small.events == whole.events


def test_a_killed_run_without_an_end_event_is_unknown_not_invalid(builder, capsys):
    b = builder(total_steps=4)
    b.attempt(2).train(2, save_every=2).crash(1)  # the harness died with its job: no end event
    code = main([str(b.write())])
    out = capsys.readouterr().out
    assert code == 2, out
    assert re.search(r"UNKNOWN +progress +no end event: the job is still running or was killed", out), out


def test_json_null_in_an_optional_field_means_the_field_is_absent(builder):
    b = builder(total_steps=8, faults=[{"id": "c1", "kind": "corrupt"}])
    b.attempt(2).train(5, save_every=2).crash(1)
    b.harness("fault", fault_id="c1", attempt=None, rank=None, checkpoint="step-00000004", detail="flipped")
    b.attempt(2, restore="step-00000002", rejects=("step-00000004",)).train(8)
    history = b.load()
    fault = history.of_kind("fault")[0]
    assert fault["attempt"] == 1  # placed by its time, as if the field were left out
    assert check_atomicity(history).valid is True


def test_damage_naming_the_attempt_that_ended_is_placed_by_its_time(builder):
    b = builder(total_steps=8, faults=[{"id": "c1", "kind": "corrupt"}])
    b.attempt(2).train(5, save_every=2).crash(1)
    b.corrupt("c1", "step-00000004", attempt=0)  # names the attempt that ended, not the one it affects
    b.attempt(2, restore="step-00000002", rejects=("step-00000004",)).train(8)
    verdict = check_atomicity(b.load())
    assert verdict.valid is True, verdict
    assert verdict.counts["rejects_required"] == 1
