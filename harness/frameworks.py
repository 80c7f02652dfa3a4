"""The frameworks table: frameworks x scenarios, each run judged, a report per run, a casebook.

    rows = run_table(out_dir, launcher)          # one Row per (framework, scenario) run
    rows_json(rows)                              # what `trainwreck frameworks --json` prints

A framework is an example trainer (a script using that framework's adapter) and the optional
extra it needs. A scenario is a list of attempts (world size, resume or not) and a fault plan;
what a fault needs to know about the framework (which save step, which file operation) is the
framework's, so scenarios ask the framework for it.

Running a job belongs to a ``Launcher``: it starts the command per rank with torchrun's
environment contract, one attempt after another, and leaves a run directory (run.json, events).
This module judges that directory with the unchanged invariants and renders its report. The
launcher for real runs is `trainwreck run --cmd`'s (branch `probe`); until it is merged,
``default_launcher`` says so and every row is "unknown" with that reason, never a pass.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from trainwreck.faults.foreign import WRITE_OPS
from trainwreck.invariants import judge, load_history
from trainwreck.invariants.verdict import UNKNOWN, Validity, compose

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "frameworks" / "scripts"
"""The example trainers (they ship with the repository, not the wheel: see docs/FRAMEWORKS.md)."""
STEPS, DATASET, GLOBAL_BATCH = 12, 64, 8


@dataclass(frozen=True)
class Attempt:
    world_size: int
    resume: bool = False


@dataclass(frozen=True)
class Job:
    """One framework run: the command per rank, the attempts, the plan, the run.json numbers."""

    framework: str
    scenario: str
    cmd: tuple[str, ...]
    resume_args: tuple[str, ...]
    attempts: tuple[Attempt, ...]
    faults: tuple[dict[str, Any], ...] = ()
    total_steps: int = STEPS
    dataset_size: int = DATASET
    global_batch: int = GLOBAL_BATCH
    env: tuple[tuple[str, str], ...] = ()


class Launcher(Protocol):
    def __call__(self, job: Job, run_dir: Path) -> None:
        """Run every attempt of `job` into `run_dir`; raise LauncherMissing if it cannot run at all."""


class LauncherMissing(RuntimeError):
    """No launcher can run foreign commands here (the row says why)."""


@dataclass(frozen=True)
class Framework:
    name: str
    module: str
    """The import name whose absence means the extra is not installed."""
    extra: str
    script: str
    args: tuple[str, ...] = ()
    resume_args: tuple[str, ...] = ("--resume",)
    save_step: int = 6
    """A save step of the example trainer that is not the job's first save."""
    kill_step: int = 5
    """An update after a save and inside an epoch (8 updates an epoch): a kill there is a mid-epoch resume."""
    kill_in_save: dict[str, Any] = field(default_factory=dict)
    """The fault fields that kill the writer inside the save at `save_step` (op index, when)."""
    newest_file: str = "last.ckpt"
    """What the corrupt-newest scenario truncates, relative to the checkpoint folder: the newest
    checkpoint when the kill at update 8 lands (the saves before it exist)."""

    @property
    def install(self) -> str:
        return f"pip install 'trainwreck[{self.extra}]'"

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None


FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework("lightning", "lightning", "lightning", "lightning_train.py", ("--save-every", "6"),
              kill_in_save={"op_index": 1, "when": "before"}, kill_step=7),
    Framework("accelerate", "accelerate", "accelerate", "accelerate_train.py", ("--save-every", "3"),
              kill_in_save={"op_index": 3, "when": "before"}, newest_file="checkpoint_1/model.safetensors"),
)}


def _kill(step: int) -> dict[str, Any]:
    return {"id": "kill-mid-epoch", "kind": "kill", "rank": 1, "step": step}


# scenario name -> (what it does, attempts, faults for a framework)
SCENARIOS: dict[str, tuple[str, tuple[Attempt, ...], Callable[[Framework], list[dict[str, Any]]]]] = {
    "golden": ("an uninterrupted run", (Attempt(2),), lambda fw: []),
    "kill-mid-epoch": ("rank 1 killed mid-epoch after a save, resumed on 2 ranks",
                       (Attempt(2), Attempt(2, True)), lambda fw: [_kill(fw.kill_step)]),
    "kill-in-save": ("rank 0 killed inside the framework's own save, resumed",
                     (Attempt(2), Attempt(2, True), Attempt(2, True)),
                     lambda fw: [{"id": "kill-in-save", "kind": "foreign_crash", "rank": 0, "step": fw.save_step,
                                  **fw.kill_in_save}]),
    "corrupt-newest": ("killed at update 8, the newest checkpoint truncated before the restart",
                       (Attempt(2), Attempt(2, True), Attempt(2, True)),
                       lambda fw: [_kill(8), {"id": "cut-newest", "kind": "corrupt", "how": "truncate",
                                              "file": fw.newest_file, "attempt": 1}]),
    "world-size": ("rank 1 killed mid-epoch after a save, resumed on 1 rank with the same global batch",
                   (Attempt(2), Attempt(1, True)), lambda fw: [_kill(fw.kill_step)]),
    "hang": ("rank 1 hangs at update 5; the watchdog must see it and restart",
             (Attempt(2), Attempt(2, True)),
             lambda fw: [{"id": "hang", "kind": "hang", "rank": 1, "step": 5, "expect": "hang"}]),
}
EVERY_OP = "crash-every-op"
"""A crash at every file operation of one save: rows come from the framework's recorded save."""


def job_for(fw: Framework, scenario: str, faults: Sequence[dict[str, Any]] | None = None) -> Job:
    """The job of a named scenario; `faults` given: a crash-point job (kill-in-save's attempts)."""
    _, attempts, plan = SCENARIOS[scenario if faults is None else "kill-in-save"]
    cmd = (sys.executable, str(SCRIPTS / fw.script), "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH),
           *fw.args)
    # The golden run also records the file operations of each save (for the crash-every-op rows).
    env = (("TRAINWRECK_RECORD_OPS", "1"),) if scenario == "golden" else ()
    return Job(fw.name, scenario, cmd, fw.resume_args, attempts, tuple(plan(fw) if faults is None else faults),
               env=env)


def recorded_ops(run_dir: Path, step: int) -> list[str]:
    """Rank 0's file operations of its first save at `step`, as the golden run recorded them
    (`save_ops` events, an extension kind the judge ignores)."""
    from trainwreck.trainer.rundir import iter_events

    for event in iter_events(run_dir):
        if event["kind"] == "save_ops" and event.get("rank") == 0 and event.get("step") == step:
            return [str(op) for op in event.get("ops", [])]
    return []


@dataclass(frozen=True)
class Row:
    framework: str
    scenario: str
    valid: Validity
    invalid: tuple[str, ...] = ()
    report: str | None = None
    reason: str = ""
    fired: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"framework": self.framework, "scenario": self.scenario,
                "valid": self.valid if isinstance(self.valid, bool) else "unknown",
                "invalid": list(self.invalid), "report": self.report, "reason": self.reason,
                "fired": list(self.fired)}


def judge_row(job: Job, run_dir: Path) -> Row:
    """The run's verdict from its own events, and its report."""
    from trainwreck.harness.report import render_report

    history = load_history(run_dir)
    golden = run_dir.parent / f"{job.framework}-golden"
    judgement = judge(history, load_history(golden) if golden.is_dir() and golden != run_dir else None)
    report = render_report(run_dir)
    invalid = tuple(sorted(name for name, v in judgement.verdicts.items() if v.valid is False))
    fired = tuple(sorted({str(e.get("fault_id")) for e in history.of_kind("fault")}))
    reason = "; ".join(judgement.notes[:2])
    return Row(job.framework, job.scenario, judgement.valid, invalid, str(report), reason, fired)


def run_one(job: Job, out_dir: Path, launcher: Launcher) -> Row:
    run_dir = out_dir / f"{job.framework}-{job.scenario}"
    try:
        launcher(job, run_dir)
    except LauncherMissing as exc:
        return Row(job.framework, job.scenario, UNKNOWN, reason=str(exc))
    return judge_row(job, run_dir)


def crash_every_op_jobs(fw: Framework, ops: Sequence[str]) -> list[Job]:
    """One job per crash point of a recorded save (before/after each op, torn for writes)."""
    writes = tuple(f"{name}(" for name in WRITE_OPS)
    jobs = []
    for index, op in enumerate(ops):
        for when in ("before", "after", "torn"):
            if when == "torn" and not op.startswith(writes):
                continue
            plan = [{"id": f"crash-{when}-op{index}", "kind": "foreign_crash", "rank": 0, "step": fw.save_step,
                     "op_index": index, "when": when}]
            jobs.append(job_for(fw, f"{EVERY_OP}-{when}-op{index}", plan))
    return jobs


def uninstalled_rows(fw: Framework, scenarios: Sequence[str]) -> list[Row]:
    return [Row(fw.name, s, UNKNOWN, reason=f"{fw.name} is not installed: {fw.install}") for s in scenarios]


def run_table(out_dir: Path, launcher: Launcher, frameworks: Sequence[str] | None = None,
              scenarios: Sequence[str] | None = None, progress: Callable[[Row], None] | None = None) -> list[Row]:
    """Every (framework, scenario) run, golden first (the others are judged against it)."""
    names = list(frameworks or FRAMEWORKS)
    wanted = list(scenarios or [*SCENARIOS, EVERY_OP])
    rows: list[Row] = []
    for name in names:
        fw = FRAMEWORKS[name]
        if not fw.installed():
            rows += uninstalled_rows(fw, wanted)
            continue
        plain = [s for s in wanted if s in SCENARIOS]
        jobs = [job_for(fw, s) for s in ["golden", *(s for s in plain if s != "golden")]]
        if EVERY_OP in wanted:
            jobs.append(None)  # placeholder: its jobs come from the golden run's recorded save
        for job in jobs:
            if job is None:
                ops = recorded_ops(out_dir / f"{fw.name}-golden", fw.save_step)
                if not ops:
                    rows.append(_tell(progress, Row(fw.name, EVERY_OP, UNKNOWN,
                                                    reason="the golden run recorded no save to enumerate")))
                rows += [_tell(progress, run_one(j, out_dir, launcher)) for j in crash_every_op_jobs(fw, ops)]
            else:
                rows.append(_tell(progress, run_one(job, out_dir, launcher)))
    return rows


def _tell(progress: Callable[[Row], None] | None, row: Row) -> Row:
    if progress is not None:
        progress(row)
    return row


def table_validity(rows: Sequence[Row]) -> Validity:
    return compose(r.valid for r in rows)


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [r.to_json() for r in rows]


def default_launcher() -> Launcher:
    """`trainwreck run --cmd`'s launcher once it exists (branch `probe`); until then one that
    refuses, so every row says why it was not judged."""
    def missing(job: Job, run_dir: Path) -> None:
        raise LauncherMissing("needs the `trainwreck run --cmd` launcher (branch `probe`), not merged yet")
    return missing
