"""Property (issue 24): random hostile run directories never make `trainwreck check`,
`trainwreck report` or a resume's checkpoint selection write outside the run directory,
block, exceed a memory bound, or print a traceback.

Hypothesis plants hazards (a FIFO, a link to a file or folder outside, a 2 GiB sparse file,
garbage, an empty file, a folder, a file without permissions) at the paths check, the report
and the checkpoint store read or write: run.json, events/ and its files (the checkers'
streaming loader, invariants/loader.py and files.py), stacks, verdicts.json, report/,
checkpoints/. The report and the resume run in a worker thread with a deadline
(tests/hostile.py), so a blocked open fails the example; `check` runs as its own process
(as a user runs it), killed at the deadline, its address space capped at the memory bound."""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile import DEADLINE_S, within_deadline
from tests.report.rundirs import hung_run
from tests.trainer.test_checkpoint_store import IDENTITY, make_store, save_steps
from trainwreck.harness.cli import main as trainwreck
from trainwreck.trainer.checkpoint import CheckpointStore
from trainwreck.rundir.events import EventLog
from trainwreck.trainer.hooks import NoHooks
from trainwreck.rundir.layout import RunDirError, make_subdirs
from trainwreck.trainer.storage import LocalStorage

TARGETS = ["run.json", "events", "events/a000-r000-p0.jsonl", "events/harness.jsonl", "events/a001-r002-p9.jsonl",
           "stacks/a000-r001-p1.txt", "stacks", "verdicts.json", "report", "report/report.md.tmp",
           "report/report.json", "checkpoints", "checkpoints/latest", "checkpoints/latest.tmp",
           "checkpoints/step-00000008", "checkpoints/step-00000008/model.pt",
           "checkpoints/step-00000008/manifest.json", "checkpoints/.tmp-step-00000012-1", "logs/a000-r001.log"]
HAZARDS = ["fifo", "link_to_file", "link_to_folder", "sparse_giant", "garbage", "empty", "folder", "no_permission"]
MEMORY_BOUND = 512 << 20
"""Bytes the peak resident size may grow by over one example (the giant is 2 GiB); for
`check`'s own process, its whole address space (RLIMIT_AS)."""


def plant(run: Path, outside: Path, target: str, hazard: str) -> None:
    path = run / target
    if any(p.is_symlink() or (os.path.lexists(p) and not p.is_dir()) for p in path.parents if run in p.parents):
        return  # an earlier hazard replaced a folder above it
    if os.path.lexists(path):
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if hazard == "fifo":
        os.mkfifo(path)
    elif hazard == "link_to_file":
        path.symlink_to(outside / "victim.txt")
    elif hazard == "link_to_folder":
        path.symlink_to(outside / "folder")
    elif hazard == "sparse_giant":
        with open(path, "wb") as file:
            file.truncate(2 << 30)
    elif hazard == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"" if hazard == "empty" else b"\x00\xff{not json\n" * 64)
        if hazard == "no_permission":
            path.chmod(0)


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def report_quietly(run: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = trainwreck(["report", str(run)])
    return code, err.getvalue()


def check_process(run: Path, logs: Path) -> tuple[int, str]:
    """`trainwreck check RUN --json` in its own process, its address space capped at
    MEMORY_BOUND (an unbounded read dies there: a MemoryError traceback or a signal, both
    failures below): (exit code, stderr). Fails the example at the deadline (a blocked open).
    The cap, not the child's ru_maxrss: Linux carries the forking parent's peak (this
    pytest process, torch loaded) into the child's, so that figure would measure us."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))

    out, err = logs / "check.out", logs / "check.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "trainwreck.harness.cli", "check", str(run), "--json"],
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, preexec_fn=cap)
    try:
        code = proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"trainwreck check still running after {DEADLINE_S} s (a FIFO or device was waited on)")
    return code, err.read_text(errors="replace")


def resume_selection(run: Path) -> None:
    """What a resume does first: check the run directory's folders (harness/supervise/create_rundir.py), then
    rank 0 chooses a checkpoint and clears stale leftovers."""
    try:
        make_subdirs(run)
    except RunDirError:
        return  # a folder of the run directory is a link or not a folder: the resume refuses it
    try:
        storage = LocalStorage(run / "checkpoints", within=run)
    except OSError:
        return  # checkpoints/ leads outside the run directory: the trainer refuses it
    events = EventLog(run / "events" / "a009-r000-p1.jsonl", attempt=9, rank=0, world_size=1)
    store = CheckpointStore(storage, events, NoHooks(), keep_last=3)
    store.select(IDENTITY)
    store.remove_stale()


def check_one(plan: list[tuple[str, str]]) -> None:
    base = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        run, outside = hung_run(base / "run"), base / "outside"
        (outside / "folder").mkdir(parents=True)
        (outside / "victim.txt").write_text("must survive")
        save_steps(make_store(run), 4, 8)
        for target, hazard in plan:
            plant(run, outside, target, hazard)
        before, peak = snapshot(outside), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        (base / "logs").mkdir()
        code, err = check_process(run, base / "logs")
        assert code in (0, 1, 2) and "Traceback" not in err, (code, err)
        code, err = within_deadline(lambda: report_quietly(run))
        assert code in (0, 1, 2) and "Traceback" not in err, err
        assert len(err.strip().splitlines()) <= 1, err
        within_deadline(lambda: resume_selection(run))
        assert snapshot(outside) == before, "something outside the run directory changed"
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak
        assert grown < MEMORY_BOUND, f"peak memory grew by {grown} bytes"
    finally:
        for path in base.rglob("*"):
            if not path.is_symlink():
                path.chmod(0o700)
        shutil.rmtree(base)


PLANS = st.lists(st.tuples(st.sampled_from(TARGETS), st.sampled_from(HAZARDS)), min_size=1, max_size=4)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PLANS)
def test_hostile_run_directories_never_make_report_or_resume_escape_block_or_crash(plan: list[tuple[str, str]]) -> None:
    check_one(plan)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PLANS)
def test_many_hostile_run_directories_never_make_report_or_resume_escape_block_or_crash(
        plan: list[tuple[str, str]]) -> None:
    check_one(plan)
