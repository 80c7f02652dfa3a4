"""The planted-defect self-test: every check must be able to fail.

Each row names a deliberately wrong component (a trainer variant from trainer/defects.py,
or a watchdog variant from harness/supervise/watchdog_variants.py), the invariant that must catch it, and the
scenario whose fault plan exposes it. A row passes when that invariant judges the
defective run invalid (with every planned fault fired) AND the reference trainer and
watchdog pass the same scenario (the control). Controls of identical scenarios run once.

Defective runs are judged against the *reference* trainer's golden run: the golden
run is what correct training looks like, so a defect whose only symptom is a
different trajectory (a forgotten RNG restore, an epoch-blind shuffle) is still caught.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from trainwreck.harness.registry import DEFAULT_LAUNCHER, by_name
from trainwreck.harness.supervise.scenarios import Scenario, declare_scenarios, get_scenario
from trainwreck.harness.judge.runner import run_judged, spec_for

# ----- the scenarios that expose the defects -------------------------------------------

# 89 samples, batches of 16, drop_last off: 6 updates per epoch, the last one 9 samples
# (uneven over 2 ranks); checkpoints after 4, 8, 12, 16 all land mid-epoch.
MID_EPOCH = {"dataset_size": 89, "drop_last": False, "total_steps": 16, "ckpt_interval": 4}


def _crash_in_save(point: str) -> Scenario:
    return Scenario(
        name=f"crash-{point.replace('save.', '').replace('_', '-')}",
        summary=f"rank 0 is SIGKILLed at {point} of the step-8 save; the job restarts",
        question="What does a crash inside a checkpoint save leave behind?",
        threatens=("atomicity", "continuity"),
        plan=({"id": "crash-save", "kind": "kill", "rank": 0, "step": 8, "point": point},),
        config=MID_EPOCH)


RESUME_MID_EPOCH = Scenario(
    name="resume-mid-epoch",
    summary="rank 1 is SIGKILLed before update 10; the job resumes from step 8, mid-epoch 1",
    question="What must a checkpoint hold for a resume to be exact?",
    threatens=("coverage", "continuity", "replicas"),
    plan=({"id": "kill-r1", "kind": "kill", "rank": 1, "step": 10},),
    config=MID_EPOCH)

HANG_QUICK = Scenario(
    name="hang-quick",
    summary="SIGSTOP rank 1 at update 6 with a 2 s hang timeout",
    question="How do you find the rank that hangs?",
    threatens=("hang", "progress"),
    plan=({"id": "stop-r1", "kind": "signal", "rank": 1, "signal": "SIGSTOP", "step": 6, "expect": "hang"},),
    config=MID_EPOCH, hang_timeout_s=2.0)

PREEMPT_ALL = Scenario(
    name="preempt-all",
    summary="every rank gets SIGTERM at update 10, as in a spot preemption; the job restarts",
    question="How can a preempted job report success?",
    threatens=("progress",),
    plan=({"id": "preempt", "kind": "node_loss", "ranks": [0, 1], "signal": "SIGTERM", "step": 10},),
    config=MID_EPOCH)

FSDP_RESUME_MID_EPOCH = Scenario(
    name="fsdp-resume-mid-epoch",
    summary="FSDP on 2 ranks; rank 1 is SIGKILLed before update 10; the job resumes from the step-8 sharded checkpoint",
    question="What must a sharded checkpoint hold for a resume to be exact?",
    threatens=("coverage", "continuity", "atomicity"),
    plan=({"id": "kill-r1", "kind": "kill", "rank": 1, "step": 10},),
    config={**MID_EPOCH, "parallelism": "fsdp"})

FP16_RESUME_MID_EPOCH = replace(
    RESUME_MID_EPOCH, name="fp16-resume-mid-epoch",
    summary="fp16 autocast with a GradScaler; rank 1 is SIGKILLed before update 10; the job resumes from step 8",
    question="What must a mixed-precision checkpoint hold, and what does loss scaling protect?",
    config={**MID_EPOCH, "amp_dtype": "fp16"})
ACCUM_MID_WINDOW = Scenario(
    name="accum-mid-window",
    summary="4 micro-batches per rank per update; rank 1 is SIGKILLed after the last micro-batch's forward of "
            "update 10, its first three backwards accumulated; the job resumes from step 8",
    question="What does a kill in the middle of a gradient-accumulation window lose?",
    threatens=("coverage", "continuity", "progress"),
    plan=({"id": "kill-mid-window", "kind": "kill", "rank": 1, "step": 10, "point": "after_forward"},),
    config={"dataset_size": 96, "total_steps": 16, "ckpt_interval": 4, "grad_accum": 4})

FSDP_CRASH_AFTER_POINTER = replace(
    _crash_in_save("save.after_pointer"), name="fsdp-crash-after-pointer",
    summary="FSDP on 2 ranks; rank 0 is SIGKILLed just after committing the step-8 sharded checkpoint",
    config={**MID_EPOCH, "parallelism": "fsdp"})

CRASH_AFTER_FILE = _crash_in_save("save.after_file")
CRASH_BEFORE_RENAME = _crash_in_save("save.before_rename")
CRASH_AFTER_RENAME = _crash_in_save("save.after_rename")
SCENARIOS = declare_scenarios("defects", RESUME_MID_EPOCH, HANG_QUICK, PREEMPT_ALL, FSDP_RESUME_MID_EPOCH,
                              FP16_RESUME_MID_EPOCH, ACCUM_MID_WINDOW, FSDP_CRASH_AFTER_POINTER, CRASH_AFTER_FILE,
                              CRASH_BEFORE_RENAME, CRASH_AFTER_RENAME)
"""The defects table's own scenarios, in the one registry (the others are built-ins)."""


# ----- the table -----------------------------------------------------------------------


@dataclass(frozen=True)
class Defect:
    name: str
    """The variant's name (TrainConfig.variant, or JobSpec.watchdog for a watchdog defect)."""
    invariant: str
    """The invariant that must judge a run of it invalid."""
    scenario: Scenario
    """The scenario whose fault plan exposes it."""
    component: str = "trainer"
    """trainer (TrainConfig.variant) or watchdog (JobSpec.watchdog)."""
    bug: str = ""
    """One line: what is wrong."""


def _shrink_world() -> Scenario:
    return get_scenario("shrink-world")


def _async_kill_persist() -> Scenario:
    return get_scenario("async-kill-persist")


def _fsdp_shrink_world() -> Scenario:
    return get_scenario("fsdp-shrink-world")


DEFECTS: tuple[Defect, ...] = (
    Defect("sampler_not_saved", "coverage", RESUME_MID_EPOCH, bug="sampler state not saved"),
    Defect("shuffle_ignores_epoch", "coverage", RESUME_MID_EPOCH, bug="shuffling ignores the epoch"),
    Defect("resume_restarts_epoch", "coverage", RESUME_MID_EPOCH, bug="mid-epoch resume restarts the epoch"),
    Defect("pad_uneven_shards", "coverage", RESUME_MID_EPOCH, bug="padding duplicates samples on uneven shards"),
    Defect("optimizer_not_saved", "continuity", RESUME_MID_EPOCH, bug="optimizer state not saved"),
    Defect("scheduler_not_saved", "continuity", RESUME_MID_EPOCH, bug="LR scheduler not saved"),
    Defect("rng_not_restored", "continuity", RESUME_MID_EPOCH, bug="RNG state not restored"),
    Defect("naive_writer", "atomicity", CRASH_AFTER_FILE, bug="checkpoint written in place, pointer first"),
    Defect("pointer_before_durable", "atomicity", CRASH_BEFORE_RENAME,
           bug="`latest` advanced before the data is durable"),
    Defect("resume_highest_unverified", "atomicity", CRASH_AFTER_RENAME,
           bug="resume takes the highest-numbered directory unverified"),
    Defect("world_size_reslices", "coverage", _shrink_world(),
           bug="a world-size change re-slices per-rank positions"),
    Defect("rank_restores_different", "replicas", RESUME_MID_EPOCH, bug="one rank restores a different checkpoint"),
    Defect("sigterm_exits_clean", "progress", PREEMPT_ALL, bug="SIGTERM handled as a clean, successful exit"),
    Defect("disabled", "hang", HANG_QUICK, component="watchdog", bug="hang watchdog disabled"),
    Defect("fsdp_optimizer_not_loaded", "continuity", FSDP_RESUME_MID_EPOCH,
           bug="FSDP resume loads the model shards but not the optimizer's"),
    Defect("fsdp_only_rank0_shards", "atomicity", FSDP_RESUME_MID_EPOCH,
           bug="only rank 0's shards reach the sharded checkpoint"),
    Defect("fsdp_commit_before_shards", "atomicity", FSDP_CRASH_AFTER_POINTER,
           bug="the sharded checkpoint is committed before every rank's shards are written"),
    Defect("fsdp_optimizer_not_resharded", "continuity", _fsdp_shrink_world(),
           bug="on a world-size change each rank loads the optimizer shard its rank index saved, as-is"),
    Defect("fsdp_other_sharding_accepted", "continuity", _fsdp_shrink_world(),
           bug="a checkpoint of another sharding (world size) is loaded as this run's, without resharding"),
    Defect("async_commit_before_durable", "atomicity", _async_kill_persist(),
           bug="async writer commits before its data is durable"),
    Defect("async_no_snapshot", "continuity", _async_kill_persist(),
           bug="async writer lets training mutate tensors while they are written"),
    Defect("truncate_uneven_shards", "coverage", RESUME_MID_EPOCH,
           bug="uneven shards cut to the shortest: each epoch's tail samples are never trained"),
    Defect("scaler_not_saved", "continuity", FP16_RESUME_MID_EPOCH,
           bug="the fp16 GradScaler's state is left out of the checkpoint"),
    Defect("fp16_unscaled", "continuity", FP16_RESUME_MID_EPOCH,
           bug="fp16 autocast without loss scaling: small gradients underflow"),
    Defect("ckpt_mid_window", "coverage", ACCUM_MID_WINDOW,
           bug="a checkpoint taken one micro-batch into an accumulation window"),
)


def defect_names() -> list[str]:
    return [d.name for d in DEFECTS]


def get_defect(name: str) -> Defect:
    return by_name(DEFECTS, name, "defect")


# ----- running a row -------------------------------------------------------------------


def run_defect(defect: Defect, out: Path, golden_cache: Path | None = None, launcher: str = DEFAULT_LAUNCHER) -> Any:
    """The defective run of one row (a JudgedRun)."""
    variant, watchdog = (defect.name, "reference") if defect.component == "trainer" else ("reference", defect.name)
    spec = spec_for(defect.scenario, out, launcher, variant=variant, watchdog=watchdog)
    return run_judged(spec, golden_cache=golden_cache, reproduce=f"trainwreck defects --only {defect.name} --out DIR")


def run_control(scenario: Scenario, out: Path, golden_cache: Path | None = None, launcher: str = DEFAULT_LAUNCHER) -> Any:
    """The reference trainer and watchdog on the scenario (a JudgedRun)."""
    return run_judged(spec_for(scenario, out, launcher), golden_cache=golden_cache)


@dataclass
class Row:
    defect: Defect
    caught: bool
    """The named invariant said invalid and every planned fault fired."""
    verdict: Any
    """The named invariant's validity on the defective run."""
    summary: str
    control_valid: bool
    defect_dir: Path
    control_dir: Path
    wall_s: float
    other_invalid: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"defect": self.defect.name, "invariant": self.defect.invariant, "caught": self.caught,
                "control_valid": self.control_valid, "scenario": self.defect.scenario.name,
                "component": self.defect.component, "verdict": self.verdict, "summary": self.summary,
                "also_invalid": self.other_invalid, "run_dir": str(self.defect_dir),
                "control_dir": str(self.control_dir), "wall_s": round(self.wall_s, 2)}


def judge_row(defect: Defect, judged: Any, control: Any, wall_s: float) -> Row:
    verdict = judged.judgement.verdicts[defect.invariant]
    caught = verdict.valid is False and not judged.judgement.unfired_faults
    others = [n for n, v in judged.judgement.verdicts.items() if v.valid is False and n != defect.invariant]
    return Row(defect, caught, verdict.valid, verdict.summary, control.judgement.valid is True,
               judged.record.run_dir, control.record.run_dir, wall_s, others)


def run_table(out: Path, defects: Iterable[Defect] = DEFECTS, golden_cache: Path | None = None,
              launcher: str = DEFAULT_LAUNCHER, progress: Callable[[Row], None] | None = None) -> list[Row]:
    """Every row's defective run, and one control per distinct scenario, under `out`."""
    controls: dict[str, Any] = {}
    rows = []
    for defect in defects:
        started = time.monotonic()
        scenario = defect.scenario
        if scenario.name not in controls:
            controls[scenario.name] = run_control(scenario, out / f"control-{scenario.name}", golden_cache, launcher)
        judged = run_defect(defect, out / f"defect-{defect.name}", golden_cache, launcher)
        row = judge_row(defect, judged, controls[scenario.name], time.monotonic() - started)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def table_exit_code(rows: list[Row]) -> int:
    """0 every defect caught and every control valid; 1 otherwise."""
    return 0 if rows and all(r.caught and r.control_valid for r in rows) else 1
