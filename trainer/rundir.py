"""The trainer's own run.json, for when it runs without the harness (python -m trainer, torchrun)."""
from __future__ import annotations

import json
import os
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
