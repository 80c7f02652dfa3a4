"""What one supervised job is: its target, the world-size schedule, the plan, the limits.

The target says what runs (`Reference`, the reference trainer's config, and `ReplicaGroups`, below, or a
user's command in harness/supervise/command/target.py), the launcher how its ranks start
(harness/registry.py). Everything is checked in ``JobSpec.__post_init__`` so a bad job fails before any
process starts.

The kinds of job differ in four things, and each target owns them, so the one
run-and-judge path (harness/judge/runner.py `run_judged`, harness/judge/golden.py `golden_for`)
dispatches on the object instead of callers choosing a pipeline:

- what it checks before any process starts (`check`) and writes into run.json (`run_json`);
- its golden run: the cache entry's name and the uninterrupted job to build it (`golden_name`,
  `golden_spec`, `golden_failure`);
- its judgement: the invariants, plus for a command the run-format contract (`judge`, `problems`);
- the line that reruns it (`reproduce`).

The user's command lives in harness/supervise/command/target.py (`Command`); this module holds the protocol, the
reference trainer and replica groups (whose launcher is harness/supervise/replicas.py: one group
restarts while the others train on). A target never names JobSpec, so the command's target needs nothing
from this module: a golden spec is built with `type(spec)(...)` or `dataclasses.replace`.
"""
from __future__ import annotations

import hashlib
import json
import math
import shlex
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from trainwreck import trainer
from trainwreck.harness.errors import SpecError
from trainwreck.harness.launch import gpus
from trainwreck.harness.registry import (DEFAULT_LAUNCHER, LAUNCHERS, REFERENCE, REPLICA_GROUPS, LauncherKind,
                                         UnknownLauncher, default_launcher, get_launcher)
from trainwreck.harness.supervise.scenarios import CUSTOM, Scenario, custom_scenario
from trainwreck.invariants import InputError, Judgement, judge, load_history
from trainwreck.invariants.verdict import UNKNOWN
from trainwreck.trainer.config import ConfigError, TrainConfig
from trainwreck.trainer.launch import takes_cuda
from trainwreck.rundir.events import FORMAT
from trainwreck.rundir.layout import RunDir
from trainwreck.trainer.standalone import run_json_fields


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


LIGHTHOUSE_KIND = "lighthouse_kill"
"""Replica groups' own fault kind, {"id", "kind", "step"}: the harness SIGKILLs torchft's lighthouse
once any rank reached update `step`, and restarts it on the same port (harness/supervise/replicas.py)."""
RESTART_SCOPES = ("group", "job")
REPLICA_RUNNER = "trainwreck.harness.supervise.replicas"
"""`python -m` this with --spec JSON [--out DIR] reruns a replica-group job and judges it."""


@dataclass(frozen=True)
class ReplicaGroups:
    """A torchft trainer whose ranks form `groups` equal replica groups: `command` runs once per rank,
    the groups meet in a quorum through a lighthouse, and a group that fails restarts alone and
    heals from a live peer (the "replica-groups" launcher, harness/supervise/replicas.py). The job
    keeps its other limits on JobSpec: world_sizes[0] is every group's ranks together, max_restarts
    the restarts each group may take, hang_timeout_s the watchdog's."""

    command: str
    """The command that trains one rank, e.g. "python -m trainwreck.trainer.frameworks.torchft_train"."""
    groups: int = 2
    lost_groups: tuple[int, ...] = ()
    """Groups that are never restarted (a group that never comes back)."""
    restart: str = "group"
    """"group": a failed group restarts alone; "job": every group stops and restarts together (the
    whole-job restart of every other launcher, for comparison)."""
    heartbeat_timeout_s: float = 5.0
    """The lighthouse's --heartbeat_timeout_ms (torchft's default: 5 s)."""
    join_timeout_s: float = 1.0
    """The lighthouse's --join_timeout_ms: how long a quorum waits for stragglers."""
    kind: ClassVar[str] = REPLICA_GROUPS
    judged_without_golden: ClassVar[bool] = True
    explains_crashes: ClassVar[bool] = False  # its exit events name a group incarnation, not an attempt

    @staticmethod
    def fault_kinds() -> tuple[str, ...]:
        """A rank fires what a --cmd rank's probe fires at its fault points (it builds faults/foreign.py's
        hooks, KINDS' `command` in-rank kinds); the harness adds the lighthouse kill."""
        from trainwreck.faults.plan import IN_RANK, KINDS, command_kinds

        return (*(k for k in command_kinds() if KINDS[k].where == IN_RANK), LIGHTHOUSE_KIND)

    def group_size(self, world_size: int) -> int:
        return world_size // self.groups

    def check(self, spec: Any) -> None:
        self.check_command()
        self.check_groups(spec.world_sizes)
        self.check_plan(spec.plan, spec.world_sizes[0])

    def check_command(self) -> None:
        try:
            argv = shlex.split(self.command)
        except ValueError as exc:
            raise SpecError(f"command {self.command!r} cannot be split into words ({exc}); check its quotes") from None
        if not argv:
            raise SpecError("ReplicaGroups.command is empty; give the command that trains one rank")
        if self.restart not in RESTART_SCOPES:
            raise SpecError(f"restart={self.restart!r} is not a restart scope; use 'group' or 'job'")
        for name in ("heartbeat_timeout_s", "join_timeout_s"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 < value < float("inf"):
                raise SpecError(f"{name}={value!r} must be a positive number of seconds, e.g. 5")

    def check_groups(self, world_sizes: tuple[int, ...]) -> None:
        """The job's ranks split into `groups` equal groups; `lost_groups` among them."""
        if type(self.groups) is not int or self.groups < 1 or world_sizes[0] % self.groups:
            raise SpecError(f"world_sizes={list(world_sizes)} cannot be split into groups={self.groups!r} "
                            "equal replica groups; give groups >= 1 and a world size that is a multiple of it")
        lost = [g for g in self.lost_groups if type(g) is not int or not 0 <= g < self.groups]
        if lost:
            raise SpecError(f"lost_groups={list(self.lost_groups)}: {lost} are not groups of this job; "
                            f"give groups 0 to {self.groups - 1}")

    def check_plan(self, plan: list[dict[str, Any]], world_size: int) -> None:
        """Only the kinds this job fires (`fault_kinds`), shaped as KINDS declares, at ranks of the job."""
        from trainwreck.faults.errors import PlanError
        from trainwreck.faults.plan import check_kinds, parse_plan

        check_kinds(plan, self.fault_kinds(), "a replica-group job", "its ranks fire their probe's faults and "
                    "the harness kills the lighthouse; it sends no signal and reaches no storage seam")
        parse_plan([f for f in plan if f["kind"] != LIGHTHOUSE_KIND])
        for fault in plan:
            if fault["kind"] == LIGHTHOUSE_KIND:
                check_lighthouse_fault(fault)
            elif fault["rank"] >= world_size:
                raise PlanError(f"fault {fault['id']!r}: rank {fault['rank']} is outside the job's {world_size} "
                                f"ranks (world_sizes[0], every group together); give a rank below {world_size}")

    def describe(self, spec: Any) -> dict[str, Any]:
        """run.json's `replica_groups`: the judge picks the replica-aware checkers by it."""
        return {"groups": self.groups, "group_world_size": self.group_size(spec.world_sizes[0]),
                "restart": self.restart, "max_group_restarts": spec.max_restarts,
                "lost_groups": list(self.lost_groups), "heartbeat_timeout_s": self.heartbeat_timeout_s,
                "join_timeout_s": self.join_timeout_s}

    def run_json(self, spec: Any, extras: dict[str, Any]) -> dict[str, Any]:
        """The dataset fields are the trainer's own: its probe adds them, as a command's does. The job
        never restarts as a whole (attempt 0 throughout: docs/DESIGN.md), so `max_restarts` is 0;
        the groups' budget is `replica_groups.max_group_restarts`."""
        return {"format": FORMAT, "hang_timeout_s": spec.hang_timeout_s, "world_sizes": list(spec.world_sizes),
                "faults": spec.plan, **extras, "max_restarts": 0, "command": self.command,
                "scenario": spec.scenario, "replica_groups": self.describe(spec)}

    def golden_name(self, spec: Any) -> str:
        from trainwreck.harness.supervise.cmdkey import cmd_golden_key

        return f"replicas-{self.groups}-{cmd_golden_key(self.command, spec.world_sizes[0])}"

    def golden_spec(self, spec: Any, run_dir: Path) -> Any:
        return replace(spec, world_sizes=spec.world_sizes[:1], plan=[], run_dir=run_dir, keep=True, scenario=None)

    def golden_failure(self, record: Any) -> str | None:
        if record.status == "completed":
            return None
        return f"the golden run of the replica groups failed ({record.outcome}); see {record.run_dir}/logs"

    def repeat_spec(self, spec: Any, run_dir: Path) -> Any | None:
        return None

    def problems(self, run_dir: Path) -> list[str]:
        return []

    def judge(self, run_dir: Path, golden_dir: Path | None) -> Judgement:
        """The replica-aware checkers judge a run from its own events (each heal against the state its
        peer served, each id against the dataset), so no golden run is compared. A run the trainer
        left unreadable (no dataset fields: every rank died first) is "unknown", with why."""
        try:
            return judge(load_history(run_dir))
        except InputError as exc:
            return Judgement(UNKNOWN, {}, [], [f"the replica groups' run cannot be judged: {exc}"])

    def reproduce(self, spec: Any, scenario: str | None = None) -> str:
        job = {"target": asdict(self), "plan": spec.plan,
               "world_sizes": list(spec.world_sizes), "hang_timeout_s": spec.hang_timeout_s,
               "max_restarts": spec.max_restarts}
        return shlex.join(["python", "-m", REPLICA_RUNNER, "--spec", json.dumps(job, separators=(",", ":"))])


def replica_job_fields(text: str) -> dict[str, Any]:
    """JobSpec's fields from the --spec of a `ReplicaGroups.reproduce` line; SpecError when it is not one."""
    try:
        job = json.loads(text)
        target = job["target"]
        return {"target": ReplicaGroups(**{**target, "lost_groups": tuple(target.get("lost_groups", ()))}),
                "plan": list(job.get("plan", [])), "world_sizes": tuple(job["world_sizes"]),
                "hang_timeout_s": job["hang_timeout_s"], "max_restarts": job["max_restarts"]}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SpecError(f"--spec is not a replica-group job ({type(exc).__name__}: {exc}); copy it whole from "
                        "the reproduce line, which gives target, plan, world_sizes, hang_timeout_s, max_restarts") from None


def check_lighthouse_fault(fault: dict[str, Any]) -> None:
    from trainwreck.faults.errors import PlanError

    step = fault.get("step")
    if set(fault) - {"id", "kind", "step"} or not isinstance(fault.get("id"), str) or type(step) is not int \
            or step < 0:
        raise PlanError(f"fault {fault.get('id')!r}: a {LIGHTHOUSE_KIND} fault is "
                        f"{{\"id\": \"...\", \"kind\": \"{LIGHTHOUSE_KIND}\", \"step\": N}} with N >= 0; got {fault}")


def reproduce_command(spec: Any, scenario: str | None = None) -> str:
    """The `trainwreck run` line that repeats a reference `spec` (Reference.reproduce)."""
    return Reference(spec.config).reproduce(spec, scenario)


__all__ = ["LIGHTHOUSE_KIND", "MAX_INLINE_PLAN", "Reference", "ReplicaGroups", "Target", "golden_key",
           "replica_job_fields", "reproduce_command", "trainer_source_hash"]


DEFAULT_ENTRY = "trainwreck.trainer.entry:run_rank"
MAX_TIMEOUT_S = 3600.0
"""The longest hang, checkpoint or startup budget: an hour without progress is a hang on any machine."""
MIN_EXIT_BUDGET_S = 30.0
"""The default exit budget's floor: a teardown (gc, barrier, process group, interpreter) on a loaded
machine takes seconds whatever the hang budget, and a 2 s hang budget must not make it 6."""
MAX_WORLD_SIZE = 1024
"""Ranks per attempt: one host runs them all (one process each)."""
MAX_ATTEMPTS = 1000
"""Entries of world_sizes (the last one repeats anyway)."""

__all__ = ["DEFAULT_ENTRY", "LAUNCHERS", "JobSpec", "SpecError"]


@dataclass(frozen=True)
class JobSpec:
    config: TrainConfig | None = None
    """The reference trainer's configuration: shorthand for target=Reference(config), and
    target.config of a Reference target; None for any other target."""
    world_sizes: tuple[int, ...] = (2,)
    """Planned world size per attempt; the last one repeats for later attempts."""
    plan: list[dict[str, Any]] = field(default_factory=list)
    """The fault plan (faults/ interprets it; the harness applies the external kinds itself)."""
    hang_timeout_s: float = 10.0
    """Seconds without any rank's progress changing before the watchdog declares a hang."""
    checkpoint_timeout_s: float | None = None
    """Budget while a rank is in the checkpoint phase; None means 3 x hang_timeout_s."""
    startup_timeout_s: float | None = None
    """Budget while a rank sets up (not yet in its first update); None: hang_timeout_s (warm) or 120 s
    (spawn, torchrun), at least 60 s for ranks on CUDA (harness/registry.py CUDA_STARTUP_S)."""
    exit_timeout_s: float | None = None
    """Budget from a rank's "done" to its exit; None means 3 x hang_timeout_s, at least MIN_EXIT_BUDGET_S.
    A rank over it is stack-dumped, killed and recorded (`exit_overdue`); its training was over, so the
    attempt completed."""
    max_restarts: int = 3
    """Restarts allowed after the first attempt (the run has at most max_restarts + 1 attempts)."""
    no_progress_patience: int = 1
    """Consecutive restarts that may fail to advance the newest committed checkpoint before giving up."""
    launcher: str | None = None
    """How ranks start: a name in harness/registry.py LAUNCHERS; None: the target's default."""
    run_dir: Path | None = None
    """Where the run directory goes; None: a temporary directory, removed afterwards unless keep."""
    keep: bool = False
    """Keep a temporary run directory after the job (ignored when run_dir is given: that is always kept)."""
    entry: str = DEFAULT_ENTRY
    """`module:function` each rank calls as fn(ctx, cfg, hooks); another trainer can be plugged in here."""
    hooks_factory: str | None = None
    """`module:function` building the rank's Hooks from the plan; None: faults.inrank.build_hooks."""
    poll_interval_s: float = 0.02
    """How often the supervisor reads progress files (at most 0.1 s, so faults fire near their step)."""
    watchdog: str = "reference"
    """Which hang watchdog supervises: 'reference', or a planted defect from harness/supervise/watchdog_variants.py (self-tests)."""
    scenario: dict[str, Any] | None = None
    """The built-in scenario this job runs (name, summary, question, threatens), recorded in
    run.json so a report can quote it without knowing where the job came from."""
    target: Target | None = None
    """What runs: Reference(config) (given `config` alone, this is built for you) or a user's
    Command(command, ckpt_dir) from harness/supervise/command/target.py."""

    def __post_init__(self) -> None:
        self._resolve_target()
        sizes = tuple(self.world_sizes)
        if not sizes:
            raise SpecError("world_sizes is empty; give at least one world size, e.g. (2,)")
        for size in sizes:
            if not isinstance(size, int) or isinstance(size, bool):
                raise SpecError(f"world size {size!r} is not an integer")
        object.__setattr__(self, "world_sizes", sizes)
        self._check_launcher()
        for name in ("hang_timeout_s", "checkpoint_timeout_s", "startup_timeout_s", "exit_timeout_s", "poll_interval_s"):
            value = getattr(self, name)
            # inf: a hang would never be declared and the run never end; nan passes no bound.
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecError(f"{name}={value} is not a finite number of seconds; give e.g. 10")
        for name in ("hang_timeout_s", "checkpoint_timeout_s", "startup_timeout_s", "exit_timeout_s"):
            value = getattr(self, name)
            if value is not None and value > MAX_TIMEOUT_S:
                raise SpecError(f"{name}={value} exceeds the limit of {MAX_TIMEOUT_S:g} s: a watchdog that waits "
                                f"longer never reports a stopped rank; give at most {MAX_TIMEOUT_S:g}")
        if len(sizes) > MAX_ATTEMPTS or max(sizes) > MAX_WORLD_SIZE:
            raise SpecError(f"world_sizes has {len(sizes)} entries up to {max(sizes)}: the limits are "
                            f"{MAX_ATTEMPTS} attempts and {MAX_WORLD_SIZE} ranks per attempt; give fewer")
        if not self.hang_timeout_s > 0:
            raise SpecError(f"hang_timeout_s={self.hang_timeout_s} must be > 0")
        for name in ("checkpoint_timeout_s", "startup_timeout_s", "exit_timeout_s"):
            if (value := getattr(self, name)) is not None and not value > 0:
                raise SpecError(f"{name}={value} must be > 0 (or None)")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise SpecError(f"max_restarts={self.max_restarts!r} must be an integer >= 0")
        if not isinstance(self.no_progress_patience, int) or self.no_progress_patience < 1:
            raise SpecError(f"no_progress_patience={self.no_progress_patience!r} must be an integer >= 1")
        if not 0 < self.poll_interval_s <= 0.1:
            raise SpecError(f"poll_interval_s={self.poll_interval_s} must be in (0, 0.1]")
        for name in ("entry", "hooks_factory"):
            value = getattr(self, name)
            if value is not None and ":" not in value:
                raise SpecError(f"{name}={value!r} must look like 'package.module:function'")
        from trainwreck.harness.supervise.watchdog_variants import watchdog_class
        try:
            watchdog_class(self.watchdog)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if self.watchdog != "reference" and not self.launcher_kind.planted_watchdogs:
            raise SpecError(f"watchdog={self.watchdog!r} is a planted defect of the harness's own attempt loop; "
                            f"use launcher {' or '.join(repr(n) for n in _planted_watchdog_launchers())} with it")
        if not isinstance(self.plan, list) or not all(isinstance(f, dict) for f in self.plan):
            raise SpecError("plan must be a list of fault objects (dicts with 'id' and 'kind')")
        # Every fault is checked against this job (kinds, fields, ranks, steps) before any
        # process starts: the external ones by the injector the harness will run, the rest by the target.
        from trainwreck.faults.external import ExternalFaults
        from trainwreck.faults.plan import PlanError
        try:
            ExternalFaults(self.plan)
            self.target.check(self)
        except PlanError as exc:
            raise SpecError(str(exc)) from None
        if self.run_dir is not None:
            object.__setattr__(self, "run_dir", Path(self.run_dir))

    @property
    def checkpoint_budget_s(self) -> float:
        return self.checkpoint_timeout_s if self.checkpoint_timeout_s is not None else 3 * self.hang_timeout_s

    @property
    def exit_budget_s(self) -> float:
        if self.exit_timeout_s is not None:
            return self.exit_timeout_s
        return max(3 * self.hang_timeout_s, MIN_EXIT_BUDGET_S)

    @property
    def startup_budget_s(self) -> float:
        if self.startup_timeout_s is not None:
            return self.startup_timeout_s
        return self.launcher_kind.startup_budget_s(self.hang_timeout_s, cuda=self.on_cuda)

    @property
    def on_cuda(self) -> bool:
        """Whether the reference trainer's ranks may run on CUDA devices in some attempt: nccl, or
        `pick_device`'s rule (trainer/launch.py `takes_cuda`) for the smallest attempt. A command's
        device is unknown; its launchers' floor is longer anyway."""
        cfg = self.config
        if cfg is None or cfg.device == "cpu":  # never counts the GPUs, which starts CUDA's driver here
            return False
        return cfg.backend == "nccl" or takes_cuda(cfg.device, gpus.cuda_device_count(), min(self.world_sizes))

    @property
    def launcher_kind(self) -> LauncherKind:
        """This job's launcher declaration (harness/registry.py)."""
        return get_launcher(str(self.launcher))

    def _resolve_target(self) -> None:
        """`config` alone means Reference(config); a Reference target fills in `config`."""
        target, config = self.target, self.config
        if target is None:
            if config is None:
                raise SpecError("a job needs a target: config=TrainConfig(...) for the reference trainer, "
                                "or target=Command('python train.py') for your own")
            if not isinstance(config, TrainConfig):
                raise SpecError(f"config must be a TrainConfig, got {type(config).__name__}")
            object.__setattr__(self, "target", Reference(config))
        elif isinstance(target, Reference) and config is None:
            object.__setattr__(self, "config", target.config)
        elif config is not None and getattr(target, "config", None) != config:
            raise SpecError(f"config and target={type(target).__name__} disagree; give one of them "
                            "(replace(spec, target=...) to change what runs)")

    def _check_launcher(self) -> None:
        if self.launcher is None:
            object.__setattr__(self, "launcher", default_launcher(self.target.kind))
        try:
            kind = get_launcher(self.launcher)
        except UnknownLauncher as exc:
            raise SpecError(str(exc)) from None
        if self.target.kind not in kind.serves:
            serving = [n for n, k in LAUNCHERS.items() if self.target.kind in k.serves]
            raise SpecError(f"launcher {kind.name!r} does not run a {self.target.kind} target; "
                            f"use {' or '.join(map(repr, serving))}")
        if kind.fixed_world_size and len(set(self.world_sizes)) > 1:
            changing = [n for n, k in LAUNCHERS.items() if not k.fixed_world_size and self.target.kind in k.serves]
            fix = (f"use launcher {' or '.join(map(repr, changing))} for a world-size schedule" if changing
                   else f"give one world size, e.g. world_sizes=({self.world_sizes[0]},)")
            raise SpecError(f"world_sizes={list(self.world_sizes)}: the {kind.name} launcher keeps the world size "
                            f"of its first attempt, so it cannot change between attempts; {fix}")
        growing = [b for a, b in zip(self.world_sizes, self.world_sizes[1:]) if b > a]
        if kind.shrink_only and growing:
            raise SpecError(f"world_sizes={list(self.world_sizes)} grows to {growing[0]}: the {kind.name} launcher's "
                            "group only shrinks (a lost node is not given back); give a schedule that never grows, "
                            f"e.g. world_sizes=({max(self.world_sizes)}, {min(self.world_sizes)})")

    def world_size_for(self, attempt: int) -> int:
        return self.world_sizes[min(attempt, len(self.world_sizes) - 1)]


def _planted_watchdog_launchers() -> list[str]:
    return [n for n, k in LAUNCHERS.items() if k.planted_watchdogs]


def spec_for(scenario: Scenario, out: Path, launcher: str = DEFAULT_LAUNCHER, variant: str = "reference",
             **overrides: Any) -> JobSpec:
    """The job of a built-in or custom scenario, its run directory kept. Here, beside JobSpec and free
    of torch, so `trainwreck run` refuses a bad field before it imports torch."""
    return JobSpec(config=replace(scenario.train_config(), variant=variant), world_sizes=scenario.world_sizes,
                   plan=[dict(f) for f in scenario.plan], hang_timeout_s=scenario.hang_timeout_s,
                   launcher=launcher, run_dir=out, keep=True,
                   scenario=None if scenario.name == CUSTOM else scenario.about(), **overrides)
