"""A builder for hand-written run directories (format trainwreck-run/1).

Tests describe a history the way a run would unfold - attempts that restore,
train, save, get killed - and the builder writes run.json and one events file
per rank process (plus harness.jsonl), exactly as the writers do. The sampler
is elastic and deterministic: the global batch of update k depends only on k,
so runs with different world sizes use the same samples at the same step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from trainwreck.invariants import History, load_history


def digest(step: int) -> str:
    """The correct state after update `step` (step 0: the initial state)."""
    return f"state-{step}"


def loss(step: int) -> float:
    return round(3.0 / (1.0 + step), 6)


class HistoryBuilder:
    def __init__(
        self,
        directory: Path,
        *,
        dataset_size: int = 16,
        global_batch: int = 4,
        drop_last: bool = False,
        total_steps: int = 8,
        hang_timeout_s: float = 10.0,
        faults: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> None:
        self.dir = Path(directory)
        self.spec: dict[str, Any] = {
            "format": "trainwreck-run/1",
            "dataset_size": dataset_size,
            "global_batch": global_batch,
            "drop_last": drop_last,
            "total_steps": total_steps,
            "hang_timeout_s": hang_timeout_s,
            "world_sizes": [],
            "faults": list(faults or []),
            **extra,
        }
        self.files: dict[str, list[str]] = {}
        self.t = 1000.0
        self.attempts: list[Attempt] = []

    # -- the clock and raw events -------------------------------------------

    def tick(self, dt: float = 0.01) -> float:
        self.t = round(self.t + dt, 6)
        return self.t

    def write_event(self, file: str, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"kind": kind, "t": fields.pop("t", None) or self.tick(), **fields}
        self.files.setdefault(file, []).append(json.dumps(event))
        return event

    def harness(self, kind: str, **fields: Any) -> dict[str, Any]:
        return self.write_event("harness.jsonl", kind, **fields)

    def raw_line(self, file: str, text: str) -> None:
        """A line as-is (torn, not JSON, ...)."""
        self.files.setdefault(file, []).append(text)

    # -- the sampler ----------------------------------------------------------

    def steps_per_epoch(self) -> int:
        size, gb = self.spec["dataset_size"], self.spec["global_batch"]
        return size // gb if self.spec["drop_last"] else math.ceil(size / gb)

    def epoch_of(self, step: int) -> int:
        return (step - 1) // self.steps_per_epoch()

    def global_batch(self, step: int) -> list[int]:
        """The ids of update `step`: a per-epoch rotation of 0..N-1, cut in global batches."""
        size, gb = self.spec["dataset_size"], self.spec["global_batch"]
        epoch, index = divmod(step - 1, self.steps_per_epoch())
        order = [(i * 5 + epoch * 3) % size for i in range(size)] if size % 5 else [(i + epoch * 3) % size for i in range(size)]
        return order[index * gb : (index + 1) * gb]

    def rank_batch(self, step: int, rank: int, world_size: int) -> list[int]:
        return self.global_batch(step)[rank::world_size]

    # -- the story ------------------------------------------------------------

    def attempt(
        self,
        world_size: int = 2,
        *,
        restore: str | None = None,
        restore_step: int | None = None,
        restore_digest: str | None = None,
        rejects: tuple[str, ...] = (),
        reject_ranks: tuple[int, ...] = (0,),
        restore_content: str | None = None,
    ) -> "Attempt":
        """Start the next attempt: start events, rank 0's rejects, every rank's restore."""
        att = Attempt(self, len(self.attempts), world_size)
        self.attempts.append(att)
        self.spec["world_sizes"].append(world_size)
        for rank in range(world_size):
            att.emit(rank, "start", pid=att.pid(rank))
        for name in rejects:
            for rank in reject_ranks:
                att.emit(rank, "reject", checkpoint=name, reason="verification failed")
        if restore is not None:
            step = restore_step if restore_step is not None else self.saved_step(restore)
            known = {"content": restore_content} if restore_content is not None else {}
            for rank in range(world_size):
                att.emit(rank, "restore", step=step, checkpoint=restore, digest=restore_digest or digest(step), **known)
            att.position = step
        return att

    def saved_step(self, name: str) -> int:
        for file, lines in self.files.items():
            for line in lines:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("kind") == "save" and ev.get("checkpoint") == name:
                    return ev["step"]
        raise KeyError(f"no save of {name} yet: pass restore_step")

    def corrupt(self, fault_id: str, checkpoint: str, attempt: int) -> None:
        """The harness damages a checkpoint before `attempt` starts."""
        self.harness("fault", fault_id=fault_id, attempt=attempt, rank=None, checkpoint=checkpoint, detail="flipped bytes")

    def hang_detected(self, attempt: int, ranks: list[int], *, at: float, waiting: list[int] | None = None, last_step: int = 0) -> None:
        self.harness("hang", t=at, attempt=attempt, ranks=ranks, waiting=waiting or [], last_step=last_step, detected_after_s=0.0)

    def end(self, status: str = "completed", final_step: int | None = None) -> None:
        self.harness("end", status=status, final_step=self.spec["total_steps"] if final_step is None else final_step)

    # -- output ---------------------------------------------------------------

    def write(self) -> Path:
        (self.dir / "events").mkdir(parents=True, exist_ok=True)
        (self.dir / "run.json").write_text(json.dumps(self.spec))
        for name, lines in self.files.items():
            (self.dir / "events" / name).write_text("".join(line + "\n" for line in lines))
        return self.dir

    def load(self) -> History:
        return load_history(self.write())


def golden_run(directory: Path, *, digests: Callable[[int], str] = digest, **spec: Any) -> Path:
    """The uninterrupted run of a spec (one attempt of 2 ranks to total_steps), written to
    `directory`: what `trainwreck check --golden` compares a restarted run with."""
    golden = HistoryBuilder(directory, **spec)
    golden.attempt(2).train(golden.spec["total_steps"], digests=digests)
    golden.end()
    return golden.write()


class Attempt:
    """One attempt of the job: its ranks' events go to their own files."""

    def __init__(self, builder: HistoryBuilder, number: int, world_size: int) -> None:
        self.b = builder
        self.number = number
        self.world_size = world_size
        self.position = 0  # the last update applied (the restore point at first)

    def pid(self, rank: int) -> int:
        return 4000 + 100 * self.number + rank

    def file(self, rank: int) -> str:
        return f"a{self.number:03d}-r{rank:03d}-p{self.pid(rank)}.jsonl"

    def emit(self, rank: int, kind: str, **fields: Any) -> dict[str, Any]:
        return self.b.write_event(
            self.file(rank), kind, attempt=self.number, rank=rank, world_size=self.world_size, **fields
        )

    def train(
        self,
        last: int,
        *,
        save_every: int | None = None,
        digests: Callable[[int], str] = digest,
        losses: Callable[[int], float] = loss,
        samples: Callable[[int, int], list[int]] | None = None,
        ranks: tuple[int, ...] | None = None,
        epoch: Callable[[int], int] | None = None,
    ) -> "Attempt":
        """Updates position+1..last on every rank (or `ranks`), saving every `save_every`."""
        for step in range(self.position + 1, last + 1):
            for rank in ranks if ranks is not None else range(self.world_size):
                ids = samples(step, rank) if samples else self.b.rank_batch(step, rank, self.world_size)
                e = epoch(step) if epoch else self.b.epoch_of(step)
                self.emit(rank, "batch", step=step, epoch=e, samples=ids)
            for rank in ranks if ranks is not None else range(self.world_size):
                self.emit(rank, "step", step=step, loss=losses(step), digest=digests(step))
            self.position = step
            if save_every and step % save_every == 0:
                self.save(step, state=digests(step))
        return self

    def save(self, step: int, *, name: str | None = None, state: str | None = None, content: str | None = None) -> str:
        """Rank 0 commits; `content` (optional in the format) identifies the checkpoint's bytes."""
        name = name or f"step-{step:08d}"
        known = {"content": content} if content is not None else {}
        self.emit(0, "save", step=step, checkpoint=name, digest=state or digest(step), **known)
        return name

    def prune(self, name: str) -> None:
        self.emit(0, "prune", checkpoint=name)

    def fault(self, fault_id: str, rank: int, **fields: Any) -> dict[str, Any]:
        """An in-rank fault fires (written by the rank itself)."""
        return self.emit(rank, "fault", fault_id=fault_id, detail=fields.pop("detail", "fired"), **fields)

    def exit(self, rank: int, code: int = -9) -> None:
        self.b.harness("exit", attempt=self.number, rank=rank, code=code)

    def crash(self, rank: int = 1, fault_id: str | None = None) -> "Attempt":
        """A rank is killed: the fault (if planned) fires, every rank exits."""
        if fault_id:
            self.fault(fault_id, rank)
        for r in range(self.world_size):
            self.exit(r, -9 if r == rank else -15)
        return self
