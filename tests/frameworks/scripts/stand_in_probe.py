"""A stand-in for trainer/probe.py's ``Probe`` (the `probe` branch owns the real one), with the
agreed API, so the adapters can be tested and judged before it lands. It writes the real run
format (trainer/rundir.py paths, trainer/events.py's EventLog) into $TRAINWRECK_RUN_DIR, fires
`kill` (SIGKILL at a point) and `foreign_crash` faults of run.json's plan, and emits `save` on
rank 0 only after an all-gather of every rank's durability flag. ``get_probe`` returns the real
probe as soon as it exists, unless $TRAINWRECK_STAND_IN_PROBE is set."""
from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch.distributed as dist

from trainwreck.faults.foreign import ForeignSave
from trainwreck.trainer.events import EventLog
from trainwreck.trainer.rundir import RunDir, read_run_json


class StandInProbe:
    def __init__(self, run_dir: Path) -> None:
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.attempt = int(os.environ["TRAINWRECK_ATTEMPT"])
        self.run_dir = run_dir
        self.plan: list[dict[str, Any]] = read_run_json(run_dir)["faults"]
        self.events = EventLog(RunDir(run_dir).rank_events(self.attempt, self.rank, os.getpid()),
                               attempt=self.attempt, rank=self.rank, world_size=self.world_size)
        self.foreign: dict[Path, ForeignSave] = {}

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.emit(kind, **fields)
        self.events.flush()  # a stand-in keeps it simple: every event reaches the file at once

    def start(self) -> None:
        self.emit("start", pid=os.getpid())

    def restore(self, step: int, checkpoint: str, digest: str) -> None:
        self.emit("restore", step=step, checkpoint=checkpoint, digest=digest)

    def reject(self, checkpoint: str, reason: str) -> None:
        self.emit("reject", checkpoint=checkpoint, reason=reason)

    def batch(self, step: int, epoch: int, samples: Sequence[int]) -> None:
        self.emit("batch", step=step, epoch=epoch, samples=list(samples))

    def step(self, step: int, loss: float, digest: str, **extra: Any) -> None:
        self.emit("step", step=step, loss=loss, digest=digest, **extra)

    def save(self, step: int, checkpoint: str, digest: str, *, durable_on_every_rank: bool) -> None:
        flags: list[Any] = [durable_on_every_rank] * self.world_size
        if dist.is_initialized():
            dist.all_gather_object(flags, durable_on_every_rank)
        if self.rank == 0 and all(flags):
            self.emit("save", step=step, checkpoint=checkpoint, digest=digest)

    def commit(self, step: int, checkpoint: str, digest: str) -> None:
        self.emit("save", step=step, checkpoint=checkpoint, digest=digest)

    def prune(self, checkpoint: str) -> None:
        self.emit("prune", checkpoint=checkpoint)

    def point(self, name: str, step: int, **ctx: Any) -> None:
        for fault in self.plan:
            if (fault["kind"] == "kill" and fault["rank"] == self.rank and fault["step"] == step
                    and fault.get("point", "step_start") == name and fault.get("attempt", 0) == self.attempt):
                self._record(fault, f"rank {self.rank} killed (sigkill) at {name} of update {step}")
                os.kill(os.getpid(), signal.SIGKILL)

    @contextmanager
    def saving(self, step: int, root: Path) -> Iterator[None]:
        if root not in self.foreign:
            self.foreign[root] = ForeignSave(self.plan, self.rank, self.attempt, self._record, root)
        with self.foreign[root].saving(step):
            yield
        if os.environ.get("TRAINWRECK_RECORD_OPS"):  # an extension kind the judge ignores
            self.emit("save_ops", step=step, ops=[op.describe() for op in self.foreign[root].recorded])

    def _record(self, fault: dict[str, Any], detail: str, **extra: Any) -> None:
        self.emit("fault", fault_id=fault["id"], fault_kind=fault["kind"], detail=detail, **extra)

    def close(self) -> None:
        self.events.close()


def get_probe() -> Any:
    if not os.environ.get("TRAINWRECK_STAND_IN_PROBE"):
        try:
            from trainwreck.trainer.probe import Probe  # type: ignore[import-not-found]
        except ImportError:
            pass
        else:
            return Probe.from_env()
    return StandInProbe(Path(os.environ["TRAINWRECK_RUN_DIR"]))
