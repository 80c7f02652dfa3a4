"""Hand-written run directories for the report tests: fast, no torch, every number known.

`RunWriter` writes what the harness and the ranks would (format trainwreck-run/1),
with controlled clocks, so a test can assert the exact figures a report derives:
recovery times, checkpoint ages, samples redone, the slowest rank.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STEP_S = 0.1
"""Wall-clock seconds per update in these runs."""


class RunWriter:
    def __init__(self, root: Path, *, total_steps: int = 8, global_batch: int = 4, dataset_size: int = 32,
                 ckpt_interval: int = 2, hang_timeout_s: float = 3.0, faults: list[dict[str, Any]] | None = None):
        self.root = Path(root)
        self.spec: dict[str, Any] = {
            "format": "trainwreck-run/1", "dataset_size": dataset_size, "global_batch": global_batch,
            "drop_last": True, "total_steps": total_steps, "hang_timeout_s": hang_timeout_s, "hang_slack_s": 1.0,
            "world_sizes": [], "faults": list(faults or []), "max_restarts": 3,
            "config": {"ckpt_interval": ckpt_interval, "total_steps": total_steps},
        }
        self.files: dict[str, list[dict[str, Any]]] = {}
        self.t = 1000.0
        self.pids = 100
        self.slow: dict[int, float] = {}  # rank -> extra seconds of `data` per update (a straggler)

    # -- events ------------------------------------------------------------------------

    def emit(self, file: str, kind: str, t: float | None = None, **fields: Any) -> None:
        self.files.setdefault(file, []).append({"kind": kind, "t": round(self.t if t is None else t, 6), **fields})

    def harness(self, kind: str, **fields: Any) -> None:
        self.emit("harness.jsonl", kind, **fields)

    def rank_file(self, attempt: int, rank: int) -> str:
        return f"a{attempt:03d}-r{rank:03d}-p{attempt * 10 + rank}.jsonl"

    def samples(self, step: int, rank: int, world_size: int) -> list[int]:
        gb, size = self.spec["global_batch"], self.spec["dataset_size"]
        start = ((step - 1) * gb) % size
        return list(range(start, start + gb))[rank::world_size]

    def epoch(self, step: int) -> int:
        return (step - 1) * self.spec["global_batch"] // self.spec["dataset_size"]

    # -- the story ---------------------------------------------------------------------

    def attempt(self, attempt: int, world_size: int, restore: tuple[str, int] | None = None) -> None:
        self.spec["world_sizes"].append(world_size)
        self.harness("attempt", attempt=attempt, world_size=world_size, launcher="warm", pids=[])
        self.t += 0.05
        for rank in range(world_size):
            self.emit(self.rank_file(attempt, rank), "start", attempt=attempt, rank=rank, world_size=world_size, pid=1)
        if restore is not None:
            name, step = restore
            self.t += 0.05
            for rank in range(world_size):
                self.emit(self.rank_file(attempt, rank), "restore", attempt=attempt, rank=rank,
                          world_size=world_size, step=step, checkpoint=name, digest=f"d{step}")

    def train(self, attempt: int, world_size: int, first: int, last: int,
              override: dict[tuple[int, int], list[int]] | None = None, ranks: list[int] | None = None) -> None:
        """Updates first..last on every rank (or `ranks`), saving every ckpt_interval steps."""
        interval = self.spec["config"]["ckpt_interval"]
        for k in range(first, last + 1):
            self.t += STEP_S
            for rank in ranks if ranks is not None else range(world_size):
                f = self.rank_file(attempt, rank)
                ids = (override or {}).get((k, rank), self.samples(k, rank, world_size))
                common = {"attempt": attempt, "rank": rank, "world_size": world_size, "step": k}
                self.emit(f, "batch", t=self.t - 0.05, epoch=self.epoch(k), samples=ids, **common)
                phases = {"data": 0.01 + self.slow.get(rank, 0.0), "forward": 0.02, "backward": 0.03, "sync": 0.01,
                          "optimizer": 0.01, "checkpoint": 0.02 if k > 1 and (k - 1) % interval == 0 else 0.0}
                self.emit(f, "step", loss=round(2.0 / k, 4), digest=f"d{k}", phases=phases, **common)
            if k % interval == 0 or k == self.spec["total_steps"]:
                self.t += 0.02
                self.emit(self.rank_file(attempt, 0), "save", attempt=attempt, rank=0, world_size=world_size,
                          step=k, checkpoint=f"step-{k:08d}", digest=f"d{k}", seconds=0.02)

    def exits(self, attempt: int, codes: dict[int, int]) -> None:
        self.t += 0.01
        for rank, code in codes.items():
            self.harness("exit", attempt=attempt, rank=rank, code=code)

    def end(self, status: str = "completed", final_step: int | None = None) -> None:
        self.harness("end", status=status, final_step=self.spec["total_steps"] if final_step is None else final_step,
                     outcome=status, attempts=len(self.spec["world_sizes"]))

    def write(self) -> Path:
        (self.root / "events").mkdir(parents=True, exist_ok=True)
        (self.root / "run.json").write_text(json.dumps(self.spec, indent=1))
        for name, events in self.files.items():
            (self.root / "events" / name).write_text("".join(json.dumps(ev) + "\n" for ev in events))
        return self.root


# ----- ready-made stories -----------------------------------------------------------------


def clean_run(root: Path, world_size: int = 2) -> Path:
    """One attempt, no fault: every invariant holds."""
    w = RunWriter(root)
    w.attempt(0, world_size)
    w.train(0, world_size, 1, 8)
    w.exits(0, {r: 0 for r in range(world_size)})
    w.end()
    return w.write()


def duplicated_sample_run(root: Path) -> Path:
    """Rank 1 reuses update 2's samples at update 3: ids 5 and 7 twice, 9 and 11 never (coverage INVALID)."""
    w = RunWriter(root)
    w.attempt(0, 2)
    w.train(0, 2, 1, 8, override={(3, 1): w.samples(2, 1, 2)})
    w.exits(0, {0: 0, 1: 0})
    w.end()
    return w.write()


def killed_run(root: Path) -> Path:
    """SIGKILL rank 1 during update 6 (saves at 2 and 4); attempt 1 restores step 4 and finishes."""
    w = RunWriter(root, faults=[{"id": "k1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 6}])
    w.attempt(0, 2)
    w.train(0, 2, 1, 5)
    w.t += 0.05
    w.harness("fault", attempt=0, fault_id="k1", rank=1, ranks=[1], signal="SIGKILL", detail="SIGKILL to rank 1")
    w.t += 0.02
    w.exits(0, {1: -9, 0: -9})
    w.t += 0.2
    w.attempt(1, 2, restore=("step-00000004", 4))
    w.train(1, 2, 5, 8)
    w.exits(1, {0: 0, 1: 0})
    w.end()
    return w.write()


def hung_run(root: Path) -> Path:
    """SIGSTOP rank 1 during update 4; the watchdog names it 3.2 s later; attempt 1 restores step 2."""
    w = RunWriter(root, faults=[{"id": "h1", "kind": "signal", "rank": 1, "signal": "SIGSTOP", "step": 4,
                                 "expect": "hang"}])
    w.attempt(0, 2)
    w.train(0, 2, 1, 3)
    w.t += 0.05
    w.harness("fault", attempt=0, fault_id="h1", rank=1, ranks=[1], signal="SIGSTOP", detail="SIGSTOP to rank 1")
    w.t += 3.2
    w.harness("hang", attempt=0, ranks=[1], waiting=[0], last_step=4, detected_after_s=3.0,
              stacks=["stacks/a000-r001-p1.txt"])
    (root / "stacks").mkdir(parents=True, exist_ok=True)
    (root / "stacks" / "a000-r001-p1.txt").write_text(
        'Current thread 0x00007f (most recent call first):\n'
        '  File "/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
        '  File "/work/trainer/loop.py", line 214 in forward_backward\n'
        '  File "/work/harness/rank.py", line 127 in run\n')
    w.exits(0, {0: -9, 1: -9})
    w.attempt(1, 2, restore=("step-00000002", 2))
    w.train(1, 2, 3, 8)
    w.exits(1, {0: 0, 1: 0})
    w.end()
    return w.write()
