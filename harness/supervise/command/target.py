"""`trainwreck run --cmd "python train.py ..."`: a user's own trainer as a job's `Command` target.

The job is an ordinary JobSpec whose target is a `Command` (harness/supervise/spec.py says what a
target owns), started per rank by the launchers that serve commands (harness/registry.py:
`cmd`, harness/launch/launchers.py CmdLauncher), so it gets everything the reference trainer gets
from harness/supervise/supervisor.py: the watchdog, restarts on the world-size schedule, external
faults at steps, and (through the probe, which builds faults/foreign.py's hooks from the
plan) kill/hang at its fault points and crashes inside the framework's own save. What only
a foreign command needs lives here, on the target: which faults it can take, its golden run
(cached by the command, the files it names and imports and the installed versions:
harness/supervise/command/golden_key.py; reproduced once: harness/supervise/command/repeat.py), and the bad-input rule: a
command that breaks the run format's contract is judged "unknown" with the reason, never
valid. The facts its judgement carries (a skipped corruption, a global-batch change, the
rank's own error) come from faults/between_attempts.py and harness/supervise/command/facts.py. `run_judged` (harness/judge/runner.py) dispatches on the target; there is no second pipeline.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from trainwreck.faults.errors import PlanError
from trainwreck.harness.supervise.command.facts import judge_across_batch_change, rank_error, with_batch_change_note
from trainwreck.faults.between_attempts import unapplied
from trainwreck.harness.supervise.command.golden_key import cmd_golden_key
from trainwreck.harness.supervise.command.repeat import REPEAT_STOP, judged_without_golden, nondeterminism
from trainwreck.harness.errors import SpecError
from trainwreck.harness.registry import COMMAND
from trainwreck.invariants import InputError, Judgement, judge, load_history
from trainwreck.invariants.verdict import UNKNOWN
from trainwreck.rundir.events import FORMAT
from trainwreck.rundir.layout import RunDir, iter_events, read_run_json

CONTRACT_FIELDS = ("dataset_size", "global_batch", "drop_last", "total_steps")
"""run.json fields only the command knows; its probe writes them (Probe.write_run_json)."""


@dataclass(frozen=True)
class Command:
    """A user's command line, started once per rank with torchrun's environment; its trainer
    writes the run format through the probe (docs/FRAMEWORKS.md)."""

    command: str
    """The command that trains one rank, e.g. "python train.py --steps 12"."""
    ckpt_dir: str = "checkpoints"
    """Its checkpoint directory, relative to the run directory (corrupt faults damage its newest entry)."""
    kind: ClassVar[str] = COMMAND
    judged_without_golden: ClassVar[bool] = True
    explains_crashes: ClassVar[bool] = True  # its ranks' logs are logs/aNNN-rNNN.log, as the reference's

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command)

    def check(self, spec: Any) -> None:
        try:
            argv = self.argv
        except ValueError as exc:
            raise SpecError(f"--cmd {self.command!r} cannot be split into words ({exc}); check its quotes") from None
        if not argv:
            raise SpecError("--cmd is empty; give the command that trains one rank, e.g. --cmd 'python train.py'")
        if Path(self.ckpt_dir).is_absolute() or ".." in Path(self.ckpt_dir).parts:
            raise PlanError(f"ckpt_dir={self.ckpt_dir!r} must be a path inside the run directory, e.g. 'checkpoints'")
        check_cmd_plan(spec.plan)

    def run_json(self, spec: Any, extras: dict[str, Any]) -> dict[str, Any]:
        """The dataset fields are the command's own: its probe adds them (Probe.write_run_json)."""
        return {"format": FORMAT, "hang_timeout_s": spec.hang_timeout_s, "world_sizes": list(spec.world_sizes),
                "faults": spec.plan, **extras, "command": self.command, "scenario": spec.scenario}

    def golden_name(self, spec: Any) -> str:
        return f"cmd-{cmd_golden_key(self.command, spec.world_sizes[0])}"

    def golden_spec(self, spec: Any, run_dir: Path) -> Any:
        return replace(spec, world_sizes=spec.world_sizes[:1], plan=[], run_dir=run_dir, keep=True,
                       max_restarts=0, scenario=None)

    def golden_failure(self, record: Any) -> str | None:
        problems = contract_problems(record.run_dir)
        if record.status == "completed" and not problems:
            return None
        return f"the golden run of --cmd failed ({'; '.join(problems) or record.outcome}); see {record.run_dir}/logs"

    def repeat_spec(self, spec: Any, run_dir: Path) -> Any | None:
        """The golden job again, stopped after its first updates: is the script deterministic?"""
        return replace(self.golden_spec(spec, run_dir), plan=[dict(REPEAT_STOP)])

    def problems(self, run_dir: Path) -> list[str]:
        return contract_problems(run_dir)

    def judge(self, run_dir: Path, golden_dir: Path | None) -> Judgement:
        """The usual judgement, but "unknown" with the reasons when the command broke the contract,
        a planned corruption found nothing to damage, or the script did not repeat its golden run."""
        problems = contract_problems(run_dir) + [u["reason"] for u in unapplied(run_dir) if "reason" in u]
        unrepeatable = nondeterminism(golden_dir)
        try:
            golden = load_history(golden_dir) if golden_dir is not None and unrepeatable is None else None
            try:
                judgement = with_batch_change_note(run_dir, judge(load_history(run_dir), golden))
            except InputError:
                # A per-device batch resumed on another world size runs past total_steps: judged across the change.
                across = judge_across_batch_change(run_dir, golden)
                if across is None:
                    raise
                judgement = across
        except InputError as exc:
            return Judgement(UNKNOWN, {}, [], [f"the command's run cannot be judged: {exc}", *problems])
        if unrepeatable is not None:
            judgement = judged_without_golden(judgement, unrepeatable)
        if problems:
            return Judgement(UNKNOWN, judgement.verdicts, judgement.unfired_faults, [*problems, *judgement.notes])
        return judgement

    def reproduce(self, spec: Any, scenario: str | None = None) -> str:
        return shlex.join(["trainwreck", "run", "--cmd", self.command, "--plan",
                           json.dumps(spec.plan, separators=(",", ":")),
                           "--world-sizes", ",".join(map(str, spec.world_sizes)),
                           "--hang-timeout", f"{spec.hang_timeout_s:g}", "--ckpt-dir", self.ckpt_dir])


def check_cmd_plan(plan: list[dict[str, Any]]) -> None:
    """Only the faults a foreign trainer's probe can reach; PlanError naming the rest."""
    from trainwreck.faults.plan import check_kinds, command_kinds, parse_plan
    from trainwreck.faults.between_attempts import check_corrupt_fault

    parse_plan([f for f in plan if f.get("kind") != "corrupt"])  # corrupt: its --cmd rules below
    # Each kind declares whether a command takes it (Kind.command).
    check_kinds(plan, command_kinds(), "a --cmd run", "a foreign trainer has no storage seam or gradient hook "
                "the harness can reach; docs/FRAMEWORKS.md")
    for fault in plan:
        if fault.get("kind") == "corrupt":
            try:
                check_corrupt_fault(fault)
            except ValueError as exc:
                raise PlanError(str(exc)) from None


def contract_problems(run_dir: Path) -> list[str]:
    """Why the --cmd run in `run_dir` cannot be judged, each with the fix; empty when it can."""
    spec = read_run_json(run_dir)
    exits = {(e["attempt"], e["rank"]): e.get("code") for e in iter_events(run_dir, batches=False)
             if e.get("kind") == "exit" and "rank" in e and "attempt" in e}
    rank_events = [e for e in iter_events(run_dir, batches=False) if "rank" in e and e.get("kind") != "exit"
                   and e.get("kind") != "fault"]
    if not rank_events:
        codes = {f"a{a}r{r}": c for (a, r), c in sorted(exits.items())}
        failed = rank_error(run_dir, sorted(exits))
        if failed is not None:
            return [f"the command wrote no events: it failed before its probe wrote any (exit codes by attempt "
                    f"and rank {codes}); rank {failed[1]} of attempt {failed[0]}: {failed[2]} ({failed[3]})"]
        return [f"the command wrote no events (exit codes by attempt and rank {codes}; see {RunDir(run_dir).logs}): "
                "call trainwreck.trainer.probe.Probe.from_env() in it (docs/FRAMEWORKS.md)"]
    problems = []
    missing = [f for f in CONTRACT_FIELDS if f not in spec]
    if missing:
        problems.append(f"run.json lacks {', '.join(missing)}: the command must call "
                        "probe.write_run_json(dataset_size=..., global_batch=..., drop_last=..., total_steps=...)")
    planned = spec.get("world_sizes") or [1]
    for event in rank_events:
        attempt = event.get("attempt")
        want = planned[min(attempt, len(planned) - 1)] if isinstance(attempt, int) and attempt >= 0 else None
        if event.get("world_size") != want or not (isinstance(event.get("rank"), int) and 0 <= event["rank"] < (want or 0)):
            problems.append(f"attempt {attempt} was given WORLD_SIZE={want} but its events say rank "
                            f"{event.get('rank')!r} of world_size {event.get('world_size')!r}: the command ignores "
                            "torchrun's RANK/WORLD_SIZE; build the probe with Probe.from_env()")
            break
    steps = [e for e in rank_events if e.get("kind") == "step"]
    if not steps:
        problems.append("the command applied no update (no `step` event): it exited or failed before its "
                        f"first step; see {RunDir(run_dir).logs}")
    return problems
