"""The crash-point sweep as a suite: crash one save at each of its storage operations and
judge every crash point as a real run, through the same run-and-judge path as any other
run (each gets its verdicts.json and its report).

    result = run_sweep("reference", out=Path("out/sweep"), progress=print)
    result.first_failure      # None, or the first crash point that broke an invariant
    result.to_json()          # {"writer", "ops", "rows": [one per crash point], ...}

The fault side (recording the save, naming crash points, the crash plan) is faults/sweep.py.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from trainwreck.faults.sweep import (CRASH_STEP, HANG_TIMEOUT_S, SWEEP_CONFIG, WORLD_SIZES, crash_plan, crash_points,
                                     mutating_ops, record_save_ops)
from trainwreck.harness.runner import JudgedRun, run_judged
from trainwreck.harness.spec import JobSpec
from trainwreck.invariants.verdict import verdict_word
from trainwreck.trainer.config import TrainConfig

Say = Callable[[str], None]
"""Where progress lines go (print, a list's append, ...)."""


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


def crash_point_spec(writer: str, op_index: int, when: str, run_dir: Path) -> JobSpec:
    cfg = TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer})
    return JobSpec(config=cfg, world_sizes=WORLD_SIZES, plan=crash_plan(op_index, when),
                   hang_timeout_s=HANG_TIMEOUT_S, run_dir=run_dir)


def sweep_row(op_index: int, op: str, when: str, judged: JudgedRun) -> SweepRow:
    judgement = judged.judgement
    failing = [name for name, v in judgement.verdicts.items() if v.valid is False]
    unknown = [name for name, v in judgement.verdicts.items() if v.valid not in (True, False)]
    unknown += ["unfired"] if judgement.unfired_faults else []
    first = next((judgement.verdicts[name].summary for name in failing + unknown if name in judgement.verdicts), "")
    return SweepRow(op_index, op, when, judgement.valid, failing, unknown, str(judged.record.run_dir),
                    judged.record.outcome, first)


def run_sweep(writer: str = "reference", out: Path | None = None, progress: Say | None = None,
              points: Iterable[tuple[int, str]] | None = None, golden_cache: Path | None = None) -> SweepResult:
    """Crash the writer's save at every crash point (or only `points`: (op_index, when)),
    each run judged against the reference trainer's cached golden run. Runs go under out/<writer>/."""
    say = progress or (lambda _line: None)
    base = (Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="trainwreck-sweep-"))) / writer
    ops = record_save_ops(writer)
    result = SweepResult(writer, mutating_ops(ops))
    say(f"{writer}: the save at step {CRASH_STEP} does {len(result.ops)} mutating storage ops")
    wanted = set(points) if points is not None else None
    todo = [p for p in crash_points(ops) if wanted is None or (p[0], p[2]) in wanted]
    for n, (index, op, when) in enumerate(todo, 1):
        spec = crash_point_spec(writer, index, when, base / f"op{index:02d}-{when}")
        judged = run_judged(spec, golden_cache=golden_cache,
                            reproduce=f"trainwreck sweep --writer {writer} --points {index}:{when}")
        result.golden_dir = str(judged.golden_dir)
        row = sweep_row(index, op, when, judged)
        result.rows.append(row)
        detail = f" ({', '.join(row.failing + row.unknown)}: {row.summary})" if row.failing or row.unknown else ""
        say(f"[{n}/{len(todo)}] {writer}: crash {row.label}: {verdict_word(row.verdict)}{detail}")
    return result
