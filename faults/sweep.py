"""The crash-point sweep's fault side: record every storage operation of one checkpoint
save, and turn each operation into crash points (before it, after it, and torn for a write).
Running and judging each crash point is the harness's job (harness/sweep.py), through the
same run-and-judge path as every other run.

1. Record: replay the job's saves in-process, with the writer's own ``CheckpointStore``,
   on a real trainer state, up to ``CRASH_STEP``, so the recorded save is the job's save
   at that step op for op (including retention pruning the oldest checkpoint).
2. Crash: one job per crash point, through the in-rank ``crash_op`` fault.

Only mutating ops (faults/storage.py MUTATING) are crash points: a crash just before
an ``exists``/``read``/``list`` is the crash just after the previous mutating op.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from trainwreck.faults.plan import CRASH_WHEN
from trainwreck.faults.storage import MUTATING, Op, RecordingStorage
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.storage import LocalStorage, Storage

SWEEP_CONFIG = TrainConfig.tiny(total_steps=20, ckpt_interval=4)
"""keep_last=3 and saves at 4, 8, 12: the save at 16 also prunes step 4, so retention is swept too."""
CRASH_STEP = 16
WORLD_SIZES = (2,)
HANG_TIMEOUT_S = 5.0
"""A crash is never a hang; this only bounds a run that would wrongly hang."""


# ----- 1. recording the save -------------------------------------------------------------


def _pid_free(text: str) -> str:
    """Names of temporary and trash directories end in the writer's pid."""
    return re.sub(r"(\.(?:tmp|trash)-step-\d{8})-\d+", r"\1-PID", text)


def describe(op: Op) -> str:
    return _pid_free(op.describe())


def replay_saves(writer: str, wrap: Callable[[Storage, Path], Storage], before_each: Callable[[Storage], None],
                 step: int = CRASH_STEP, cfg: TrainConfig = SWEEP_CONFIG) -> None:
    """Replay the job's saves up to `step` with the writer's own store on a real trainer state,
    through `wrap(storage, root)`; `before_each(wrapped)` runs before every save (a recorder
    keeps only the last one). The state and the manifest come from the trainer's own functions."""
    import torch

    from trainwreck.trainer.entry import trainer_class
    from trainwreck.trainer.events import EventLog
    from trainwreck.trainer.hooks import NoHooks
    from trainwreck.trainer.rundir import RunDir
    from trainwreck.trainer.sampler import ElasticSampler
    from trainwreck.trainer.state import capture_rng, checkpoint_meta, fresh_state, state_digest, training_files

    cfg = TrainConfig.from_dict({**cfg.to_dict(), "variant": writer})
    state = fresh_state(cfg, torch.device("cpu"))
    sampler = ElasticSampler(cfg.dataset_size, cfg.global_batch, cfg.seed, cfg.drop_last)
    world = WORLD_SIZES[0]
    with tempfile.TemporaryDirectory(prefix="trainwreck-sweep-record-") as tmp:
        paths = RunDir(Path(tmp))
        paths.checkpoints.mkdir()
        events = EventLog(paths.rank_events(0, 0, 0), attempt=0, rank=0, world_size=1)
        storage = wrap(LocalStorage(paths.checkpoints), paths.checkpoints)
        store = trainer_class(writer).store_class(storage, events, NoHooks(), cfg.keep_last)
        for s in [s for s in cfg.save_steps() if s <= step]:
            state.step = s
            files = training_files(state, sampler.state_dict(), [capture_rng(cuda=False)] * world, cfg.identity())
            before_each(storage)
            store.save(s, files, checkpoint_meta(world, cfg.identity(), state_digest(state), 0))
        events.close()


def record_save_ops(writer: str = "reference", cfg: TrainConfig = SWEEP_CONFIG, step: int = CRASH_STEP) -> list[Op]:
    """Every storage op of the writer's save at `step`, after the job's earlier saves."""
    recording: list[RecordingStorage] = []

    def wrap(inner: Storage, root: Path) -> Storage:
        recording.append(RecordingStorage(inner))
        return recording[-1]

    replay_saves(writer, wrap, lambda storage: storage.ops.clear(), step, cfg)  # type: ignore[attr-defined]
    return list(recording[0].ops)


def mutating_ops(ops: list[Op]) -> list[str]:
    """The recorded save's mutating ops, described without pids (the crash points' names)."""
    return [describe(o) for o in ops if o.name in MUTATING]


def crash_points(ops: list[Op]) -> list[tuple[int, str, str]]:
    """(op_index, op description, when) for every mutating op: before, after, and torn for writes."""
    points = []
    for index, op in enumerate(o for o in ops if o.name in MUTATING):
        for when in [w for w in CRASH_WHEN if w != "torn" or op.name == "write"]:
            points.append((index, describe(op), when))
    return points


def crash_plan(op_index: int, when: str) -> list[dict[str, Any]]:
    return [{"id": f"crash-{when}-op{op_index}", "kind": "crash_op", "step": CRASH_STEP,
             "op_index": op_index, "when": when}]
