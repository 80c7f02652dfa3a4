"""The trainer's own run.json, for when it runs without the harness (python -m trainer, torchrun)."""
from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.events import FORMAT


class RunDirError(RuntimeError):
    """The run directory cannot be used; the message says why and what to do."""


def run_spec(cfg: TrainConfig, world_sizes: list[int], **extra: Any) -> dict[str, Any]:
    """run.json's contract fields (DESIGN.md) plus the full trainer config."""
    return {
        "format": FORMAT,
        "dataset_size": cfg.dataset_size,
        "global_batch": cfg.global_batch,
        "drop_last": cfg.drop_last,
        "total_steps": cfg.total_steps,
        "hang_timeout_s": extra.pop("hang_timeout_s", None),
        "world_sizes": world_sizes,
        "faults": extra.pop("faults", []),
        "config": cfg.to_dict(),
        **extra,
    }


def ensure_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create run directory {run_dir}: {exc.strerror}; choose another --run-dir") from None
    # A real write, not os.access: root passes every permission check, read-only mounts do not.
    probe = run_dir / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise RunDirError(
            f"run directory {run_dir} is not writable ({exc.strerror}); fix its permissions or choose another --run-dir"
        ) from None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def prepare_standalone(run_dir: Path, cfg: TrainConfig, world_size: int, rank: int,
                       collective_timeout_s: float) -> None:
    """Rank 0 writes run.json once; a later attempt (torchrun restart) must match it."""
    ensure_writable(run_dir)
    path = run_dir / "run.json"
    refuse_foreign(run_dir)
    if path.exists():
        try:
            existing = json.loads(path.read_text()).get("config")
        except (OSError, ValueError) as exc:
            raise RunDirError(f"{path} is unreadable ({exc}); use a new --run-dir") from None
        if existing != cfg.to_dict():
            raise RunDirError(
                f"{path} describes a run with another configuration; resume with the same "
                "options or use a new --run-dir")
        return
    if rank == 0:
        # No watchdog supervises a standalone run: the collective timeout is its hang bound.
        write_json_atomic(path, run_spec(cfg, [world_size], launcher="standalone",
                                         hang_timeout_s=collective_timeout_s))


def refuse_foreign(run_dir: Path) -> None:
    """A directory with checkpoints/ or events/ but no run.json was not written by this
    trainer: resuming it would mix its events into ours and load its checkpoints."""
    if (run_dir / "run.json").exists():
        return
    found = [name for name in ("checkpoints", "events") if os.path.lexists(run_dir / name)]
    if found:
        raise RunDirError(
            f"--run-dir {run_dir} holds {' and '.join(found)}/ but no run.json, so it is not a "
            "trainwreck run directory; choose an empty or new --run-dir")


_EVENT_FILE = re.compile(r"^a(\d{3})-r\d{3}-p\d+\.jsonl$")
ATTEMPTS_FILE = ".attempts.json"
"""Invocation -> its first attempt number, so every rank of one invocation agrees."""


def next_attempt(run_dir: Path) -> int:
    """One past the highest attempt with an event file; 0 for a new run directory."""
    used = [int(m.group(1)) for name in _listdir(run_dir / "events") if (m := _EVENT_FILE.match(name))]
    return max(used) + 1 if used else 0


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def standalone_attempt(run_dir: Path, restart_count: int, invocation: str | None) -> int:
    """The attempt number of a standalone rank: each new invocation in the same run
    directory continues after the attempts already logged, and torchrun restarts count
    up from there.

    `invocation` names one launcher process (None for a lone `python -m trainer`). Its
    ranks start at different times, and one may already have written attempt N's event
    file when another looks; so the first rank of an invocation records its base under
    a lock, and the others (and later restarts) read it back."""
    if invocation is None:
        return next_attempt(run_dir) + restart_count
    ensure_writable(run_dir)
    with open(run_dir / ".attempts.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        path = run_dir / ATTEMPTS_FILE
        try:
            bases = json.loads(path.read_text())
        except (OSError, ValueError):
            bases = {}
        if not isinstance(bases, dict) or not isinstance(bases.get(invocation), int):
            bases = bases if isinstance(bases, dict) else {}
            bases[invocation] = max(0, next_attempt(run_dir) - restart_count)
            write_json_atomic(path, bases)
        return bases[invocation] + restart_count


def launcher_identity() -> str:
    """The parent process (torchrun's agent, shared by its workers and all their restarts)
    by pid and start time, so a reused pid is a different invocation."""
    ppid = os.getppid()
    try:
        start = open(f"/proc/{ppid}/stat").read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{ppid}@{start}"
