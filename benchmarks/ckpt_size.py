"""What one checkpoint of the reference trainer weighs on disk and costs to write, measured.

"How often should you checkpoint, given storage spend and a recovery point objective?" needs the size of
a save. This job builds the reference trainer's state for the 2.1 M-parameter model the handbook's byte
measurements use (benchmarks/fsdp.py SPEC), runs one real AdamW update so the optimizer holds its two
moments, and saves it the way the trainer does: trainer/state.py `training_files` (model, optimizer,
scheduler, trainer position, RNG) through trainer/checkpoint.py's atomic CheckpointStore on local disk.
It reports the bytes of the committed checkpoint directory (its files and manifest, as listed on disk),
the bytes per parameter, and the median save time of a few saves. The spend arithmetic (saves per day,
a price per GB-month) is the handbook's to do, labelled there as assumed.

    python -m trainwreck.benchmarks.ckpt_size   # one JSON object
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainwreck.benchmarks.fsdp import SPEC
from trainwreck.trainer.checkpoint import CheckpointStore, checkpoint_name
from trainwreck.trainer.data import SyntheticDataset
from trainwreck.rundir.events import EventLog
from trainwreck.trainer.hooks import NoHooks
from trainwreck.trainer.state import capture_rng, checkpoint_meta, fresh_state, training_files
from trainwreck.trainer.storage import LocalStorage

SAVES = 3
"""Saves timed; the median is kept (the first one also creates the directory)."""


def _dir_bytes(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


def measure(saves: int = SAVES) -> dict[str, Any]:
    torch.set_num_threads(1)
    state = fresh_state(SPEC, torch.device("cpu"))
    data = SyntheticDataset(SPEC.seed, SPEC.dataset_size, SPEC.input_dim, SPEC.num_classes)
    ids = torch.arange(SPEC.global_batch)
    x, y = data.batch(ids)
    F.cross_entropy(state.model(x, ids, 0), y).backward()  # one real update: AdamW's moments now exist
    state.optimizer.step()
    state.scheduler.step()
    state.step = 1
    numel = sum(p.numel() for p in state.model.parameters())
    with tempfile.TemporaryDirectory(prefix="trainwreck-ckpt-size-") as tmp:
        root = Path(tmp)
        store = CheckpointStore(LocalStorage(root / "ckpt"), EventLog(root / "events.jsonl"), NoHooks(), keep_last=1)
        seconds = []
        for step in range(1, saves + 1):
            files = training_files(state, {"epoch": 0, "consumed": step * SPEC.global_batch}, [capture_rng()],
                                   "ckpt-size")
            started = time.perf_counter()
            store.save(step, files, checkpoint_meta(1, "ckpt-size", "", 0))
            seconds.append(time.perf_counter() - started)
        files_bytes = _dir_bytes(root / "ckpt" / checkpoint_name(saves))
    total = sum(files_bytes.values())
    return {"model": "benchmarks/fsdp.py SPEC (reference MLP, width 1024, depth 3)", "numel": numel,
            "optimizer": "AdamW", "dtype": "float32", "files": files_bytes, "save_bytes": total,
            "save_bytes_per_param": total / numel, "saves": saves, "save_s": statistics.median(seconds),
            "save_s_all": seconds, "write_bytes_per_s": total / statistics.median(seconds),
            "storage": "local disk, atomic CheckpointStore (fsync, manifest, rename, pointer)",
            "cores": os.cpu_count()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.ckpt_size",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=SAVES)
    args = parser.parse_args(argv)
    print(json.dumps(measure(max(1, args.saves)), indent=1))


if __name__ == "__main__":
    main()
