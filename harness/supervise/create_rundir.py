"""Run directories (format ``trainwreck-run/1``): create one and write its run.json."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.rundir.layout import RunDir, RunDirError, foreign_leftovers, make_subdirs, write_json_atomic

HANG_SLACK_S = 1.0
"""Stated slack for hang detection: a hang is reported within hang_timeout_s + this."""
TEMP_PREFIX = "trainwreck-run-"
"""Prefix of temporary run directories (tests look for leftovers by it)."""

__all__ = ["HANG_SLACK_S", "RunDirError", "check_out_dir", "check_run_dir", "create_run_dir", "run_json"]


def run_json(spec: JobSpec) -> dict[str, Any]:
    """The DESIGN fields of run.json the target knows (harness/supervise/spec.py: the reference
    trainer's config; a --cmd job's trainer adds the dataset fields itself, Probe.write_run_json)
    plus the extras the ranks and the report need: how to rebuild the job, the policy the judge may quote."""
    return spec.target.run_json(spec, {
        "max_restarts": spec.max_restarts, "launcher": spec.launcher, "hang_slack_s": HANG_SLACK_S,
        "checkpoint_timeout_s": spec.checkpoint_budget_s, "startup_timeout_s": spec.startup_budget_s,
        "exit_timeout_s": spec.exit_budget_s, "host": host()})


def host() -> dict[str, Any]:
    """The machine the ranks share, measured when the run starts: a report that compares rates at two
    world sizes must know whether the ranks outnumbered the cores (then a rate measures the sharing)."""
    try:
        cpus = len(os.sched_getaffinity(0))  # the cores this process may use, not the machine's
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return {"cpus": cpus, "load_average_1m": round(os.getloadavg()[0], 2)}


def check_run_dir(path: Path) -> None:
    """Refuse a directory that already holds a run, ours or a foreign one (before anything is written).

    A directory with events/ or checkpoints/ but no run.json would otherwise be resumed:
    its checkpoints restored and its events mixed into this run's history."""
    path = Path(path)
    if RunDir(path).run_json.exists():
        raise RunDirError(
            f"{path} already holds a run (run.json exists); pick another --out or remove it")
    leftovers = foreign_leftovers(path)
    if leftovers:
        raise RunDirError(f"{path} holds {' and '.join(leftovers)}/ of some other run but no run.json; "
                          "pick another --out or remove it")


def check_out_dir(path: Path) -> Path:
    """The --out of every command, checked before anything runs: absent or an empty
    directory, not under a file, and writable. Nothing is created."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--out {path} is an existing file; give a directory path that does not exist yet")
    if path.is_dir() and any(path.iterdir()):
        raise RunDirError(f"--out {path} is not empty; pick another --out (new or empty)")
    parent = path.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise RunDirError(f"--out {path} lies under {parent}, which is a file; give a directory path")
    # Trying is the only honest writability test (see create_run_dir).
    try:
        with tempfile.TemporaryFile(dir=parent, prefix=".trainwreck-write-probe-"):
            pass
    except OSError as exc:
        raise RunDirError(f"--out {path} cannot be written ({exc.strerror} in {parent}); "
                          "pick another --out or fix its permissions") from None
    return path


def create_run_dir(spec: JobSpec, resume: bool = False) -> Path:
    """Create the run directory of `spec` (a fresh temporary one when spec.run_dir is None);
    `resume`: spec.run_dir holds what an earlier job left (checkpoints, events), continued as is."""
    if spec.run_dir is None:
        path = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    else:
        # Absolute: the fork server that ranks come from may have another working directory.
        path = spec.run_dir.absolute()
        if not resume:
            check_run_dir(path)
        # Trying is the only honest writability test: os.access says yes to root on a
        # read-only mount, and permissions can change between a check and the write.
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".trainwreck-write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise RunDirError(
                f"run directory {path} is not writable ({exc.strerror}); "
                "pick another --out or fix its permissions") from None
    paths = RunDir(path)
    make_subdirs(path)
    write_json_atomic(paths.run_json, run_json(spec))
    return path

