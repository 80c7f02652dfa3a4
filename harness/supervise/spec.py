"""What one supervised job is: its target, the world-size schedule, the plan, the limits.

The target says what runs (harness/supervise/targets.py: the reference trainer's config, or a user's
command in harness/supervise/command/target.py), the launcher how its ranks start (harness/registry.py).
Everything is checked in ``__post_init__`` so a bad job fails before any process starts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwreck.harness.errors import SpecError
from trainwreck.harness.registry import LAUNCHERS, LauncherKind, UnknownLauncher, default_launcher, get_launcher
from trainwreck.harness.supervise.targets import Reference, Target
from trainwreck.trainer.config import TrainConfig

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
    """Budget while a rank has not published yet; None: hang_timeout_s (warm) or 120 s (spawn, torchrun)."""
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
        return self.launcher_kind.startup_budget_s(self.hang_timeout_s)

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
