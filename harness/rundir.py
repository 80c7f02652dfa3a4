"""Run directories (format ``trainwreck-run/1``): create one and write its run.json."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from trainwreck.harness.spec import JobSpec, SpecError
from trainwreck.trainer.events import FORMAT
from trainwreck.trainer.rundir import run_spec, write_json_atomic

HANG_SLACK_S = 1.0
"""Stated slack for hang detection: a hang is reported within hang_timeout_s + this."""
TEMP_PREFIX = "trainwreck-run-"
"""Prefix of temporary run directories (tests look for leftovers by it)."""
SUBDIRS = ("events", "checkpoints", "stacks", "progress", "logs")


class RunDirError(SpecError):
    """The run directory cannot be used; the message says why and what to do."""


def run_json(spec: JobSpec) -> dict[str, Any]:
    """The DESIGN fields of run.json (written by the trainer's own helper) plus the
    extras the ranks and the report need: how to rebuild the job, the policy the judge may quote."""
    return run_spec(
        spec.config, list(spec.world_sizes), hang_timeout_s=spec.hang_timeout_s, faults=spec.plan,
        max_restarts=spec.max_restarts, launcher=spec.launcher, hang_slack_s=HANG_SLACK_S,
        checkpoint_timeout_s=spec.checkpoint_budget_s, startup_timeout_s=spec.startup_budget_s,
        entry=spec.entry, hooks_factory=spec.hooks_factory)


def check_run_dir(path: Path) -> None:
    """Refuse a directory that already holds a run (before anything is written)."""
    if (Path(path) / "run.json").exists():
        raise RunDirError(
            f"{path} already holds a run (run.json exists); pick another --out or remove it")


def create_run_dir(spec: JobSpec) -> Path:
    """Create the run directory of `spec` (a fresh temporary one when spec.run_dir is None)."""
    if spec.run_dir is None:
        path = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    else:
        # Absolute: the fork server that ranks come from may have another working directory.
        path = spec.run_dir.absolute()
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
    for name in SUBDIRS:
        (path / name).mkdir(exist_ok=True)
    write_json_atomic(path / "run.json", run_json(spec))
    return path


def read_run_json(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "run.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunDirError(f"{run_dir} has no run.json: is it a trainwreck run directory?") from None
    if data.get("format") != FORMAT:
        raise RunDirError(f"{path}: format {data.get('format')!r} is not {FORMAT!r}")
    return data
