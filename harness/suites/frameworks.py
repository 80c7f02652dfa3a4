"""The frameworks table: frameworks x scenarios, each run judged, a report per run, a casebook.

    rows = run_table(out_dir, cmd_runner)      # one Row per (framework, scenario) run
    rows_json(rows)                              # what `trainwreck frameworks --json` prints

A framework is an example trainer (a script using that framework's adapter, or the probe
alone for a plain torchrun script) and the optional extra it needs. A scenario is a
world-size schedule, a restart budget and a fault plan; what a fault needs to know about the
framework (which save step, which file operation, which checkpoint to damage) is the
framework's, so scenarios ask the framework for it.

Every row is a real `trainwreck run --cmd` job (``cmd_runner``: a harness/supervise/command/target.py `Command`
target on the supervisor): the watchdog, restarts on the world-size schedule, the
plan's in-rank faults through the probe, corruption between attempts. The run is judged by
the unchanged invariants against its framework's golden row, with the --cmd contract rule:
a command that broke the contract is "unknown" with the reason, never valid.

The example trainers ship inside the package (trainer/frameworks/examples, installed as
package data), so the table runs from a wheel as from a checkout; they are the tests'
trainers too. Should they be missing (a damaged install), ``scripts_missing`` says so and the
command exits 2 with that sentence.
"""
from __future__ import annotations

import importlib.util
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, NamedTuple, Protocol, Sequence

from trainwreck.faults.foreign import WRITE_OPS
from trainwreck.harness.registry import RAY_TRAIN
from trainwreck.harness.supervise.supervisor import RunRecord
from trainwreck.harness.supervise.scenarios import declare
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.invariants.verdict import UNKNOWN, Validity, compose
from trainwreck.trainer.frameworks import EXAMPLES

SCRIPTS = EXAMPLES
"""The example trainers, installed with the package (docs/FRAMEWORKS.md)."""
STEPS, GLOBAL_BATCH, DATASET = 12, 8, 64
"""Every example trainer: 64 samples, 8 updates an epoch, 12 updates."""
HANG_TIMEOUT_S = 30.0
"""The watchdog's budget in the table (`--cmd`'s default): a framework step takes well under a
second here, but on a loaded 2-core machine a plain script's set-up between `probe.start()` and
its first update once took over 20 s (a false alarm); importing a framework happens before the
first progress record, under the startup budget."""


@dataclass(frozen=True)
class Job:
    """One framework run: the command per rank, the world-size schedule, restarts, the plan."""

    framework: str
    scenario: str
    cmd: tuple[str, ...]
    world_sizes: tuple[int, ...] = (2,)
    max_restarts: int = 0
    faults: tuple[dict[str, Any], ...] = ()
    summary: str = ""
    hang_timeout_s: float = HANG_TIMEOUT_S
    launcher: str | None = None
    """None: `--cmd`'s (one process per rank); "ray-driver": one driver whose Ray restarts its workers."""

    @property
    def command(self) -> str:
        return shlex.join(self.cmd)


class RowRunner(Protocol):
    """Runs one row's job (not a launcher: the job's launcher is JobSpec's, `cmd`)."""

    def __call__(self, job: Job, run_dir: Path) -> RunRecord:
        """Run every attempt of `job` into `run_dir` and return the harness's record of it."""


def job_spec(job: Job, run_dir: Path) -> JobSpec:
    """The `trainwreck run --cmd` job of a row."""
    from trainwreck.harness.supervise.command.target import Command

    return JobSpec(target=Command(job.command), world_sizes=job.world_sizes, plan=[dict(f) for f in job.faults],
                   hang_timeout_s=job.hang_timeout_s, max_restarts=job.max_restarts, run_dir=run_dir, keep=True,
                   launcher=job.launcher,
                   scenario={"name": f"{job.framework} {job.scenario}", "summary": job.summary})


def cmd_runner(job: Job, run_dir: Path) -> RunRecord:
    """The `trainwreck run --cmd` supervisor: one process per rank, torchrun's environment."""
    from trainwreck.harness.supervise.supervisor import run_job

    return run_job(job_spec(job, run_dir))


@dataclass(frozen=True)
class KillInSave:
    """Where kill-in-save stops the writer: before or after one file operation of its save (the
    order faults/foreign.py records them in; `what` is that operation, read off a recorded save)."""

    op_index: int
    when: str
    what: str

    def fields(self) -> dict[str, Any]:
        return {"op_index": self.op_index, "when": self.when}


@dataclass(frozen=True)
class Framework:
    """One framework, declared once: the frameworks table runs its example trainer under each
    scenario, `trainwreck sweep --framework NAME` crashes its save at every file operation, and with
    `--power-loss` cuts the power inside its saves (when `sweep_args`)."""

    name: str
    module: str
    """The import name whose absence means the extra is not installed."""
    extra: str | None
    script: str
    args: tuple[str, ...] = ()
    save_step: int = 6
    """A save step of the example trainer that is not the job's first save."""
    kill_step: int = 5
    """An update after a save and inside an epoch (8 updates an epoch): a kill there is a mid-epoch resume."""
    kill_in_save: KillInSave | None = None
    """Where the writer is killed inside the save at `save_step`."""
    newest: str = "newest"
    """What corrupt-newest damages: "newest" (the checkpoint with the highest step in its name) or a
    name in the checkpoint folder (Lightning's last.ckpt has no step in its name)."""
    argv: tuple[str, ...] = ()
    """A user's own command (`trainwreck sweep --cmd`), run as it is; save_step 0: the golden run's
    second recorded save (its first when it has one), as the user's save schedule is the script's."""
    sweep_args: tuple[str, ...] = ()
    """The script's arguments when `trainwreck sweep --framework NAME --power-loss` cuts the power inside
    its saves (every attempt the same: the script resumes from what it finds); empty: not a sweep writer."""
    launcher: str | None = None
    """The job's launcher (harness/registry.py): None is `--cmd`'s; "ray-driver" runs the script once, as
    a Ray Train driver whose TorchTrainer restarts the worker group itself."""
    scenarios: tuple[str, ...] | None = None
    """The scenarios it runs (None: all); the others are rows saying why not (`not_run`)."""
    not_run: tuple[tuple[str, str], ...] = ()
    """(scenario, why it is not run) for the scenarios outside `scenarios` (pairs: a Framework stays hashable)."""
    nodes: bool = False
    """Its job runs on simulated nodes it can lose (Ray's `cluster.remove_node`): world-size loses
    the node of rank 1 instead of killing it, and the NODE_SCENARIOS run."""

    def runs(self, scenario: str) -> bool:
        """Whether the table runs `scenario` for it (a node scenario only where there are nodes to lose)."""
        return scenario in self.scenarios if self.scenarios is not None else scenario not in NODE_SCENARIOS

    @property
    def install(self) -> str:
        return f"pip install 'trainwreck[{self.extra}]'" if self.extra else "pip install torch"

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def command(self) -> tuple[str, ...]:
        if self.argv:
            return self.argv
        return (sys.executable, str(SCRIPTS / self.script), "--steps", str(STEPS), "--global-batch",
                str(GLOBAL_BATCH), *self.args)


EVERY_OP = "crash-every-op"
"""A crash at every file operation of one save: rows come from the framework's recorded save."""
NODE_SCENARIOS = ("remove-node",)
"""Scenarios that remove a simulated node: run only by frameworks with `nodes`."""
RAY_SCENARIOS = ("golden", "kill-mid-epoch", "kill-in-save", "corrupt-newest", "hang", "remove-node", "world-size")
"""Ray Train's rows: the table's scenarios but crash-every-op (RAY_NOT_RUN), on two simulated nodes."""
RAY_NOT_RUN = (
    (EVERY_OP, "one kill-in-save row crashes inside ray.train.report's persistence; its save has two file "
               "operations (mkdir, the copy of state.pt)"),)

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework("torchrun", "torch", None, "plain_ddp.py", ("--save-every", "3"),
              kill_in_save=KillInSave(1, "before", "the rename of the written temporary file to its sha256 name")),
    Framework("hf", "transformers", "hf", "hf_trainer.py", ("--save-every", "3"),
              kill_in_save=KillInSave(8, "before", "torch.save(checkpoint-6/optimizer.pt), op 8 of 13"),
              sweep_args=("--total-steps", str(STEPS), "--save-steps", "4")),
    Framework("lightning", "lightning", "lightning", "lightning_train.py", ("--save-every", "6", "--resume"),
              kill_in_save=KillInSave(1, "before", "the move of epoch=0-step=6.ckpt into place"), kill_step=7,
              newest="last.ckpt",
              sweep_args=("--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--save-every", "4", "--resume")),
    Framework("accelerate", "accelerate", "accelerate", "accelerate_train.py", ("--save-every", "3", "--resume"),
              kill_in_save=KillInSave(3, "before", "torch.save(checkpoint_1/optimizer.bin)"),
              sweep_args=("--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--save-every", "3",
                          "--resume")),
    *(Framework(name, "ray", "ray-train", "ray_train.py", ("--save-every", "3", "--data", data),
                kill_in_save=KillInSave(1, "torn", "the copy of state.pt into the persisted checkpoint_000006, "
                                                   "inside ray.train.report (checkpoint_upload_fn)"),
                launcher=RAY_TRAIN, scenarios=RAY_SCENARIOS, not_run=RAY_NOT_RUN, nodes=True)
      for name, data in (("ray_train", "loader"), ("ray_train_data", "dataset"))),
)}
SWEEP_WRITERS: dict[str, Framework] = {name: fw for name, fw in FRAMEWORKS.items() if fw.sweep_args}
"""The frameworks whose own saves `trainwreck sweep --framework NAME --power-loss` cuts the power inside."""


def _kill(step: int) -> dict[str, Any]:
    return {"id": "kill-mid-epoch", "kind": "kill", "rank": 1, "step": step}


def _remove_node(step: int) -> dict[str, Any]:
    """The harness's node loss; under the ray-driver launcher, the driver's `cluster.remove_node`."""
    return {"id": "remove-node", "kind": "node_loss", "ranks": [1], "step": step}


def _lose_rank_1(fw: Framework) -> list[dict[str, Any]]:
    return [_remove_node(fw.kill_step) if fw.nodes else _kill(fw.kill_step)]


Plan = Callable[[Framework], list[dict[str, Any]]]


class FrameworkScenario(NamedTuple):
    """A row of the table, run for every framework: what the framework provides (which step, which
    file operation) the plan asks of it."""

    summary: str
    world_sizes: tuple[int, ...]
    restarts: int
    plan: Plan


SCENARIOS: dict[str, FrameworkScenario] = declare("frameworks", (
    ("golden", FrameworkScenario("an uninterrupted run", (2,), 0, lambda fw: [])),
    ("kill-mid-epoch", FrameworkScenario("rank 1 killed mid-epoch after a save, resumed on 2 ranks", (2,), 1,
                                         lambda fw: [_kill(fw.kill_step)])),
    ("kill-in-save", FrameworkScenario(
        "rank 0 killed inside the framework's own save, resumed", (2,), 2,
        lambda fw: [{"id": "kill-in-save", "kind": "foreign_crash", "rank": 0, "step": fw.save_step,
                     **(fw.kill_in_save.fields() if fw.kill_in_save else {})}])),
    ("corrupt-newest", FrameworkScenario(
        "killed at update 8, the newest checkpoint truncated before the restart", (2,), 2,
        lambda fw: [_kill(8), {"id": "cut-newest", "kind": "corrupt", "how": "truncate", "target": fw.newest,
                               "attempt": 1}])),
    ("world-size", FrameworkScenario(
        "rank 1 lost mid-epoch after a save (killed, or its node removed), resumed on 1 rank with the same "
        "global batch", (2, 1), 1, _lose_rank_1)),
    ("hang", FrameworkScenario("rank 1 hangs at update 5; the watchdog must see it and restart", (2,), 1,
                               lambda fw: [{"id": "hang", "kind": "hang", "rank": 1, "step": 5, "expect": "hang"}])),
    ("remove-node", FrameworkScenario(
        "the simulated node of a rank removed mid-epoch after a save, a new node added, resumed on 2 ranks", (2,), 1,
        lambda fw: [_remove_node(fw.kill_step)])),
))


def job_for(fw: Framework, scenario: str, faults: Sequence[dict[str, Any]] | None = None) -> Job:
    """The job of a named scenario; `faults` given: a crash-point job (kill-in-save's schedule)."""
    summary, sizes, restarts, plan = SCENARIOS[scenario if faults is None else "kill-in-save"]
    if faults is not None:
        f = faults[0]
        summary = f"rank 0 killed {f['when']} file operation {f['op_index']} of the save at update {f['step']}"
    return Job(fw.name, scenario, fw.command(), sizes, restarts, tuple(plan(fw) if faults is None else faults),
               summary, launcher=fw.launcher)


def recorded_ops(run_dir: Path, step: int) -> list[str]:
    """Rank 0's file operations of its save at `step`, as the golden run recorded them
    (`save_ops` events, an extension kind the judge ignores: faults/foreign.py)."""
    from trainwreck.rundir.layout import iter_events

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
    figures: dict[str, Any] = field(default_factory=dict)
    """What the judge measured, where a row has figures (torchft: stalls, steps alone, ids lost)."""

    def to_json(self) -> dict[str, Any]:
        row = {"framework": self.framework, "scenario": self.scenario,
               "valid": self.valid if isinstance(self.valid, bool) else "unknown",
               "invalid": list(self.invalid), "report": self.report, "reason": self.reason,
               "fired": list(self.fired)}
        return {**row, "figures": self.figures} if self.figures else row


def judge_row(job: Job, record: RunRecord, golden: Path | None) -> Row:
    """The run's verdict from its own events (the --cmd contract rule included): verdicts.json and
    the report, as every judged run leaves them."""
    from trainwreck.harness.judge.runner import JudgedRun, publish
    from trainwreck.rundir.layout import RunDir, iter_events

    spec = job_spec(job, record.run_dir)
    judgement = spec.target.judge(record.run_dir, golden)
    publish(JudgedRun(record, judgement, golden or Path(""), spec.target.reproduce(spec)))
    invalid = tuple(sorted(name for name, v in judgement.verdicts.items() if v.valid is False))
    fired = tuple(sorted({str(e.get("fault_id")) for e in iter_events(record.run_dir, batches=False)
                          if e.get("kind") == "fault"}))
    report = RunDir(record.run_dir).root / "report" / "report.html"
    return Row(job.framework, job.scenario, judgement.valid, invalid, str(report) if report.is_file() else None,
               "; ".join(judgement.notes[:2]), fired)


def run_one(job: Job, out_dir: Path, runner: RowRunner) -> Row:
    run_dir = out_dir / f"{job.framework}-{job.scenario}"
    golden = out_dir / f"{job.framework}-golden"
    record = runner(job, run_dir)
    return judge_row(job, record, golden if job.scenario != "golden" and golden.is_dir() else None)


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


def scripts_missing() -> str | None:
    """Why the table cannot run here, or None: the example trainers ship inside the package."""
    if (SCRIPTS / "plain_ddp.py").is_file():
        return None
    return (f"the example trainers are missing from the installed package ({SCRIPTS}): the install is "
            "incomplete; reinstall it (pip install --force-reinstall 'trainwreck[hf,lightning,accelerate]')")


def run_table(out_dir: Path, runner: RowRunner = cmd_runner, frameworks: Sequence[str] | None = None,
              scenarios: Sequence[str] | None = None, progress: Callable[[Row], None] | None = None) -> list[Row]:
    """Every (framework, scenario) run, golden first (the others are judged against it)."""
    rows: list[Row] = []
    for name in frameworks or [*FRAMEWORKS, REPLICA_FRAMEWORK]:
        if name == REPLICA_FRAMEWORK:
            rows += _replica_rows(out_dir, scenarios, progress)
            continue
        rows += _framework_rows(FRAMEWORKS[name], out_dir, runner, list(scenarios or [*SCENARIOS, EVERY_OP]),
                                progress)
    return rows


def _framework_rows(fw: Framework, out_dir: Path, runner: RowRunner, wanted: list[str],
                    progress: Callable[[Row], None] | None) -> list[Row]:
    if not fw.installed():
        return [_tell(progress, r) for r in uninstalled_rows(fw, wanted)]
    rows = []
    if fw.scenarios is not None:
        rows += [_tell(progress, Row(fw.name, s, UNKNOWN, reason=f"not run for {fw.name}: {dict(fw.not_run).get(s, '')}"))
                 for s in wanted if s not in fw.scenarios]
    wanted = [s for s in wanted if fw.runs(s)]
    for scenario in ["golden", *(s for s in wanted if s in SCENARIOS and s != "golden")]:
        rows.append(_tell(progress, run_one(job_for(fw, scenario), out_dir, runner)))
    if EVERY_OP in wanted:
        if not fw.save_step:
            fw = replace(fw, save_step=swept_save_step(out_dir / f"{fw.name}-golden"))
        ops = recorded_ops(out_dir / f"{fw.name}-golden", fw.save_step)
        if not ops:
            where = f"at step {fw.save_step}" if fw.save_step else "at all"
            rows.append(_tell(progress, Row(fw.name, EVERY_OP, UNKNOWN,
                                            reason=f"the golden run recorded no save {where}: wrap the script's "
                                                   "save in `with probe.saving(step, checkpoint_dir):` so its file "
                                                   "operations are recorded (docs/FRAMEWORKS.md)")))
        rows += [_tell(progress, run_one(j, out_dir, runner)) for j in crash_every_op_jobs(fw, ops)]
    return rows


def swept_save_step(golden_dir: Path) -> int:
    """The save a user command's sweep crashes: the golden run's second recorded save of rank 0 (a
    crash there has an earlier checkpoint to fall back to), its first when it made one; 0: none."""
    from trainwreck.rundir.layout import iter_events

    steps = sorted({e["step"] for e in iter_events(golden_dir) if e["kind"] == "save_ops" and e.get("rank") == 0
                    and isinstance(e.get("step"), int)}) if golden_dir.is_dir() else []
    return steps[1] if len(steps) > 1 else (steps[0] if steps else 0)


def command_framework(command: str) -> Framework:
    """A user's own command as a one-row framework of the table (`trainwreck sweep --cmd`)."""
    return Framework("command", "torch", None, script="", argv=tuple(shlex.split(command)), save_step=0)


def run_command_sweep(command: str, out_dir: Path, runner: RowRunner = cmd_runner,
                      progress: Callable[[Row], None] | None = None) -> list[Row]:
    """A crash at every file operation of the command's own save, as the table's crash-every-op
    rows do for a built-in framework (one code path): its golden row first, which records the
    saves, then one judged run per crash point."""
    return _framework_rows(command_framework(command), out_dir, runner, [EVERY_OP], progress)


REPLICA_FRAMEWORK = "torchft"
"""Its rows are replica-group jobs (harness/suites/torchft_rows.py), not `--cmd` jobs: a group restarts alone."""


def _replica_rows(out_dir: Path, scenarios: Sequence[str] | None,
                  progress: Callable[[Row], None] | None) -> list[Row]:
    from trainwreck.harness.suites.torchft_rows import INSTALL, SCENARIOS as REPLICA_SCENARIOS, TorchftRow, torchft_rows

    def row(r: TorchftRow) -> Row:
        return Row(REPLICA_FRAMEWORK, r.scenario, r.valid, r.invalid, None, r.reason, r.fired, r.figures)

    wanted = [s for s in (scenarios or REPLICA_SCENARIOS) if s in REPLICA_SCENARIOS]
    if importlib.util.find_spec("torchft") is None:
        return [_tell(progress, Row(REPLICA_FRAMEWORK, s, UNKNOWN, reason=f"torchft is not installed: {INSTALL}"))
                for s in wanted]
    return [row(r) for r in torchft_rows(out_dir, wanted, progress=lambda r: _tell(progress, row(r)))]


def _tell(progress: Callable[[Row], None] | None, row: Row) -> Row:
    if progress is not None:
        progress(row)
    return row


def table_validity(rows: Sequence[Row]) -> Validity:
    return compose(r.valid for r in rows)


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [r.to_json() for r in rows]
