"""The crash-point sweep as a suite: crash one save at each of its storage operations and
judge every crash point as a real run, through the same run-and-judge path as any other
run (each gets its verdicts.json and its report).

    result = run_sweep("reference", out=Path("out/sweep"), progress=print)
    result.first_failure      # None, or the first crash point that broke an invariant
    result.to_json()          # {"writer", "ops", "rows": [one per crash point], ...}

The fault side (recording the save, naming crash points, the crash plan) is faults/sweep.py.
"""
from __future__ import annotations

import bisect
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from trainwreck.faults.sweep import (CRASH_STEP, HANG_TIMEOUT_S, SWEEP_CONFIG, WORLD_SIZES, crash_plan, crash_points,
                                     describe, load_rank_ops, mutating_ops, rank_crash_points, record_save_ops)
from trainwreck.faults.powerloss import (OPS_DIR, CrashState, OpLog, crash_states, judge_dcp_state, load_oplog,
                                        materialise, record_dcp_save)
from trainwreck.faults.storage import Op
from trainwreck.harness.judge.runner import JudgedRun, run_judged
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.invariants.verdict import verdict_word
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.rundir import RunDir, iter_events

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
    rank: int = 0
    """The rank that crashed (a DDP save's writer is rank 0; a sharded save has one per rank)."""

    @property
    def label(self) -> str:
        return f"{self.when} op {self.op_index} {self.op}" + (f" of rank {self.rank}" if self.rank else "")

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "op_index": self.op_index, "op": self.op, "when": self.when,
                "verdict": self.verdict, "failing": self.failing, "unknown": self.unknown, "run_dir": self.run_dir,
                "outcome": self.outcome, "summary": self.summary}


@dataclass
class SweepResult:
    writer: str
    ops: list[str]
    """The recorded mutating ops of the reference save, in order."""
    rows: list[SweepRow] = field(default_factory=list)
    golden_dir: str = ""
    parallelism: str = "ddp"
    rank_ops: dict[int, list[str]] = field(default_factory=dict)
    """A sharded save: each rank's own recorded mutating ops (`ops` is rank 0's)."""

    @property
    def failures(self) -> list[SweepRow]:
        return [r for r in self.rows if r.verdict is not True]

    @property
    def first_failure(self) -> SweepRow | None:
        """The failing crash point earliest in the save (by op index, then before/after/torn)."""
        order = {"before": 0, "after": 1, "torn": 2}
        failing = sorted(self.failures, key=lambda r: (r.rank, r.op_index, order[r.when]))
        return failing[0] if failing else None

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {"writer": self.writer, "parallelism": self.parallelism, "step": CRASH_STEP, "ops": self.ops,
                "rank_ops": {str(r): ops for r, ops in self.rank_ops.items()}, "crash_points": len(self.rows),
                "failures": len(self.failures), "first_failure": first.to_json() if first else None,
                "golden_dir": self.golden_dir, "rows": [r.to_json() for r in self.rows]}


def crash_point_spec(writer: str, op_index: int, when: str, run_dir: Path) -> JobSpec:
    cfg = TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer})
    return JobSpec(config=cfg, world_sizes=WORLD_SIZES, plan=crash_plan(op_index, when),
                   hang_timeout_s=HANG_TIMEOUT_S, run_dir=run_dir)


def sweep_row(op_index: int, op: str, when: str, judged: JudgedRun, rank: int = 0) -> SweepRow:
    judgement = judged.judgement
    failing = [name for name, v in judgement.verdicts.items() if v.valid is False]
    unknown = [name for name, v in judgement.verdicts.items() if v.valid not in (True, False)]
    unknown += ["unfired"] if judgement.unfired_faults else []
    first = next((judgement.verdicts[name].summary for name in failing + unknown if name in judgement.verdicts), "")
    return SweepRow(op_index, op, when, judgement.valid, failing, unknown, str(judged.record.run_dir),
                    judged.record.outcome, first, rank)


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


# ----- the sweep of a sharded (FSDP) save: every rank crashes at each of its own ops -------

def sharded_config(writer: str) -> TrainConfig:
    return TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer, "parallelism": "fsdp"})


def observe_sharded(writer: str, run_dir: Path) -> dict[int, list[Op]]:
    """One clean FSDP job whose ranks record their own mutating ops of the save at CRASH_STEP."""
    record = run_job(JobSpec(config=sharded_config(writer), world_sizes=WORLD_SIZES, hang_timeout_s=HANG_TIMEOUT_S,
                             run_dir=run_dir, keep=True,
                             hooks_factory="trainwreck.faults.sweep:sharded_recording_hooks"))
    if record.outcome != "completed":
        raise RuntimeError(f"the observed sharded run of {writer} did not complete ({record.outcome}): see {run_dir}")
    ops = load_rank_ops(record.run_dir)
    if sorted(ops) != list(range(WORLD_SIZES[0])) or not all(ops.values()):
        raise RuntimeError(f"the observed sharded run recorded save ops for ranks {sorted(ops)}, not every one of "
                           f"{WORLD_SIZES[0]}: see {run_dir}")
    return ops


def run_sharded_sweep(writer: str = "reference", out: Path | None = None, progress: Say | None = None,
                      points: Iterable[tuple[int, int, str]] | None = None, golden_cache: Path | None = None,
                      observed: dict[int, list[Op]] | None = None) -> SweepResult:
    """Crash each rank of an FSDP job at each of its own mutating ops of the save at
    CRASH_STEP (before, after, torn for a write), DCP's `.metadata` write and rename
    included; every crash point is a job judged by every invariant. `points`: only these
    (rank, op_index, when); `observed`: ops already recorded by observe_sharded (else one
    observed job records them). Runs go under out/fsdp-<writer>/."""
    say = progress or (lambda _line: None)
    base = (Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="trainwreck-sweep-"))) / f"fsdp-{writer}"
    ops = observed if observed is not None else observe_sharded(writer, base / "observed")
    result = SweepResult(writer, [describe(o) for o in ops[0]], parallelism="fsdp",
                         rank_ops={r: [describe(o) for o in rank_ops] for r, rank_ops in ops.items()})
    say(f"fsdp {writer}: the save at step {CRASH_STEP} does "
        + ", ".join(f"{len(o)} mutating storage ops on rank {r}" for r, o in sorted(ops.items())))
    wanted = set(points) if points is not None else None
    todo = [p for p in rank_crash_points(ops) if wanted is None or (p[0], p[1], p[3]) in wanted]
    for n, (rank, index, op, when) in enumerate(todo, 1):
        spec = JobSpec(config=sharded_config(writer), world_sizes=WORLD_SIZES, plan=crash_plan(index, when, rank),
                       hang_timeout_s=HANG_TIMEOUT_S, run_dir=base / f"r{rank}-op{index:02d}-{when}")
        judged = run_judged(spec, golden_cache=golden_cache, reproduce=(
            f"trainwreck sweep --parallelism fsdp --writer {writer} --points r{rank}:{index}:{when}"))
        result.golden_dir = str(judged.golden_dir)
        row = sweep_row(index, op, when, judged, rank)
        result.rows.append(row)
        detail = f" ({', '.join(row.failing + row.unknown)}: {row.summary})" if row.failing or row.unknown else ""
        say(f"[{n}/{len(todo)}] fsdp {writer}: rank {rank} crash {when} op {index} {op}: "
            f"{verdict_word(row.verdict)}{detail}")
    return result


# ----- DCP's own writer on its own: what its commit protocol guarantees on a process crash --

def run_dcp_crash_sweep(layout: str = "dcp", out: Path | None = None, progress: Say | None = None,
                        points: Iterable[tuple[int, str]] | None = None) -> SweepResult:
    """Crash torch.distributed.checkpoint's own save (no trainwreck pointer, no manifest) at
    each of its mutating ops, in-process, and judge what is left by loading it
    (faults/dcpcrash.py). `layout`: "dcp" (a new directory per save) or "dcp_in_place"
    (every save into one directory). Each crash point's directory gets verdicts.json."""
    from trainwreck.faults.dcpcrash import DCP_LAYOUTS, crash_dcp_save, judge_dcp_crash, record_dcp_ops

    say = progress or (lambda _line: None)
    base = (Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="trainwreck-sweep-"))) / layout
    ops = record_dcp_ops(base / "observed", layout)
    result = SweepResult(layout, mutating_ops(ops), parallelism="dcp")
    say(f"{layout} ({DCP_LAYOUTS[layout]}): the DCP save at step {CRASH_STEP} does {len(result.ops)} mutating ops")
    wanted = set(points) if points is not None else None
    todo = [p for p in crash_points(ops) if wanted is None or (p[0], p[2]) in wanted]
    for n, (index, op, when) in enumerate(todo, 1):
        run_dir = base / f"op{index:02d}-{when}"
        details, returned = crash_dcp_save(run_dir / "checkpoints", layout, index, when)
        valid, why = judge_dcp_crash(run_dir / "checkpoints", layout, returned)
        if not details:  # the crash never happened: nothing was judged
            valid, why = "unknown", f"the crash at op {index} ({when}) never fired"
        (run_dir / "verdicts.json").write_text(json.dumps(
            {"valid": valid, "why": why, "fault": details, "layout": layout,
             "reproduce": f"trainwreck sweep --writer {layout} --points {index}:{when}"}, indent=1) + "\n")
        row = SweepRow(index, op, when, valid, ["dcp_load"] if valid is False else [],
                       ["unfired"] if valid == "unknown" else [], str(run_dir),
                       "crashed" if details else "completed", "" if valid is True else why)
        result.rows.append(row)
        say(f"[{n}/{len(todo)}] {layout}: crash {row.label}: {verdict_word(valid)}"
            + ("" if valid is True else f" ({why})"))
    return result


# ----- the power-loss sweep ------------------------------------------------------------------

POWER_LOSS_SEED = 0
POWER_LOSS_CAP = 16
"""Crash points with more combinations than this are sampled this many times (seeded)."""


@dataclass(frozen=True)
class PowerLossRow:
    state: int
    """0-based index among the explored (distinct) crash states."""
    point: int
    """The power failed after this many recorded ops (of every save of the job)."""
    description: str
    """The crash state in words: the last op issued, what was lost and what was torn."""
    kept: list[str]
    lost: list[str]
    torn: list[str]
    verdict: Any
    failing: list[str]
    unknown: list[str]
    run_dir: str
    report: str
    outcome: str
    summary: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "point": self.point, "description": self.description, "kept": self.kept,
                "lost": self.lost, "torn": self.torn, "verdict": self.verdict, "valid": self.verdict is True,
                "failing": self.failing, "unknown": self.unknown, "run_dir": self.run_dir, "report": self.report,
                "outcome": self.outcome, "summary": self.summary}


@dataclass
class PowerLossResult:
    writer: str
    ops: int
    """Low-level ops recorded over every save of the observed run."""
    stats: str
    """How the states were generated: crash points, sampled, generated, duplicates, explored."""
    explored: int
    observed_dir: str
    rows: list[PowerLossRow] = field(default_factory=list)

    @property
    def failures(self) -> list[PowerLossRow]:
        return [r for r in self.rows if r.verdict is not True]

    @property
    def first_failure(self) -> PowerLossRow | None:
        """The failing state with the earliest power cut."""
        return min(self.failures, key=lambda r: (r.point, r.state), default=None)

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {"writer": self.writer, "ops": self.ops, "stats": self.stats, "explored": self.explored,
                "judged": len(self.rows), "failures": len(self.failures), "observed_dir": self.observed_dir,
                "first_failure": first.to_json() if first else None, "rows": [r.to_json() for r in self.rows]}


def observe(writer: str, run_dir: Path) -> tuple[Path, OpLog]:
    """One clean run of the job, its rank 0's storage ops recorded in-rank, every save of it."""
    cfg = TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer})
    record = run_job(JobSpec(config=cfg, world_sizes=WORLD_SIZES, hang_timeout_s=HANG_TIMEOUT_S, run_dir=run_dir,
                             keep=True, hooks_factory="trainwreck.faults.powerloss:recording_hooks"))
    if record.outcome != "completed":
        raise RuntimeError(f"the observed run of {writer} did not complete ({record.outcome}): see {run_dir}")
    return record.run_dir, load_oplog(RunDir(record.run_dir).root / OPS_DIR / "ops-a000.jsonl")


def cut_time(log: OpLog, point: int, observed: Path) -> float:
    """The moment of the power cut: just before op `point` was issued; after the last op,
    just before the first rank exited (the job had finished its work)."""
    if point < len(log.ops):
        return log.ops[point].t
    exits = [e["t"] for e in iter_events(observed, batches=False) if e.get("kind") == "exit"]
    return min(exits, default=float("inf"))


def events_seen(log: OpLog, observed: Path) -> Callable[[int], int]:
    """crash point -> how many events the observer had by then: states with one tree but a
    different log (a save announced or not yet) are judged apart."""
    times = sorted(e["t"] for path in RunDir(observed).events.glob("*.jsonl")
                   for line in path.read_text().splitlines() if line.strip() and "t" in (e := json.loads(line)))
    seen = [bisect.bisect_left(times, cut_time(log, point, observed)) for point in range(len(log.ops) + 1)]
    return seen.__getitem__


def cut_events(observed: Path, dest: Path, before: float) -> None:
    """Copy every event log, keeping the events written before the cut: the log was shipped
    off the machine as it was written, so the power cut takes nothing from it."""
    target = RunDir(dest).events
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(RunDir(observed).events.glob("*.jsonl")):
        kept = [line for line in path.read_text().splitlines(keepends=True)
                if line.strip() and json.loads(line).get("t", float("inf")) < before]
        if kept:
            (target / path.name).write_text("".join(kept))


def crash_run_dir(observed: Path, log: OpLog, state: CrashState, dest: Path) -> Path:
    """A run directory as the power cut left it: checkpoints from the crash state, events cut."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists: the power-loss sweep writes each state into a fresh directory")
    materialise(state, RunDir(dest).checkpoints)
    cut_events(observed, dest, cut_time(log, state.point, observed))
    return dest


def power_loss_row(n: int, state: CrashState, judged: JudgedRun) -> PowerLossRow:
    row = sweep_row(state.point, "", "power", judged)
    report = str(RunDir(judged.record.run_dir).report_file("report.html"))
    return PowerLossRow(n, state.point, state.in_words(), state.kept, state.lost, state.torn_ops, row.verdict,
                        row.failing, row.unknown, row.run_dir, report, row.outcome, row.summary)


def spread(states: list[CrashState], limit: int | None) -> list[tuple[int, CrashState]]:
    """(index, state) of at most `limit` states, spread evenly over the explored ones."""
    picked = list(enumerate(states))
    if limit is not None and limit < len(picked):
        picked = [picked[i * len(picked) // limit] for i in range(limit)]
    return picked


def run_power_loss_sweep(writer: str = "reference", out: Path | None = None, progress: Say | None = None,
                         seed: int = POWER_LOSS_SEED, cap: int = POWER_LOSS_CAP, limit: int | None = None,
                         golden_cache: Path | None = None) -> PowerLossResult:
    """Record every save of one clean run, generate the crash states a power cut can leave
    (faults/powerloss.py), and resume the job from each one as its next attempt, judged by
    every invariant. `limit`: judge only that many states, spread evenly over the explored ones."""
    base = (Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="trainwreck-powerloss-"))) / writer
    observed, log = observe(writer, base / "observed")
    cfg = TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer})

    def resume(run_dir: Path, n: int) -> JudgedRun:
        spec = JobSpec(config=cfg, world_sizes=WORLD_SIZES, hang_timeout_s=HANG_TIMEOUT_S, run_dir=run_dir, keep=True)
        return run_judged(spec, golden_cache=golden_cache,
                          reproduce=f"trainwreck sweep --power-loss --writer {writer} (state {n}, seed {seed})",
                          resume=True)

    return judge_power_cuts(writer, observed, log, base, resume, progress, seed, cap, limit)


def judge_power_cuts(writer: str, observed: Path, log: OpLog, base: Path, resume: Callable[[Path, int], JudgedRun],
                     progress: Say | None, seed: int, cap: int, limit: int | None, scope: str = "") -> PowerLossResult:
    """The crash states of one recorded job (faults/powerloss.py), each materialised as the run
    directory the power cut left and resumed by `resume(run_dir, state_number)`; one row each."""
    say = progress or (lambda _line: None)
    states, stats = crash_states(log, seed=seed, cap=cap, epoch=events_seen(log, observed))
    result = PowerLossResult(writer, len(log.ops), stats.describe(), len(states), str(observed))
    say(f"{writer}: {len(log.ops)} recorded ops over the job's saves{scope}; {stats.describe()}")
    picked = spread(states, limit)
    for k, (n, state) in enumerate(picked, 1):
        row = power_loss_row(n, state, resume(crash_run_dir(observed, log, state, base / f"state{n:03d}"), n))
        result.rows.append(row)
        detail = f" ({', '.join(row.failing + row.unknown)}: {row.summary})" if row.failing or row.unknown else ""
        say(f"[{k}/{len(picked)}] {writer}: state {n} (power cut after op {state.point}, {len(row.lost)} ops lost, "
            f"{len(row.torn)} torn): {verdict_word(row.verdict)}{detail}")
    return result


DCP_WRITER = "dcp"
"""torch.distributed.checkpoint's own FileSystemWriter commit: not a trainer variant, so its
states are judged by loading the checkpoints (faults/powerloss.py judge_dcp_state)."""


def run_dcp_power_loss(out: Path | None = None, progress: Say | None = None, seed: int = POWER_LOSS_SEED,
                       cap: int = POWER_LOSS_CAP, limit: int | None = None) -> PowerLossResult:
    """DCP's save recorded in-process through the same recorder, every crash state judged by
    loading: the earlier checkpoint always, the new one once dcp.save returned or its
    .metadata is on disk. Each state's directory gets verdicts.json (the row's report)."""
    say = progress or (lambda _line: None)
    base = (Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="trainwreck-powerloss-"))) / DCP_WRITER
    log = record_dcp_save(base / "observed")
    returned = len(log.ops)
    states, stats = crash_states(log, seed=seed, cap=cap, epoch=lambda point: point == returned)
    result = PowerLossResult(DCP_WRITER, len(log.ops), stats.describe(), len(states), str(base / "observed"))
    say(f"{DCP_WRITER}: {len(log.ops)} recorded ops of one dcp.save; {stats.describe()}")
    picked = spread(states, limit)
    for k, (n, state) in enumerate(picked, 1):
        run_dir = base / f"state{n:03d}"
        valid, why = judge_dcp_state(state, state.point == returned, run_dir / "checkpoints")
        report = run_dir / "verdicts.json"
        report.write_text(json.dumps({"valid": valid, "why": why, "state": state.in_words()}, indent=1) + "\n")
        result.rows.append(PowerLossRow(n, state.point, state.in_words(), state.kept, state.lost, state.torn_ops,
                                        valid, [] if valid else ["dcp_load"], [], str(run_dir), str(report),
                                        "loaded" if valid else "load_failed", "" if valid else why))
        say(f"[{k}/{len(picked)}] {DCP_WRITER}: state {n} (power cut after op {state.point}): "
            f"{verdict_word(valid)}{'' if valid else f' ({why})'}")
    return result


# ----- the framework writers: their own saves, judged by resuming their own scripts ----------


@dataclass(frozen=True)
class ForeignWriter:
    """A framework's example trainer (trainer/frameworks/examples), run through `trainwreck run
    --cmd`'s launcher; its saves are the framework's own code, recorded in its ranks."""

    name: str
    module: str
    """The import whose absence means the extra is not installed."""
    extra: str
    script: str
    args: tuple[str, ...]
    """Every attempt gets the same arguments: the script resumes from what it finds, if anything."""

    @property
    def install(self) -> str:
        return f"pip install 'trainwreck[{self.extra}]'"

    def installed(self) -> bool:
        import importlib.util

        return importlib.util.find_spec(self.module) is not None


FOREIGN_STEPS, FOREIGN_DATASET, FOREIGN_BATCH = 12, 64, 8
"""The example trainers' job (harness/suites/frameworks.py uses the same): 12 updates of 8 over 64 samples."""
FOREIGN_WRITERS: dict[str, ForeignWriter] = {w.name: w for w in (
    ForeignWriter("lightning", "lightning", "lightning", "lightning_train.py",
                  ("--steps", "12", "--global-batch", "8", "--save-every", "4", "--resume")),
    ForeignWriter("accelerate", "accelerate", "accelerate", "accelerate_train.py",
                  ("--steps", "12", "--global-batch", "8", "--save-every", "3", "--resume")),
    ForeignWriter("hf", "transformers", "hf", "hf_trainer.py", ("--total-steps", "12", "--save-steps", "4")),
)}
FOREIGN_LIMIT = 4
"""Default --limit of a framework writer: each state is a 2-rank resume that imports the
framework (5-10 s a rank on 2 shared cores)."""
FOREIGN_HANG_TIMEOUT_S = 30.0
"""As `trainwreck run --cmd`'s default: a framework imports itself after its first progress record."""


class ForeignWriterMissing(RuntimeError):
    """The framework of a writer is not installed; the message says how to install it."""


def foreign_command(writer: ForeignWriter, record: bool) -> str:
    """The command per rank: the example script under faults/foreign_record.py's wrapper, which
    records with `record` and writes run.json's dataset fields before the script starts. The
    Lightning and accelerate scripts never write them, and HF's adapter only once training
    begins: a resume that dies loading a torn checkpoint would leave the run unjudgeable
    (a resumed --cmd run's run.json is rewritten from the spec, without an earlier attempt's)."""
    import shlex
    import sys

    from trainwreck.harness.suites.frameworks import SCRIPTS

    sizes = ["--dataset-size", str(FOREIGN_DATASET), "--global-batch", str(FOREIGN_BATCH),
             "--total-steps", str(FOREIGN_STEPS)]
    return shlex.join([sys.executable, "-m", "trainwreck.faults.foreign_record", *(["--record"] if record else []),
                       *sizes, "--", str(SCRIPTS / writer.script), *writer.args])


def foreign_spec(writer: ForeignWriter, run_dir: Path, record: bool = False) -> JobSpec:
    from trainwreck.harness.supervise.cmd import Command

    return JobSpec(target=Command(foreign_command(writer, record)), world_sizes=(2,),
                   hang_timeout_s=FOREIGN_HANG_TIMEOUT_S, run_dir=run_dir, keep=True, max_restarts=2)


def observe_foreign(writer: ForeignWriter, run_dir: Path) -> tuple[Path, OpLog]:
    """One clean 2-rank run of the framework's script, every rank's file operations under
    its checkpoint folder recorded in the rank (faults/foreign_record.py)."""
    from trainwreck.faults.foreign_record import load_foreign_oplog

    record = run_job(foreign_spec(writer, run_dir, record=True))
    if record.outcome != "completed":
        raise RuntimeError(f"the observed run of {writer.name} did not complete ({record.outcome}): "
                           f"see {RunDir(run_dir).logs}")
    return record.run_dir, load_foreign_oplog(RunDir(record.run_dir).root / OPS_DIR)


def judge_resumed_cmd(spec: JobSpec, golden_cache: Path | None, reproduce: str) -> JudgedRun:
    """Resume a --cmd job in spec.run_dir (a crash state) as its next attempt and judge it
    against the command's golden run, as `trainwreck run --cmd` judges any run."""
    return run_judged(spec, golden_cache=golden_cache, reproduce=reproduce, resume=True)


def run_foreign_power_loss(name: str, out: Path | None = None, progress: Say | None = None,
                           seed: int = POWER_LOSS_SEED, cap: int = POWER_LOSS_CAP, limit: int | None = FOREIGN_LIMIT,
                           golden_cache: Path | None = None) -> PowerLossResult:
    """A framework writer's power-loss sweep: record every save of one clean run of its
    script, generate the crash states (faults/powerloss.py, unchanged), and resume the
    script from each one as the job's next attempt, judged by every invariant."""
    writer = FOREIGN_WRITERS[name]
    if not writer.installed():
        raise ForeignWriterMissing(f"--writer {name}: {writer.module} is not installed; {writer.install}")
    base = (Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="trainwreck-powerloss-"))) / name
    observed, log = observe_foreign(writer, base / "observed")

    def resume(run_dir: Path, n: int) -> JudgedRun:
        return judge_resumed_cmd(foreign_spec(writer, run_dir), golden_cache,
                                 f"trainwreck sweep --power-loss --writer {name} (state {n}, seed {seed})")

    return judge_power_cuts(name, observed, log, base, resume, progress, seed, cap, limit, " (every rank)")
