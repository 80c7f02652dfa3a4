"""What a job runs: `JobSpec.target`, a `Reference` trainer config or a user's `Command`.

The two kinds of job differ in four things, and each target owns them, so the one
run-and-judge path (harness/judge/runner.py `run_judged`, harness/judge/golden.py `golden_for`)
dispatches on the object instead of callers choosing a pipeline:

- what it checks before any process starts (`check`) and writes into run.json (`run_json`);
- its golden run: the cache entry's name and the uninterrupted job to build it (`golden_name`,
  `golden_spec`, `golden_failure`);
- its judgement: the invariants, plus for a command the run-format contract (`judge`, `problems`);
- the line that reruns it (`reproduce`).

The user's command lives in harness/supervise/command/target.py (`Command`); this module holds the protocol and
the reference trainer. Neither imports JobSpec (harness/supervise/spec.py imports them): a golden
spec is built with `type(spec)(...)` or `dataclasses.replace`.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from trainwreck import trainer
from trainwreck.harness.errors import SpecError
from trainwreck.harness.registry import DEFAULT_LAUNCHER, REFERENCE
from trainwreck.harness.supervise.scenarios import custom_scenario
from trainwreck.invariants import Judgement, judge, load_history
from trainwreck.trainer.config import ConfigError, TrainConfig
from trainwreck.trainer.rundir import RunDir, run_json_fields


class Target(Protocol):
    """What a job runs; harness/registry.py says which launchers serve each `kind`."""

    kind: ClassVar[str]
    judged_without_golden: ClassVar[bool]
    """True: a failed golden run makes the verdict "unknown" (the user's command broke);
    False: it is raised (the reference trainer failing uninterrupted is a harness bug)."""
    explains_crashes: ClassVar[bool]
    """True: report/crash_cause.py can name an unplanned crash from its logs."""

    def check(self, spec: Any) -> None:
        """Raise SpecError/PlanError when `spec` cannot run this target (before any process starts)."""

    def run_json(self, spec: Any, extras: dict[str, Any]) -> dict[str, Any]:
        """run.json of a job of this target: the DESIGN fields it knows plus `extras`."""

    def golden_name(self, spec: Any) -> str:
        """The golden cache entry of `spec`: equal for every spec with the same uninterrupted run."""

    def golden_spec(self, spec: Any, run_dir: Path) -> Any:
        """The uninterrupted job whose run `spec` is judged against."""

    def golden_failure(self, record: Any) -> str | None:
        """Why the golden run in `record` cannot serve as one; None when it can."""

    def repeat_spec(self, spec: Any, run_dir: Path) -> Any | None:
        """A short second uninterrupted job whose first updates must equal the golden run's (is the
        trainer deterministic? harness/supervise/command/repeat.py); None: nothing to check."""

    def problems(self, run_dir: Path) -> list[str]:
        """Why a run of this target cannot be judged, each with the fix; empty when it can."""

    def judge(self, run_dir: Path, golden_dir: Path | None) -> Judgement:
        """The run's judgement; `golden_dir` None: the run is itself a golden run."""

    def reproduce(self, spec: Any, scenario: str | None = None) -> str:
        """The exact command that reruns `spec` and judges it again."""


MAX_INLINE_PLAN = 32 * 1024
"""Longest plan put on the reproduce line itself; Linux refuses one argument over 128 KiB
(MAX_ARG_STRLEN) and people paste these lines, so a larger plan goes into a file."""


def trainer_source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(Path(trainer.__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def golden_key(cfg: TrainConfig, world_size: int) -> str:
    """The reference golden cache key: the config, the world size and the trainer's source."""
    payload = json.dumps({"config": cfg.to_dict(), "world_size": world_size,
                          "trainer": trainer_source_hash()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Reference:
    """The reference trainer (or a planted defect of it, `config.variant`) with this config."""

    config: TrainConfig
    kind: ClassVar[str] = REFERENCE
    judged_without_golden: ClassVar[bool] = False
    explains_crashes: ClassVar[bool] = True

    def check(self, spec: Any) -> None:
        if not isinstance(self.config, TrainConfig):
            raise SpecError(f"config must be a TrainConfig, got {type(self.config).__name__}")
        for size in spec.world_sizes:
            try:
                self.config.check_world_size(size)
            except ConfigError as exc:
                raise SpecError(str(exc)) from None
        if spec.hooks_factory is None:  # a custom factory defines its own in-rank kinds
            from trainwreck.faults.plan import validate_plan

            validate_plan(spec.plan, self.config, spec.world_sizes)

    def run_json(self, spec: Any, extras: dict[str, Any]) -> dict[str, Any]:
        return run_json_fields(self.config, list(spec.world_sizes), hang_timeout_s=spec.hang_timeout_s,
                               faults=spec.plan, **extras, entry=spec.entry, hooks_factory=spec.hooks_factory,
                               scenario=spec.scenario)

    def golden_name(self, spec: Any) -> str:
        return golden_key(self.golden_config(), spec.world_sizes[0])

    def golden_config(self) -> TrainConfig:
        """Always the *reference* trainer's: a planted defect's own uninterrupted run would
        carry the defect (an epoch-blind shuffle, a lost RNG) and hide it from the comparison."""
        return replace(self.config, variant="reference")

    def golden_spec(self, spec: Any, run_dir: Path) -> Any:
        return type(spec)(config=self.golden_config(), world_sizes=(spec.world_sizes[0],), run_dir=run_dir,
                          keep=True, launcher=DEFAULT_LAUNCHER, max_restarts=0)

    def golden_failure(self, record: Any) -> str | None:
        if record.status == "completed":
            return None
        return f"the golden run failed ({record.outcome}); see {record.run_dir}"

    def repeat_spec(self, spec: Any, run_dir: Path) -> Any | None:
        return None  # seeded by construction; the defect table proves its determinism

    def problems(self, run_dir: Path) -> list[str]:
        return []

    def judge(self, run_dir: Path, golden_dir: Path | None) -> Judgement:
        return judge(load_history(run_dir), load_history(golden_dir) if golden_dir is not None else None)

    def reproduce(self, spec: Any, scenario: str | None = None) -> str:
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
                  "--total-steps", str(self.config.total_steps),
                  "--hang-timeout", f"{spec.hang_timeout_s:g}",
                  "--launcher", spec.launcher]
        # Every other field that differs from a custom run's config (parallelism, --set ...), so the line is exact.
        base = custom_scenario().train_config().to_dict()
        parts += [f"--set={k}={v}" for k, v in self.config.to_dict().items()
                  if k not in ("total_steps", "variant") and v != base[k]]
        return shlex.join(parts)


def reproduce_command(spec: Any, scenario: str | None = None) -> str:
    """The `trainwreck run` line that repeats a reference `spec` (Reference.reproduce)."""
    return Reference(spec.config).reproduce(spec, scenario)


__all__ = ["MAX_INLINE_PLAN", "Reference", "Target", "golden_key", "reproduce_command",
           "trainer_source_hash"]
