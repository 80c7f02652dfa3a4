"""Run a job under faults and judge it against its golden run: the unit every command repeats.

One path for every job: the spec's target (harness/supervise/spec.py, harness/supervise/command/target.py) says what its
golden run is, how it is judged and how it is reproduced; `run_judged` only dispatches."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainwreck.harness.errors import GoldenFailed
from trainwreck.harness.judge.golden import golden_for
from trainwreck.report.crash_cause import RootCause, root_cause
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import RunRecord
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.harness.supervise.spec import MAX_INLINE_PLAN, reproduce_command, spec_for  # noqa: F401 - re-exported
from trainwreck.invariants import Judgement
from trainwreck.invariants.verdict import UNKNOWN, Validity, Verdict, exit_code, verdict_word
from trainwreck.rundir.files import write_atomic
from trainwreck.rundir.layout import RunDir


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
    section_shown: bool = field(default=False, compare=False)
    """True when the pytest plugin prints this run's failure section under its own heading
    (it recorded the run): `assert_valid` then says so in one line rather than repeat it."""

    @property
    def exit_code(self) -> int:
        """0 valid, 1 invalid, 2 unknown (the CLI contract)."""
        return exit_code(self.judgement.valid)

    @property
    def valid(self) -> Validity:
        """True, False or "unknown": the whole judgement (`assert judged.valid is True`)."""
        return self.judgement.valid

    @property
    def verdicts(self) -> dict[str, Verdict]:
        """Invariant name -> Verdict (`judged.verdicts["coverage"].summary`)."""
        return self.judgement.verdicts

    @property
    def fired(self) -> list[str]:
        """The planned faults that fired, from the run's own `fault` events, in order, once each."""
        from trainwreck.rundir.layout import iter_events

        ids = [str(e.get("fault_id")) for e in iter_events(self.record.run_dir, batches=False) if e["kind"] == "fault"]
        return list(dict.fromkeys(ids))

    def assert_valid(self) -> None:
        """Raise AssertionError with the failure section (verdicts, evidence, run directory,
        report, reproduce line) unless every invariant held and every planned fault fired."""
        if self.judgement.valid is not True:
            raise RunNotValid(self)


class RunNotValid(AssertionError):
    """`assert_valid`'s failure: the run's failure section, or, when the pytest plugin prints
    that section itself (`section_shown`), one line pointing at it, so it is printed once."""

    def __init__(self, judged: JudgedRun) -> None:
        word = verdict_word(judged.judgement.valid)
        if judged.section_shown:
            failing = [n for n, v in judged.judgement.verdicts.items() if v.valid is not True]
            failing += ["unfired faults"] if judged.judgement.unfired_faults else []
            super().__init__(f"trainwreck judged the run {word} ({', '.join(failing) or 'see its notes'}): "
                             "its verdicts, run directory and reproduce line are in the trainwreck section below")
        else:
            super().__init__(f"trainwreck judged the run {word}\n{failure_section(judged)}")
        self.judged = judged


def verdict_lines(judgement: Judgement) -> list[str]:
    """One line per invariant, its first evidence indented below, then the judge's notes."""
    lines = []
    for name, verdict in judgement.verdicts.items():
        lines.append(f"{verdict_word(verdict.valid):<8} {name:<11} {verdict.summary}")
        lines.extend(f"{'':<21}{e}" for e in verdict.evidence[:3])
    lines.extend(f"note: {n}" for n in judgement.notes)
    return lines


def failure_section(judged: JudgedRun, report: Path | None = None) -> str:
    """What a failed test prints about one run: the verdicts with their evidence, the root
    cause when a rank died of its own error, the run directory, the report, the reproduce line."""
    lines = [f"overall: {verdict_word(judged.judgement.valid)} ({judged.record.outcome} after "
             f"{judged.record.attempts} attempt(s))"]
    cause = getattr(judged, "root_cause", None)  # anything shaped like a JudgedRun may be described
    if cause is not None:
        lines.append(f"root cause: {cause.sentence()}")
    lines += verdict_lines(judged.judgement)
    if judged.judgement.unfired_faults:
        lines.append(f"planned faults that never fired: {', '.join(map(str, judged.judgement.unfired_faults))}")
    lines.append(f"run directory: {judged.record.run_dir}")
    report = report or RunDir(judged.record.run_dir).root / "report" / "report.html"
    if report.is_file():
        lines.append(f"report: {report}")
    lines.append(f"reproduce: {judged.reproduce}")
    return "\n".join(lines)


def run_judged(spec: JobSpec, scenario: str | None = None, golden_cache: Path | None = None,
               reproduce: str | None = None, resume: bool = False, fresh_golden: bool = False) -> JudgedRun:
    """Run `spec` (its run_dir is kept), judge it against its target's cached golden run, write
    verdicts.json and the report. `resume`: spec.run_dir already holds earlier attempts (a
    power-loss crash state); the job continues from the next one. `fresh_golden`: the golden
    run is rebuilt even when a cached one matches (`--fresh-golden`)."""
    target = spec.target
    try:
        golden_dir: Path | None = golden_for(spec, golden_cache, fresh_golden)
    except GoldenFailed as exc:
        if not target.judged_without_golden:
            raise
        golden_dir, reason = None, str(exc)
    record = run_job(spec, resume)
    if golden_dir is None:
        judgement = Judgement(UNKNOWN, {}, [], [reason, *target.problems(record.run_dir)])
    else:
        judgement = target.judge(record.run_dir, golden_dir)
    judged = JudgedRun(record, judgement, golden_dir or Path(""), reproduce or target.reproduce(spec, scenario),
                       _root_cause(record.run_dir) if target.explains_crashes else None)
    publish(judged)
    return judged


def publish(judged: JudgedRun, report: bool = True) -> None:
    """Write the run's verdicts.json and render its report: the one shape every judged run leaves.
    `report` False: no job ran (DCP's own save judged in this process), so no events to render."""
    record, cause = judged.record, judged.root_cause.to_json() if judged.root_cause else None
    write_atomic(RunDir(record.run_dir).verdicts, json.dumps(
        # Absolute: `trainwreck check RUN_DIR` uses this golden run from wherever it is called.
        {**judged.judgement.to_json(), "golden": str(judged.golden_dir.absolute()) if judged.golden_dir.parts else "",
         "reproduce": judged.reproduce,
         "outcome": record.outcome, "attempts": record.attempts, "root_cause": cause},
        indent=1, default=str) + "\n", root=record.run_dir)
    if report:
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
    from trainwreck.report import render_report  # stdlib only, but not needed before this point

    try:
        render_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - the verdicts are already on disk
        print(f"trainwreck: could not render the report of {run_dir}: {type(exc).__name__}: {exc}", file=sys.stderr)
