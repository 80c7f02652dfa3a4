"""The sweeps as one suite: crash one save at each of its storage operations, or cut the power
under every save of a job, and judge every point as a real run through the same run-and-judge
path as any other run (each gets its verdicts.json, written by harness/judge/runner.py `publish`).

    result = run_sweep(SweepRequest("reference"), out=Path("out/sweep"), progress=print)
    result.first_failure      # None, or the first point that broke an invariant
    result.to_json()          # {"writer", "ops", "rows": [one per point], ...}

A `SweepRequest` declares what to sweep (writer, parallelism, points, power loss, limit, seed);
`sweep_for` picks the one `Sweep` that runs it, and every kind returns the same `SweepResult`,
whose rows are crash points or power-loss states. A user's `--cmd` and the framework writers'
crash-every-op sweeps are rows of the frameworks table (harness/suites/frameworks.py): the request
says so (`request.table`) and the command publishes them with that table.

The fault side (recording the save, naming crash points, the crash plan, the crash states) is
faults/sweep.py, faults/powerloss.py and faults/dcpcrash.py.
"""
from __future__ import annotations

import bisect
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from trainwreck.faults.sweep import (CRASH_STEP, HANG_TIMEOUT_S, SWEEP_CONFIG, WORLD_SIZES, crash_plan, describe,
                                     load_rank_ops, mutating_ops, rank_crash_points, record_save_ops)
from trainwreck.faults.powerloss import (OPS_DIR, CrashState, LowOp, OpLog, crash_states, judge_dcp_state, load_oplog,
                                        materialise, record_dcp_save)
from trainwreck.faults.storage import Op
from trainwreck.harness.errors import InputError
from trainwreck.harness.supervise.supervisor import RunRecord
from trainwreck.harness.judge.runner import JudgedRun, publish, run_judged
from trainwreck.harness.suites.frameworks import (DATASET, FRAMEWORKS, GLOBAL_BATCH, SCRIPTS, STEPS, SWEEP_WRITERS,
                                                  Framework)
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.invariants import Judgement
from trainwreck.invariants.verdict import UNKNOWN, Validity, Verdict, compose, verdict_word
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.trainer.config import TrainConfig
from trainwreck.rundir.layout import RunDir, iter_events

Say = Callable[[str], None]
"""Where progress lines go (print, a list's append, ...)."""
CrashPoint = tuple[int, int, str]
"""(rank, op_index, when): one process-crash point; a DDP or DCP save's writer is rank 0."""

POWER_LOSS_SEED = 0
POWER_LOSS_CAP = 16
"""Crash points with more combinations than this are sampled this many times (seeded)."""
POWER = "power"
"""The `when` of a power-loss state's row: the power failed, no process crashed."""
WHEN_ORDER = {"before": 0, "after": 1, "torn": 2, POWER: 3}
DCP_WRITER = "dcp"
"""torch.distributed.checkpoint's own FileSystemWriter commit: not a trainer variant, so its
points are judged by loading the checkpoints (faults/dcpcrash.py, faults/powerloss.py)."""
DCP_LOAD = "dcp_load"
"""The one check of DCP's own save: its checkpoints load as written."""


# ----- what to sweep, and what came of it -----------------------------------------------------

def writer_variants() -> list[str]:
    """The reference and the planted defects that write checkpoints their own way: a checkpoint
    store of their own, or their own save or shard commit. The other defects change what is
    trained or saved, not how it is written, so a crash sweep of their save is the reference's."""
    from trainwreck.trainer.entry import VARIANTS
    from trainwreck.trainer.loop import Trainer

    seams = ("store_class", "save", "shard_manifest_files")
    return [name for name, cls in VARIANTS.items()
            if cls is Trainer or any(getattr(cls, seam) is not getattr(Trainer, seam) for seam in seams)]


def writers_sentence() -> str:
    """Every --writer, by what it sweeps (the help and the refusal say the same)."""
    from trainwreck.faults.dcpcrash import DCP_LAYOUTS

    defects = [name for name in writer_variants() if name != "reference"]
    return (f"writers: reference (the default) and the planted defects of its writer {', '.join(defects)}; "
            f"DCP's own save {', '.join(DCP_LAYOUTS)} ({DCP_WRITER} alone with --power-loss); a framework's own "
            f"save is --framework {'|'.join(SWEEP_FRAMEWORKS)}")


def frameworks_sentence() -> str:
    """Every --framework, by what it sweeps (the help and the refusal say the same)."""
    return (f"frameworks: {', '.join(SWEEP_FRAMEWORKS)} (their own save crashed at every file operation); "
            f"with --power-loss {', '.join(FOREIGN_WRITERS)}")


@dataclass(frozen=True)
class SweepRequest:
    """One sweep, declared; `check` refuses what cannot run before anything starts."""

    writer: str = "reference"
    """A trainer variant, or dcp / dcp_in_place (DCP's own save)."""
    parallelism: str = "ddp"
    """ddp: rank 0 writes the checkpoint; fsdp: every rank writes its own shards."""
    points: tuple[CrashPoint, ...] | None = None
    """Only these process-crash points; None: every one."""
    power_loss: bool = False
    limit: int | None = None
    """Power loss: judge at most this many states, spread evenly (None: all; FOREIGN_LIMIT for a framework)."""
    seed: int = POWER_LOSS_SEED
    cap: int = POWER_LOSS_CAP
    cmd: str | None = None
    """A user's own training command: its save crashed at every recorded file operation."""
    framework: str | None = None
    """A framework's own save (SWEEP_FRAMEWORKS), run by its example script, instead of the trainer's."""
    golden_cache: Path | None = None
    observed: dict[int, list[Op]] | None = field(default=None, compare=False, repr=False)
    """FSDP: each rank's ops already recorded by observe_sharded (else one observed job records them)."""

    @property
    def dcp_own(self) -> bool:
        """DCP's own save: `dcp` always, `dcp_in_place` for process crashes."""
        from trainwreck.faults.dcpcrash import DCP_LAYOUTS

        return self.writer == DCP_WRITER or (self.writer in DCP_LAYOUTS and not self.power_loss)

    @property
    def table(self) -> bool:
        """A frameworks-table sweep: a user's --cmd, or a framework's own save crashed at every op."""
        return self.cmd is not None or (self.framework is not None and not self.power_loss)

    def check(self) -> None:
        """Raise InputError naming the fix when this request cannot run (nothing has started)."""
        if self.cmd is not None:
            return self._check_command()
        if self.framework is not None:
            return self._check_framework()
        self._check_writer()
        if self.power_loss:
            self._check_power_loss()

    def _check_command(self) -> None:
        self._refuse(("--writer", self.writer != "reference"), ("--framework", self.framework is not None),
                     ("--power-loss", self.power_loss),
                     ("--points", self.points is not None), ("--parallelism", self.parallelism != "ddp"),
                     why="does not apply to --cmd: the command's own save is crashed at every file operation "
                         "its golden run recorded; leave it out")
        if not (self.cmd or "").strip():
            raise InputError("--cmd is empty; give e.g. --cmd 'python train.py'")

    def _check_framework(self) -> None:
        names = FOREIGN_WRITERS if self.power_loss else SWEEP_FRAMEWORKS
        if self.framework not in names:
            sweep = "power-loss" if self.power_loss else "crash"
            raise InputError(f"--framework {self.framework!r} is not a framework the {sweep} sweep takes; "
                             f"{frameworks_sentence()}")
        self._refuse(("--writer", self.writer != "reference"), ("--points", self.points is not None),
                     ("--parallelism", self.parallelism != "ddp"),
                     why=f"does not apply to --framework {self.framework}: the framework's own save is swept, "
                         "by its own example script; leave it out")
        if self.power_loss:
            self._check_power_loss()

    @staticmethod
    def _refuse(*flags: tuple[str, bool], why: str) -> None:
        given = [flag for flag, present in flags if present]
        if given:
            raise InputError(f"{given[0]} {why}")

    def _check_writer(self) -> None:
        if not self.dcp_own:  # DCP's own commit is no trainer variant
            if self.writer in SWEEP_FRAMEWORKS:
                raise InputError(f"--writer {self.writer} names a framework, not a writer of the reference trainer; "
                                 f"use --framework {self.writer}")
            if self.writer not in writer_variants():
                sweep = "power-loss" if self.power_loss else "crash"
                raise InputError(f"--writer {self.writer!r} is not a writer the {sweep} sweep takes; {writers_sentence()}")
        if self.dcp_own and self.parallelism != "ddp":
            raise InputError(f"--writer {self.writer} sweeps DCP's own save in one process; leave out --parallelism")

    def _check_power_loss(self) -> None:
        if self.parallelism != "ddp":
            raise InputError("--power-loss with --parallelism fsdp is not implemented (the power-loss sweep records "
                             "rank 0's saves only); leave out --parallelism, or use --writer dcp for DCP's own "
                             "commit under power loss")
        if self.points is not None:
            raise InputError("--points names process-crash points; with --power-loss use --limit N")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"--limit {self.limit} judges nothing; give --limit 1 or more")
        writer = FOREIGN_WRITERS.get(self.framework or "")
        if writer is not None and not writer.installed():
            raise FrameworkMissing(f"--framework {self.framework}: {writer.module} is not installed; {writer.install}")


@dataclass(frozen=True)
class SweepRow:
    """One judged point: a process crash (before, after or torn at one op of one rank) or a
    power-loss state (`when` is POWER, `op_index` the cut point, the state's fields filled)."""

    op_index: int
    """Crash: 0-based index among the save's mutating storage ops; power loss: the cut point."""
    op: str
    """The op, e.g. 'rename(.tmp-step-00000016-PID, step-00000016)' (empty for a power cut)."""
    when: str
    """before, after, torn, or power."""
    verdict: Validity
    """The judgement: True (valid), False (invalid) or "unknown"."""
    failing: list[str]
    """Invariants judged invalid."""
    unknown: list[str]
    """Invariants judged unknown (and 'unfired' when the crash never happened)."""
    run_dir: str
    outcome: str
    """The harness outcome of the job (completed, budget_exhausted, ...; DCP's own: crashed, loaded, ...)."""
    summary: str = ""
    """The first failing invariant's one-line summary."""
    rank: int = 0
    """The rank that crashed (a DDP save's writer is rank 0; a sharded save has one per rank)."""
    state: int = -1
    """Power loss: 0-based index among the explored (distinct) crash states."""
    description: str = ""
    """Power loss: the state in words: the last op issued, what was lost and what was torn."""
    kept: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    report: str = ""
    """The row's report (report.html; verdicts.json where no job ran to render one)."""

    @property
    def power_loss(self) -> bool:
        return self.when == POWER

    @property
    def point(self) -> int:
        """Power loss: the power failed after this many recorded ops (of every save of the job)."""
        return self.op_index

    @property
    def label(self) -> str:
        if self.power_loss:
            return (f"state {self.state} (power cut after op {self.point}, {len(self.lost)} ops lost, "
                    f"{len(self.torn)} torn)")
        return f"{self.when} op {self.op_index} {self.op}" + (f" of rank {self.rank}" if self.rank else "")

    def to_json(self) -> dict[str, Any]:
        judged = {"verdict": self.verdict, "failing": self.failing, "unknown": self.unknown, "run_dir": self.run_dir}
        if self.power_loss:
            return {"state": self.state, "point": self.point, "description": self.description, "kept": self.kept,
                    "lost": self.lost, "torn": self.torn, **judged, "valid": self.verdict is True,
                    "report": self.report, "outcome": self.outcome, "summary": self.summary}
        return {"rank": self.rank, "op_index": self.op_index, "op": self.op, "when": self.when, **judged,
                "outcome": self.outcome, "summary": self.summary}


@dataclass
class SweepResult:
    writer: str
    ops: list[str]
    """Crash: the recorded mutating ops of the save, in order; power loss: every recorded low-level op."""
    power_loss: bool = False
    parallelism: str = "ddp"
    """ddp, fsdp, or dcp (DCP's own save in one process)."""
    rank_ops: dict[int, list[str]] = field(default_factory=dict)
    """A sharded save: each rank's own recorded mutating ops (`ops` is rank 0's)."""
    golden_dir: str = ""
    stats: str = ""
    """Power loss: how the states were generated: crash points, sampled, generated, duplicates, explored."""
    explored: int = 0
    observed_dir: str = ""
    rows: list[SweepRow] = field(default_factory=list)

    @property
    def failures(self) -> list[SweepRow]:
        return [r for r in self.rows if r.verdict is not True]

    @property
    def first_failure(self) -> SweepRow | None:
        """The failing point earliest in the save (rank, op index, then before/after/torn; a power
        cut: the earliest cut, then the state)."""
        return min(self.failures, key=lambda r: (r.rank, r.op_index, WHEN_ORDER[r.when], r.state), default=None)

    @property
    def valid(self) -> Validity:
        return compose(row.verdict for row in self.rows)

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        tail = {"failures": len(self.failures), "first_failure": first.to_json() if first else None}
        if self.power_loss:
            return {"writer": self.writer, "power_loss": True, "ops": len(self.ops), "stats": self.stats,
                    "explored": self.explored, "judged": len(self.rows), "failures": tail["failures"],
                    "observed_dir": self.observed_dir, "first_failure": tail["first_failure"],
                    "rows": [r.to_json() for r in self.rows]}
        return {"writer": self.writer, "power_loss": False, "parallelism": self.parallelism, "step": CRASH_STEP,
                "ops": self.ops, "rank_ops": {str(r): ops for r, ops in self.rank_ops.items()},
                "crash_points": len(self.rows), **tail, "golden_dir": self.golden_dir,
                "rows": [r.to_json() for r in self.rows]}


# ----- the one entry point ----------------------------------------------------------------------

class Sweep(Protocol):
    """One kind of sweep: where its runs go, and how every point of a request is judged."""

    def folder(self, request: SweepRequest) -> str:
        """The directory under OUT that holds this sweep's runs."""

    def run(self, request: SweepRequest, base: Path, say: Say) -> SweepResult:
        """Judge every point of `request` into `base`, one progress line each."""


def run_sweep(request: SweepRequest = SweepRequest(), out: Path | None = None,
              progress: Say | None = None) -> SweepResult:
    """Run the sweep `request` declares (`request.check()` first), every point a judged run
    under out/<folder>/ (a temporary directory when `out` is None)."""
    request.check()
    if request.table:
        raise InputError("a --cmd or framework writer's sweep is a frameworks-table run: "
                         "harness/suites/frameworks.py run_command_sweep / run_table runs it")
    sweep = sweep_for(request)
    prefix = "trainwreck-powerloss-" if request.power_loss else "trainwreck-sweep-"
    base = (Path(out) if out is not None else Path(tempfile.mkdtemp(prefix=prefix))) / sweep.folder(request)
    return sweep.run(request, base, progress or (lambda _line: None))


def sweep_for(request: SweepRequest) -> Sweep:
    """The one place a request picks its kind of sweep."""
    if request.power_loss:
        if request.framework is not None:
            return ForeignPowerLoss()
        return DcpPowerLoss() if request.writer == DCP_WRITER else PowerLoss()
    if request.dcp_own:
        return DcpCrash()
    return ShardedCrash() if request.parallelism == "fsdp" else ProcessCrash()


# ----- judging a point: every row comes from a JudgedRun that runner.publish wrote ---------------

def judged_fields(judged: JudgedRun) -> dict[str, Any]:
    """A row's verdict fields; the summary is the first failing or unknown invariant's, else the
    first note of a judgement that is not valid (a crash that never fired, a missing golden run)."""
    judgement = judged.judgement
    failing = [name for name, v in judgement.verdicts.items() if v.valid is False]
    unknown = [name for name, v in judgement.verdicts.items() if v.valid not in (True, False)]
    unknown += ["unfired"] if judgement.unfired_faults else []
    summaries = [judgement.verdicts[name].summary for name in failing + unknown if name in judgement.verdicts]
    summaries += judgement.notes[:1] if judgement.valid is not True else []
    return {"verdict": judgement.valid, "failing": failing, "unknown": unknown,
            "run_dir": str(judged.record.run_dir), "outcome": judged.record.outcome,
            "summary": summaries[0] if summaries else ""}


def sweep_row(op_index: int, op: str, when: str, judged: JudgedRun, rank: int = 0) -> SweepRow:
    return SweepRow(op_index, op, when, rank=rank, **judged_fields(judged))


def power_loss_row(n: int, state: CrashState, judged: JudgedRun) -> SweepRow:
    run_dir = RunDir(judged.record.run_dir)
    html = run_dir.report_file("report.html")
    return SweepRow(state.point, "", POWER, state=n, description=state.in_words(), kept=state.kept, lost=state.lost,
                    torn=state.torn_ops, report=str(html if html.is_file() else run_dir.verdicts),
                    **judged_fields(judged))


def publish_in_process(run_dir: Path, judgement: Judgement, outcome: str, reproduce: str, wall_s: float) -> JudgedRun:
    """DCP's own save runs in this process, no job: its judgement is published as every run's is
    (runner.publish writes verdicts.json), without a report (no events for one to read)."""
    # "completed": the save (crashed or cut as planned) and the judging load both ran to their end
    record = RunRecord(run_dir, "completed", outcome, attempts=1, final_step=CRASH_STEP, hangs=0, wall_s=wall_s)
    judged = JudgedRun(record, judgement, Path(""), reproduce)
    publish(judged, report=False)
    return judged


def dcp_judgement(valid: bool, why: str, evidence: list[str]) -> Judgement:
    return Judgement(valid, {DCP_LOAD: Verdict(DCP_LOAD, valid, why, evidence=evidence)})


def golden_text(golden_dir: Path) -> str:
    """The golden run's directory as the result names it; "" when the points had none (DCP's own)."""
    return "" if golden_dir == Path("") else str(golden_dir)


# ----- process crashes: one job (or one in-process save) per crash point --------------------------

Judge = Callable[[CrashPoint], JudgedRun]


def judge_crash_points(result: SweepResult, todo: list[tuple[int, int, str, str]],
                       points: tuple[CrashPoint, ...] | None, judge: Judge, name: str, say: Say) -> SweepResult:
    """Judge each (rank, op_index, op, when) of `todo` that `points` names (all when None), a row each."""
    wanted = set(points) if points is not None else None
    todo = [p for p in todo if wanted is None or (p[0], p[1], p[3]) in wanted]
    for n, (rank, index, op, when) in enumerate(todo, 1):
        judged = judge((rank, index, when))
        result.golden_dir = golden_text(judged.golden_dir)
        row = sweep_row(index, op, when, judged, rank)
        result.rows.append(row)
        say(f"[{n}/{len(todo)}] {name}: crash {row.label}: {verdict_word(row.verdict)}{detail(row)}")
    return result


def check_points(points: tuple[CrashPoint, ...] | None, todo: list[tuple[int, int, str, str]], name: str) -> None:
    """InputError, before any point runs, naming each --points entry the save has no crash point for
    and the points it has: a sweep of nothing would only say "0 crash points"."""
    have = {(rank, index, when) for rank, index, _, when in todo}
    missing = sorted(set(points or ()) - have)
    if not missing:
        return
    ranks = sorted({rank for rank, _, _ in have})
    ranges = "; ".join(_points_of(rank, have, len(ranks) > 1) for rank in ranks)
    raise InputError(f"--points {','.join(_spell(p) for p in missing)}: {name}'s save has no such crash point; "
                     f"it has {ranges}, e.g. --points {_spell(min(have))}")


def _points_of(rank: int, have: set[CrashPoint], name_rank: bool) -> str:
    indices = sorted({index for r, index, _ in have if r == rank})
    torn = sorted({index for r, index, when in have if r == rank and when == "torn"})
    return (f"{f'rank {rank}: ' if name_rank else ''}ops 0..{indices[-1]} before and after, "
            f"torn at {', '.join(map(str, torn)) or 'none'}")


def _spell(point: CrashPoint) -> str:
    """A crash point as --points spells it (rank 0 unnamed)."""
    rank, index, when = point
    return f"r{rank}:{index}:{when}" if rank else f"{index}:{when}"


def detail(row: SweepRow) -> str:
    return f" ({', '.join(row.failing + row.unknown)}: {row.summary})" if row.failing or row.unknown else ""


def crash_point_spec(writer: str, op_index: int, when: str, run_dir: Path) -> JobSpec:
    cfg = TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer})
    return JobSpec(config=cfg, world_sizes=WORLD_SIZES, plan=crash_plan(op_index, when),
                   hang_timeout_s=HANG_TIMEOUT_S, run_dir=run_dir)


class ProcessCrash:
    """A trainer variant's save on rank 0 of a DDP job, crashed at each of its mutating ops; each
    crash point a job judged against the reference trainer's cached golden run."""

    def folder(self, request: SweepRequest) -> str:
        return request.writer

    def run(self, request: SweepRequest, base: Path, say: Say) -> SweepResult:
        writer = request.writer
        ops = record_save_ops(writer)
        result = SweepResult(writer, mutating_ops(ops))
        check_points(request.points, rank_crash_points({0: ops}), writer)
        say(f"{writer}: the save at step {CRASH_STEP} does {len(result.ops)} mutating storage ops")

        def judge(point: CrashPoint) -> JudgedRun:
            _, index, when = point
            return run_judged(crash_point_spec(writer, index, when, base / f"op{index:02d}-{when}"),
                              golden_cache=request.golden_cache,
                              reproduce=f"trainwreck sweep --writer {writer} --points {index}:{when}")

        return judge_crash_points(result, rank_crash_points({0: ops}), request.points, judge, writer, say)


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


class ShardedCrash:
    """Each rank of an FSDP job crashed at each of its own mutating ops of the save at CRASH_STEP
    (DCP's `.metadata` write and rename included); every crash point a job judged by every invariant."""

    def folder(self, request: SweepRequest) -> str:
        return f"fsdp-{request.writer}"

    def run(self, request: SweepRequest, base: Path, say: Say) -> SweepResult:
        writer = request.writer
        ops = request.observed if request.observed is not None else observe_sharded(writer, base / "observed")
        result = SweepResult(writer, [describe(o) for o in ops[0]], parallelism="fsdp",
                             rank_ops={r: [describe(o) for o in rank_ops] for r, rank_ops in ops.items()})
        check_points(request.points, rank_crash_points(ops), f"fsdp {writer}")
        say(f"fsdp {writer}: the save at step {CRASH_STEP} does "
            + ", ".join(f"{len(o)} mutating storage ops on rank {r}" for r, o in sorted(ops.items())))

        def judge(point: CrashPoint) -> JudgedRun:
            rank, index, when = point
            spec = JobSpec(config=sharded_config(writer), world_sizes=WORLD_SIZES, plan=crash_plan(index, when, rank),
                           hang_timeout_s=HANG_TIMEOUT_S, run_dir=base / f"r{rank}-op{index:02d}-{when}")
            return run_judged(spec, golden_cache=request.golden_cache, reproduce=(
                f"trainwreck sweep --parallelism fsdp --writer {writer} --points r{rank}:{index}:{when}"))

        return judge_crash_points(result, rank_crash_points(ops), request.points, judge, f"fsdp {writer}", say)


class DcpCrash:
    """torch.distributed.checkpoint's own save (no trainwreck pointer, no manifest) crashed at each
    of its mutating ops, in-process, and judged by loading what is left (faults/dcpcrash.py).
    `writer`: dcp (a new directory per save) or dcp_in_place (every save into one directory)."""

    def folder(self, request: SweepRequest) -> str:
        return request.writer

    def run(self, request: SweepRequest, base: Path, say: Say) -> SweepResult:
        from trainwreck.faults.dcpcrash import DCP_LAYOUTS, record_dcp_ops

        layout = request.writer
        ops = record_dcp_ops(base / "observed", layout)
        result = SweepResult(layout, mutating_ops(ops), parallelism="dcp")
        check_points(request.points, rank_crash_points({0: ops}), layout)
        say(f"{layout} ({DCP_LAYOUTS[layout]}): the DCP save at step {CRASH_STEP} does {len(result.ops)} mutating ops")
        judge = lambda point: judge_dcp_crash_point(layout, base, point)  # noqa: E731
        return judge_crash_points(result, rank_crash_points({0: ops}), request.points, judge, layout, say)


def judge_dcp_crash_point(layout: str, base: Path, point: CrashPoint) -> JudgedRun:
    """Crash DCP's save at one point in this process, load what is left, publish the judgement."""
    from trainwreck.faults.dcpcrash import crash_dcp_save, judge_dcp_crash

    _, index, when = point
    run_dir, started = base / f"op{index:02d}-{when}", time.perf_counter()
    details, returned = crash_dcp_save(run_dir / "checkpoints", layout, index, when)
    valid, why = judge_dcp_crash(run_dir / "checkpoints", layout, returned)
    if details:
        judgement = dcp_judgement(valid, why, details)
    else:  # the crash never fired: nothing was tested
        judgement = Judgement(UNKNOWN, {}, [f"crash-{when}-op{index}"],
                              [f"the crash at op {index} ({when}) never fired"])
    return publish_in_process(run_dir, judgement, "crashed" if details else "completed",
                              f"trainwreck sweep --writer {layout} --points {index}:{when}",
                              time.perf_counter() - started)


# ----- power loss: every crash state a file system may leave, each judged ----------------------

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


def spread(states: list[CrashState], limit: int | None) -> list[tuple[int, CrashState]]:
    """(index, state) of at most `limit` states, spread evenly over the explored ones."""
    picked = list(enumerate(states))
    if limit is not None and limit < len(picked):
        picked = [picked[i * len(picked) // limit] for i in range(limit)]
    return picked


def low_op(op: LowOp) -> str:
    return f"{op.kind}({op.path}, {op.dst})" if op.dst else f"{op.kind}({op.path})"


JudgeState = Callable[[int, CrashState], JudgedRun]


def judge_power_cuts(writer: str, log: OpLog, epoch: Callable[[int], Any], observed: Path, judge: JudgeState,
                     request: SweepRequest, say: Say, scope: str, limit: int | None) -> SweepResult:
    """The crash states of one recorded job (faults/powerloss.py), at most `limit` of them judged
    by `judge(state_number, state)`; one row each. `scope`: what the recorded ops cover, in words."""
    states, stats = crash_states(log, seed=request.seed, cap=request.cap, epoch=epoch)
    result = SweepResult(writer, [low_op(op) for op in log.ops], power_loss=True, stats=stats.describe(),
                         explored=len(states), observed_dir=str(observed))
    say(f"{writer}: {len(log.ops)} recorded ops {scope}; {stats.describe()}")
    picked = spread(states, limit)
    for k, (n, state) in enumerate(picked, 1):
        row = power_loss_row(n, state, judge(n, state))
        result.rows.append(row)
        say(f"[{k}/{len(picked)}] {writer}: {row.label}: {verdict_word(row.verdict)}{detail(row)}")
    return result


class PowerLoss:
    """Every save of one clean run of a trainer variant recorded, and the job resumed from each
    crash state a power cut can leave as its next attempt, judged by every invariant."""

    def folder(self, request: SweepRequest) -> str:
        return request.writer

    def run(self, request: SweepRequest, base: Path, say: Say) -> SweepResult:
        writer = request.writer
        observed, log = observe(writer, base / "observed")
        cfg = TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer})

        def judge(n: int, state: CrashState) -> JudgedRun:
            spec = JobSpec(config=cfg, world_sizes=WORLD_SIZES, hang_timeout_s=HANG_TIMEOUT_S, keep=True,
                           run_dir=crash_run_dir(observed, log, state, base / f"state{n:03d}"))
            return run_judged(spec, golden_cache=request.golden_cache, resume=True, reproduce=(
                f"trainwreck sweep --power-loss --writer {writer} (state {n}, seed {request.seed})"))

        return judge_power_cuts(writer, log, events_seen(log, observed), observed, judge, request, say,
                                "over the job's saves", request.limit)


class DcpPowerLoss:
    """DCP's save recorded in-process through the same recorder, every crash state judged by
    loading: the earlier checkpoint always, the new one once dcp.save returned or its
    .metadata is on disk."""

    def folder(self, request: SweepRequest) -> str:
        return DCP_WRITER

    def run(self, request: SweepRequest, base: Path, say: Say) -> SweepResult:
        log = record_dcp_save(base / "observed")
        returned = len(log.ops)

        def judge(n: int, state: CrashState) -> JudgedRun:
            run_dir, started = base / f"state{n:03d}", time.perf_counter()
            valid, why = judge_dcp_state(state, state.point == returned, run_dir / "checkpoints")
            return publish_in_process(run_dir, dcp_judgement(valid, why, [state.in_words()]),
                                      "loaded" if valid else "load_failed",
                                      f"trainwreck sweep --power-loss --writer {DCP_WRITER} (state {n}, seed "
                                      f"{request.seed})", time.perf_counter() - started)

        return judge_power_cuts(DCP_WRITER, log, lambda point: point == returned, base / "observed", judge, request,
                                say, "of one dcp.save", request.limit)


# ----- the framework writers: their own saves, judged by resuming their own scripts ----------


SWEEP_FRAMEWORKS = tuple(FRAMEWORKS)
"""`--framework NAME`: a framework's own save crashed at every file operation (the frameworks table's
crash-every-op rows)."""
FOREIGN_WRITERS = SWEEP_WRITERS
"""`--framework NAME --power-loss`: the frameworks whose own saves are recorded and cut (declared with
each framework in harness/suites/frameworks.py)."""
FOREIGN_LIMIT = 4
"""Default --limit of a framework writer: each state is a 2-rank resume that imports the
framework (5-10 s a rank on 2 shared cores)."""
FOREIGN_HANG_TIMEOUT_S = 30.0
"""As `trainwreck run --cmd`'s default: a framework imports itself after its first progress record."""


class FrameworkMissing(InputError):
    """The framework of a writer is not installed; the message says how to install it (exit 2
    through the one exit path, before anything runs: `SweepRequest.check`)."""


def foreign_command(writer: Framework, record: bool) -> str:
    """The command per rank: the example script under faults/foreign_record.py's wrapper, which
    records with `record` and writes run.json's dataset fields before the script starts. The
    Lightning and accelerate scripts never write them, and HF's adapter only once training
    begins: a resume that dies loading a torn checkpoint would leave the run unjudgeable
    (a resumed --cmd run's run.json is rewritten from the spec, without an earlier attempt's)."""
    import shlex
    import sys

    sizes = ["--dataset-size", str(DATASET), "--global-batch", str(GLOBAL_BATCH), "--total-steps", str(STEPS)]
    return shlex.join([sys.executable, "-m", "trainwreck.faults.foreign_record", *(["--record"] if record else []),
                       *sizes, "--", str(SCRIPTS / writer.script), *writer.sweep_args])


def foreign_spec(writer: Framework, run_dir: Path, record: bool = False) -> JobSpec:
    from trainwreck.harness.supervise.command.target import Command

    return JobSpec(target=Command(foreign_command(writer, record)), world_sizes=(2,),
                   hang_timeout_s=FOREIGN_HANG_TIMEOUT_S, run_dir=run_dir, keep=True, max_restarts=2)


def observe_foreign(writer: Framework, run_dir: Path) -> tuple[Path, OpLog]:
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


class ForeignPowerLoss:
    """A framework writer's power-loss sweep: every save of one clean run of its script recorded
    in its ranks, and the script resumed from each crash state (faults/powerloss.py, unchanged)
    as the job's next attempt, judged by every invariant."""

    def folder(self, request: SweepRequest) -> str:
        return request.framework or ""

    def run(self, request: SweepRequest, base: Path, say: Say) -> SweepResult:
        name = request.framework or ""
        writer = FOREIGN_WRITERS[name]
        observed, log = observe_foreign(writer, base / "observed")

        def judge(n: int, state: CrashState) -> JudgedRun:
            spec = foreign_spec(writer, crash_run_dir(observed, log, state, base / f"state{n:03d}"))
            reproduce = f"trainwreck sweep --power-loss --framework {name} (state {n}, seed {request.seed})"
            return judge_resumed_cmd(spec, request.golden_cache, reproduce)

        limit = FOREIGN_LIMIT if request.limit is None else request.limit
        return judge_power_cuts(name, log, events_seen(log, observed), observed, judge, request, say,
                                "over the job's saves (every rank)", limit)
