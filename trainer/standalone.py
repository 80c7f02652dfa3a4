"""The trainer's own run.json, for when it runs without the harness (python -m trainwreck.trainer,
torchrun): rank 0 writes it once from the trainer's config, a restart must match it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwreck.rundir.events import FORMAT
from trainwreck.rundir.layout import RunDir, RunDirError, ensure_writable, read_run_json, refuse_foreign, write_json_atomic
from trainwreck.trainer.config import TrainConfig


def run_json_fields(cfg: TrainConfig, world_sizes: list[int], **extra: Any) -> dict[str, Any]:
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



def prepare_standalone(run_dir: Path, cfg: TrainConfig, world_size: int, rank: int,
                       collective_timeout_s: float) -> None:
    """Rank 0 writes run.json once; a later attempt (torchrun restart) must match it."""
    ensure_writable(run_dir)
    path = RunDir(run_dir).run_json
    refuse_foreign(run_dir)
    if path.exists():
        existing = read_run_json(run_dir).get("config")
        if existing != cfg.to_dict():
            raise RunDirError(
                f"{path} describes a run with another configuration; resume with the same "
                "options or use a new --run-dir")
        return
    if rank == 0:
        # No watchdog supervises a standalone run: the collective timeout is its hang bound.
        write_json_atomic(path, run_json_fields(cfg, [world_size], launcher="standalone",
                                                hang_timeout_s=collective_timeout_s))
