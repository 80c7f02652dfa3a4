"""The crash-point sweep: crash a save at every storage operation and judge each run.

    result = run_sweep("reference", out=Path("out/sweep"), progress=print)
    result.first_failure      # None, or the first crash point that broke an invariant
    result.to_json()          # {"writer", "ops", "rows": [one per crash point], ...}

1. Record: run the writer's ``CheckpointStore.save`` in-process against a
   ``RecordingStorage`` on a real trainer state, after the same earlier saves the job
   makes, so the recorded save is the job's save at ``CRASH_STEP`` op for op
   (including retention pruning the oldest checkpoint).
2. Crash: one job per crash point - SIGKILL before op i, after op i, and for each
   write a torn variant (half the bytes persist, then SIGKILL) - through the in-rank
   ``crash_op`` fault; the harness restarts and the job finishes.
3. Judge every run with all invariants against a golden run (the same spec without
   faults, run once per writer and reused).

Only mutating ops (faults/storage.py MUTATING) are crash points: a crash just before
an ``exists``/``read``/``list`` is the crash just after the previous mutating op.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from trainwreck.faults.storage import Op, RecordingStorage
from trainwreck.trainer.config import TrainConfig

SWEEP_CONFIG = TrainConfig.tiny(total_steps=20, ckpt_interval=4)
"""keep_last=3 and saves at 4, 8, 12: the save at 16 also prunes step 4, so retention is swept too."""
CRASH_STEP = 16
WORLD_SIZES = (2,)
HANG_TIMEOUT_S = 5.0
"""A crash is never a hang; this only bounds a run that would wrongly hang."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SweepRow:
    op_index: int
    """0-based index among the save's mutating storage ops."""
    op: str
    """The op, e.g. 'rename(.tmp-step-00000016-PID, step-00000016)'."""
    when: str
    """before, after or torn."""
    verdict: Any
    """The judgement: True (valid), False (invalid) or "unknown"."""
    failing: list[str]
    """Invariants judged invalid."""
    unknown: list[str]
    """Invariants judged unknown (and 'unfired' when the crash never happened)."""
    run_dir: str
    outcome: str
    """The harness outcome of the job (completed, budget_exhausted, ...)."""
    summary: str = ""
    """The first failing invariant's one-line summary."""

    @property
    def label(self) -> str:
        return f"{self.when} op {self.op_index} {self.op}"

    def to_json(self) -> dict[str, Any]:
        return {"op_index": self.op_index, "op": self.op, "when": self.when, "verdict": self.verdict,
                "failing": self.failing, "unknown": self.unknown, "run_dir": self.run_dir,
                "outcome": self.outcome, "summary": self.summary}


@dataclass
class SweepResult:
    writer: str
    ops: list[str]
    """The recorded mutating ops of the reference save, in order."""
    rows: list[SweepRow] = field(default_factory=list)
    golden_dir: str = ""

    @property
    def failures(self) -> list[SweepRow]:
        return [r for r in self.rows if r.verdict is not True]

    @property
    def first_failure(self) -> SweepRow | None:
        """The failing crash point earliest in the save (by op index, then before/after/torn)."""
        order = {"before": 0, "after": 1, "torn": 2}
        failing = sorted(self.failures, key=lambda r: (r.op_index, order[r.when]))
        return failing[0] if failing else None

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {"writer": self.writer, "step": CRASH_STEP, "ops": self.ops, "crash_points": len(self.rows),
                "failures": len(self.failures), "first_failure": first.to_json() if first else None,
                "golden_dir": self.golden_dir, "rows": [r.to_json() for r in self.rows]}


# ----- 1. recording the save -------------------------------------------------------------


def _pid_free(text: str) -> str:
    """Names of temporary and trash directories end in the writer's pid."""
    return re.sub(r"(\.(?:tmp|trash)-step-\d{8})-\d+", r"\1-PID", text)


def describe(op: Op) -> str:
    return _pid_free(op.describe())


def record_save_ops(writer: str = "reference", cfg: TrainConfig = SWEEP_CONFIG,
                    step: int = CRASH_STEP) -> list[Op]:
    """Every storage op of the writer's save at `step`, after the job's earlier saves."""
    import torch

    from trainwreck.faults.plan import save_steps
    from trainwreck.trainer.events import EventLog
    from trainwreck.trainer.hooks import NoHooks
    from trainwreck.trainer.entry import trainer_class
    from trainwreck.trainer.loop import lr_factor
    from trainwreck.trainer.model import MLP
    from trainwreck.trainer.sampler import ElasticSampler
    from trainwreck.trainer.state import TrainState, capture_rng, state_digest, training_files
    from trainwreck.trainer.storage import LocalStorage

    store_class = trainer_class(writer).store_class
    torch.manual_seed(cfg.seed)
    model = MLP(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: lr_factor(cfg, done))
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, scaler=None)
    sampler = ElasticSampler(cfg.dataset_size, cfg.global_batch, cfg.seed, cfg.drop_last)
    with tempfile.TemporaryDirectory(prefix="trainwreck-sweep-record-") as tmp:
        events = EventLog(Path(tmp) / "events" / "record.jsonl", attempt=0, rank=0, world_size=1)
        recording = RecordingStorage(LocalStorage(Path(tmp) / "checkpoints"))
        (Path(tmp) / "checkpoints").mkdir()
        store = store_class(recording, events, NoHooks(), cfg.keep_last)
        for s in [s for s in save_steps(cfg) if s <= step]:
            state.step = s
            files = training_files(state, sampler.state_dict(), [capture_rng()] * WORLD_SIZES[0], cfg.identity())
            meta = {"world_size": WORLD_SIZES[0], "config_identity": cfg.identity(),
                    "digest": state_digest(state), "attempt": 0}
            recording.ops.clear()  # keep only the last save's ops
            store.save(s, files, meta)
        events.close()
        return list(recording.ops)


def crash_points(ops: list[Op]) -> list[tuple[int, str, str]]:
    """(op_index, op description, when) for every mutating op: before, after, and torn for writes."""
    from trainwreck.faults.storage import MUTATING

    points = []
    for index, op in enumerate(o for o in ops if o.name in MUTATING):
        for when in ("before", "after") + (("torn",) if op.name == "write" else ()):
            points.append((index, describe(op), when))
    return points


# ----- 2 and 3. crashing and judging -----------------------------------------------------


def _spec(cfg: TrainConfig, plan: list[dict[str, Any]], run_dir: Path) -> Any:
    from trainwreck.harness.spec import JobSpec

    return JobSpec(config=cfg, world_sizes=WORLD_SIZES, plan=plan, hang_timeout_s=HANG_TIMEOUT_S,
                   run_dir=run_dir)


def crash_plan(op_index: int, when: str) -> list[dict[str, Any]]:
    return [{"id": f"crash-{when}-op{op_index}", "kind": "crash_op", "step": CRASH_STEP,
             "op_index": op_index, "when": when}]


def run_sweep(writer: str = "reference", out: Path | None = None, progress: Progress | None = None,
              points: Iterable[tuple[int, str]] | None = None) -> SweepResult:
    """Crash the writer's save at every crash point (or only `points`: (op_index, when)),
    judging each run against one golden run. Run directories go under out/<writer>/."""
    from trainwreck.harness.golden import golden_run
    from trainwreck.harness.supervisor import run_job
    from trainwreck.invariants import judge, load_history

    cfg = TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer})
    say = progress or (lambda _line: None)
    base = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="trainwreck-sweep-"))
    base = base / writer
    ops = record_save_ops(writer, cfg)
    from trainwreck.faults.storage import MUTATING

    result = SweepResult(writer, [describe(o) for o in ops if o.name in MUTATING])
    say(f"{writer}: the save at step {CRASH_STEP} does {len(result.ops)} mutating storage ops")
    # The reference trainer's cached golden run: a writer's own uninterrupted run is the
    # wrong yardstick for a defective writer, and recomputing it per sweep is wasted work.
    golden_dir = golden_run(TrainConfig.from_dict({**cfg.to_dict(), "variant": "reference"}), WORLD_SIZES[0])
    golden = load_history(golden_dir)
    result.golden_dir = str(golden_dir)
    wanted = set(points) if points is not None else None
    todo = [p for p in crash_points(ops) if wanted is None or (p[0], p[2]) in wanted]
    for n, (index, op, when) in enumerate(todo, 1):
        run_dir = base / f"op{index:02d}-{when}"
        record = run_job(_spec(cfg, crash_plan(index, when), run_dir))
        judgement = judge(load_history(run_dir), golden=golden)
        failing = [name for name, v in judgement.verdicts.items() if v.valid is False]
        unknown = [name for name, v in judgement.verdicts.items() if v.valid not in (True, False)]
        unknown += ["unfired"] if judgement.unfired_faults else []
        first = next((judgement.verdicts[name].summary for name in failing + unknown
                      if name in judgement.verdicts), "")
        row = SweepRow(index, op, when, judgement.valid, failing, unknown, str(run_dir), record.outcome, first)
        result.rows.append(row)
        verdict = {True: "valid", False: "INVALID"}.get(judgement.valid, "unknown")  # type: ignore[call-overload]
        say(f"[{n}/{len(todo)}] {writer}: crash {row.label}: {verdict}"
            + (f" ({', '.join(failing + unknown)}: {first})" if failing or unknown else ""))
    return result
