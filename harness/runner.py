"""Run a job under faults and judge it against its golden run: the unit every command repeats."""
from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainwreck.harness.golden import golden_run
from trainwreck.harness.report.rootcause import RootCause, root_cause
from trainwreck.harness.scenarios import Scenario
from trainwreck.harness.spec import JobSpec
from trainwreck.harness.restarts import RunRecord
from trainwreck.harness.supervisor import run_job
from trainwreck.invariants import Judgement, judge, load_history
from trainwreck.invariants.verdict import exit_code, verdict_word
from trainwreck.trainer.files import write_atomic
from trainwreck.trainer.rundir import RunDir


@dataclass(frozen=True)
class JudgedRun:
    """A finished run, its verdicts, and how to reproduce it."""

    record: RunRecord
    judgement: Judgement
    golden_dir: Path
    reproduce: str
    """The exact command that reruns this job and judges it again."""
    root_cause: RootCause | None = None
    """The first rank that died of something no planned fault caused, when one did."""

    @property
    def exit_code(self) -> int:
        """0 valid, 1 invalid, 2 unknown (the CLI contract)."""
        return exit_code(self.judgement.valid)


MAX_INLINE_PLAN = 32 * 1024
"""Longest plan put on the reproduce line itself; Linux refuses one argument over 128 KiB
(MAX_ARG_STRLEN) and people paste these lines, so a larger plan goes into a file."""


def verdict_lines(judgement: Judgement) -> list[str]:
    """One line per invariant, its first evidence indented below, then the judge's notes."""
    lines = []
    for name, verdict in judgement.verdicts.items():
        lines.append(f"{verdict_word(verdict.valid):<8} {name:<11} {verdict.summary}")
        lines.extend(f"{'':<21}{e}" for e in verdict.evidence[:3])
    lines.extend(f"note: {n}" for n in judgement.notes)
    return lines


def reproduce_command(spec: JobSpec, scenario: str | None = None) -> str:
    """The `trainwreck run` line that repeats `spec`; a large plan is written to
    RUN_DIR/plan.json and passed as --plan @FILE so the line stays runnable."""
    parts = ["trainwreck", "run"]
    if scenario:
        parts.append(scenario)
    plan = json.dumps(spec.plan, separators=(",", ":"))
    if len(plan) > MAX_INLINE_PLAN and spec.run_dir is not None:
        plan_file = RunDir(Path(spec.run_dir).absolute()).plan_json
        plan_file.write_text(plan)
        plan = f"@{plan_file}"
    parts += ["--plan", plan,
              "--world-sizes", ",".join(map(str, spec.world_sizes)),
              "--total-steps", str(spec.config.total_steps),
              "--hang-timeout", f"{spec.hang_timeout_s:g}",
              "--launcher", spec.launcher]
    # Every other field that differs from a custom run's config (parallelism, --set ...), so the line is exact.
    base = Scenario(name="custom", summary="", question="", threatens=()).train_config().to_dict()
    parts += [f"--set={k}={v}" for k, v in spec.config.to_dict().items()
              if k not in ("total_steps", "variant") and v != base[k]]
    return shlex.join(parts)


def spec_for(scenario: Scenario, out: Path, launcher: str = "warm", variant: str = "reference",
             **overrides: Any) -> JobSpec:
    return JobSpec(config=replace(scenario.train_config(), variant=variant), world_sizes=scenario.world_sizes,
                   plan=[dict(f) for f in scenario.plan], hang_timeout_s=scenario.hang_timeout_s,
                   launcher=launcher, run_dir=out, keep=True,
                   scenario=None if scenario.name == "custom" else scenario.about(), **overrides)


def run_judged(spec: JobSpec, scenario: str | None = None, golden_cache: Path | None = None,
               reproduce: str | None = None, resume: bool = False) -> JudgedRun:
    """Run `spec` (its run_dir is kept), judge it against the cached golden run, write verdicts.json.

    The golden run is always the *reference* trainer's: a planted defect's own
    uninterrupted run would carry the defect (an epoch-blind shuffle, a lost RNG) and
    hide it from the comparison. `resume`: spec.run_dir already holds earlier attempts
    (a power-loss crash state); the job continues from the next one."""
    golden_dir = golden_run(replace(spec.config, variant="reference"), spec.world_sizes[0], golden_cache,
                            launcher="warm")
    record = run_job(spec, resume)
    judgement = judge(load_history(record.run_dir), load_history(golden_dir))
    judged = JudgedRun(record, judgement, golden_dir, reproduce or reproduce_command(spec, scenario),
                       _root_cause(record.run_dir))
    publish(judged)
    return judged


def publish(judged: JudgedRun) -> None:
    """Write the run's verdicts.json and render its report: the one shape every judged run leaves."""
    record, cause = judged.record, judged.root_cause.to_json() if judged.root_cause else None
    write_atomic(RunDir(record.run_dir).verdicts, json.dumps(
        {**judged.judgement.to_json(), "golden": str(judged.golden_dir), "reproduce": judged.reproduce,
         "outcome": record.outcome, "attempts": record.attempts, "root_cause": cause},
        indent=1, default=str) + "\n", root=record.run_dir)
    _render_report(record.run_dir)


def _root_cause(run_dir: Path) -> RootCause | None:
    """The run's unplanned crash; a bug in finding it must not turn a judged run into a crash."""
    try:
        return root_cause(run_dir)
    except Exception as exc:  # noqa: BLE001 - the verdicts matter more than the explanation
        print(f"trainwreck: could not look for the root cause in {run_dir}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None


def _render_report(run_dir: Path) -> None:
    """Every judged run gets its report; a report bug must not turn a judged run into a crash."""
    from trainwreck.harness.report import render_report  # stdlib only, but not needed before this point

    try:
        render_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - the verdicts are already on disk
        print(f"trainwreck: could not render the report of {run_dir}: {type(exc).__name__}: {exc}", file=sys.stderr)
