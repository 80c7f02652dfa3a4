"""The crash-point sweep's fault side: record every storage operation of one checkpoint
save, and turn each operation into crash points (before it, after it, and torn for a write).
Running and judging each crash point is the harness's job (harness/suites/sweep.py), through the
same run-and-judge path as every other run.

1. Record: replay the job's saves in-process, with the writer's own ``CheckpointStore``,
   on a real trainer state, up to ``CRASH_STEP``, so the recorded save is the job's save
   at that step op for op (including retention pruning the oldest checkpoint).
2. Crash: one job per crash point, through the in-rank ``crash_op`` fault.

Only mutating ops (faults/storage.py MUTATING) are crash points: a crash just before
an ``exists``/``read``/``list`` is the crash just after the previous mutating op.

A sharded (FSDP) save has a writer in every rank, so it cannot be replayed in one
process: one clean job runs with ``sharded_recording_hooks``, which record each rank's
own mutating ops of the save at ``CRASH_STEP`` (its shard file, DCP's ``.metadata``
write and rename on rank 0, trainwreck's manifest and commit), and each of those ops of
each rank becomes crash points of that rank.
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from trainwreck.faults.plan import CRASH_WHEN
from trainwreck.faults.storage import MUTATING, Op, RecordingStorage, StepClock
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.hooks import NoHooks
from trainwreck.rundir.layout import RunDir
from trainwreck.trainer.storage import LocalStorage, Produce, Storage, gather

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
    from trainwreck.rundir.events import EventLog
    from trainwreck.trainer.hooks import NoHooks
    from trainwreck.rundir.layout import RunDir
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


def crash_plan(op_index: int, when: str, rank: int | None = None) -> list[dict[str, Any]]:
    """One crash_op fault; `rank` names the crashing rank of a sharded save (None: the DDP writer, rank 0)."""
    if rank is None:
        return [{"id": f"crash-{when}-op{op_index}", "kind": "crash_op", "step": CRASH_STEP,
                 "op_index": op_index, "when": when}]
    return [{"id": f"crash-r{rank}-{when}-op{op_index}", "kind": "crash_op", "rank": rank, "step": CRASH_STEP,
             "op_index": op_index, "when": when}]


# ----- 3. a sharded save: every rank's own ops, recorded in a clean job ---------------------

SHARDED_OPS_DIR = "sweep-ops"
"""RUN_DIR/sweep-ops/ops-rNNN.jsonl: rank NNN's mutating ops of the save at CRASH_STEP."""


class SaveOpsRecorder(RecordingStorage):
    """Records the mutating ops made while the rank's clock reads `step` (the ops the
    crash_op fault counts, in the same order), each appended to `out` as it happens."""

    def __init__(self, inner: Storage, clock: StepClock, step: int, out: Path) -> None:
        super().__init__(inner)
        self.clock, self.step, self.out = clock, step, out

    def _log(self, name: str, *args: str, size: int | None = None) -> None:
        if name not in MUTATING or self.clock.step != self.step:
            return
        self.ops.append(Op(name, args, size))
        with self.out.open("a") as f:
            f.write(json.dumps({"name": name, "args": list(args), "size": size}) + "\n")

    def write_stream(self, path: str, produce: Produce, durable: bool = True) -> int:
        data = gather(produce)  # a recording run: the size is part of the op's name
        self.write(path, data, durable=durable)
        return len(data)


class ShardedRecordingHooks(NoHooks):
    """Hooks of the sharded sweep's observed job: every rank records its own save ops."""

    def __init__(self, plan: list[dict[str, Any]]) -> None:
        if plan:
            raise ValueError("sharded_recording_hooks records a clean run: give it an empty plan")
        self.clock = StepClock()
        self.out: Path | None = None

    def bind(self, events: Any, rank: int, world_size: int, attempt: int) -> None:
        self.out = RunDir.of_events_file(events.path).root / SHARDED_OPS_DIR / f"ops-r{rank:03d}.jsonl"
        self.out.parent.mkdir(parents=True, exist_ok=True)

    def point(self, name: str, step: int, **ctx: Any) -> None:
        self.clock.step = step  # as FaultHooks does: the save after update S runs at clock S

    def wrap_storage(self, storage: Storage) -> Storage:
        if self.out is None:
            raise RuntimeError("bind() must run before wrap_storage()")
        return SaveOpsRecorder(storage, self.clock, CRASH_STEP, self.out)  # type: ignore[return-value]


def sharded_recording_hooks(plan: list[dict[str, Any]]) -> ShardedRecordingHooks:
    """The `hooks_factory` of the sharded sweep's observed job."""
    return ShardedRecordingHooks(plan)


def load_rank_ops(run_dir: Path) -> dict[int, list[Op]]:
    """rank -> its recorded mutating ops of the save at CRASH_STEP (every rank that recorded)."""
    out: dict[int, list[Op]] = {}
    for path in sorted((Path(run_dir) / SHARDED_OPS_DIR).glob("ops-r*.jsonl")):
        rank = int(path.stem.removeprefix("ops-r"))
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[rank] = [Op(r["name"], tuple(r["args"]), r["size"]) for r in records]
    return out


def rank_crash_points(ops_by_rank: dict[int, list[Op]]) -> list[tuple[int, int, str, str]]:
    """(rank, op_index, op description, when): every crash point of every rank's own ops."""
    return [(rank, index, op, when) for rank in sorted(ops_by_rank)
            for index, op, when in crash_points(ops_by_rank[rank])]

