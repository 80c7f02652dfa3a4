"""What one supervised job is: the trainer config, the world-size schedule, the plan, the limits.

Everything is checked in ``__post_init__`` so a bad job fails before any process starts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwreck.trainer.config import ConfigError, InputError, TrainConfig

LAUNCHERS = ("warm", "spawn", "torchrun", "cmd")
DEFAULT_ENTRY = "trainwreck.trainer.entry:run_rank"
MAX_TIMEOUT_S = 3600.0
"""The longest hang, checkpoint or startup budget: an hour without progress is a hang on any machine."""
MAX_WORLD_SIZE = 1024
"""Ranks per attempt: one host runs them all (one process each)."""
MAX_ATTEMPTS = 1000
"""Entries of world_sizes (the last one repeats anyway)."""


class SpecError(InputError):
    """A job specification is unusable; the message names the field and the fix."""


@dataclass(frozen=True)
class JobSpec:
    config: TrainConfig
    """The trainer configuration every rank of every attempt runs with."""
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
    max_restarts: int = 3
    """Restarts allowed after the first attempt (the run has at most max_restarts + 1 attempts)."""
    no_progress_patience: int = 1
    """Consecutive restarts that may fail to advance the newest committed checkpoint before giving up."""
    launcher: str = "warm"
    """How ranks start: warm (fork server), spawn (fresh interpreters) or torchrun (elastic agent)."""
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
    """Which hang watchdog supervises: 'reference', or a planted defect from harness/watchdogs.py (self-tests)."""
    command: str | None = None
    """launcher 'cmd': the user's command line, started once per rank with torchrun's environment
    (harness/launchers.py CmdLauncher); its trainer writes the run format through the probe."""
    ckpt_dir: str = "checkpoints"
    """launcher 'cmd': the command's checkpoint directory, relative to the run directory (corrupt faults damage its newest entry)."""
    scenario: dict[str, Any] | None = None
    """The built-in scenario this job runs (name, summary, question, threatens), recorded in
    run.json so a report can quote it without knowing where the job came from."""

    def __post_init__(self) -> None:
        if not isinstance(self.config, TrainConfig):
            raise SpecError(f"config must be a TrainConfig, got {type(self.config).__name__}")
        sizes = tuple(self.world_sizes)
        if not sizes:
            raise SpecError("world_sizes is empty; give at least one world size, e.g. (2,)")
        for size in sizes:
            if not isinstance(size, int) or isinstance(size, bool):
                raise SpecError(f"world size {size!r} is not an integer")
            try:
                self.config.check_world_size(size)
            except ConfigError as exc:
                raise SpecError(str(exc)) from None
        object.__setattr__(self, "world_sizes", sizes)
        if self.launcher not in LAUNCHERS:
            raise SpecError(f"unknown launcher {self.launcher!r}; known launchers: {', '.join(LAUNCHERS)}")
        if self.launcher == "torchrun" and len(set(sizes)) > 1:
            raise SpecError(
                f"world_sizes={list(sizes)}: the torchrun launcher restarts with a fixed "
                "--nproc-per-node, so the world size cannot change between attempts; "
                "use launcher 'warm' or 'spawn' for a world-size schedule"
            )
        if (self.launcher == "cmd") != (self.command is not None):
            raise SpecError("launcher 'cmd' and command go together: give both (trainwreck run --cmd \"python train.py\") "
                            "or neither")
        for name in ("hang_timeout_s", "checkpoint_timeout_s", "startup_timeout_s", "poll_interval_s"):
            value = getattr(self, name)
            # inf: a hang would never be declared and the run never end; nan passes no bound.
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecError(f"{name}={value} is not a finite number of seconds; give e.g. 10")
        for name in ("hang_timeout_s", "checkpoint_timeout_s", "startup_timeout_s"):
            value = getattr(self, name)
            if value is not None and value > MAX_TIMEOUT_S:
                raise SpecError(f"{name}={value} exceeds the limit of {MAX_TIMEOUT_S:g} s: a watchdog that waits "
                                f"longer never reports a stopped rank; give at most {MAX_TIMEOUT_S:g}")
        if len(sizes) > MAX_ATTEMPTS or max(sizes) > MAX_WORLD_SIZE:
            raise SpecError(f"world_sizes has {len(sizes)} entries up to {max(sizes)}: the limits are "
                            f"{MAX_ATTEMPTS} attempts and {MAX_WORLD_SIZE} ranks per attempt; give fewer")
        if not self.hang_timeout_s > 0:
            raise SpecError(f"hang_timeout_s={self.hang_timeout_s} must be > 0")
        if self.checkpoint_timeout_s is not None and not self.checkpoint_timeout_s > 0:
            raise SpecError(f"checkpoint_timeout_s={self.checkpoint_timeout_s} must be > 0 (or None)")
        if self.startup_timeout_s is not None and not self.startup_timeout_s > 0:
            raise SpecError(f"startup_timeout_s={self.startup_timeout_s} must be > 0 (or None)")
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
        from trainwreck.harness.watchdogs import watchdog_class
        try:
            watchdog_class(self.watchdog)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if self.watchdog != "reference" and self.launcher == "torchrun":
            raise SpecError(f"watchdog={self.watchdog!r} is a planted defect of the warm/spawn supervisor; "
                            "use launcher 'warm' or 'spawn' with it")
        if not isinstance(self.plan, list) or not all(isinstance(f, dict) for f in self.plan):
            raise SpecError("plan must be a list of fault objects (dicts with 'id' and 'kind')")
        # Every fault is checked against this job (kinds, fields, ranks, steps) before any
        # process starts; the external ones also by the injector the harness will run.
        from trainwreck.faults.external import EXTERNAL_KINDS, ExternalFaults
        from trainwreck.faults.plan import PlanError, validate_plan
        try:
            ExternalFaults(self.plan)
            if self.command is not None:  # a user's command: only what its probe can reach
                from trainwreck.faults.cmdrank import CMD_KINDS
                from trainwreck.faults.plan import parse_plan
                parse_plan([f for f in self.plan if f.get("kind") != "corrupt"])  # corrupt: its --cmd rules below
                allowed = (*EXTERNAL_KINDS, "corrupt", *CMD_KINDS)
                refused = [f"{f.get('id')} ({f.get('kind')})" for f in self.plan if f.get("kind") not in allowed]
                if refused:
                    raise PlanError(f"fault(s) {', '.join(refused)}: a --cmd run takes only {', '.join(allowed)} "
                                    "(a foreign trainer has no storage seam or gradient hook the harness can "
                                    "reach; docs/FRAMEWORKS.md); remove the others")
                if Path(self.ckpt_dir).is_absolute() or ".." in Path(self.ckpt_dir).parts:
                    raise PlanError(f"ckpt_dir={self.ckpt_dir!r} must be a path inside the run directory, "
                                    "e.g. 'checkpoints'")
                from trainwreck.harness.cmdfaults import check_corrupt_fault
                for fault in self.plan:
                    if fault.get("kind") == "corrupt":
                        try:
                            check_corrupt_fault(fault)
                        except ValueError as exc:
                            raise PlanError(str(exc)) from None
            elif self.hooks_factory is None:  # a custom factory defines its own in-rank kinds
                validate_plan(self.plan, self.config, sizes)
        except PlanError as exc:
            raise SpecError(str(exc)) from None
        if self.run_dir is not None:
            object.__setattr__(self, "run_dir", Path(self.run_dir))

    @property
    def checkpoint_budget_s(self) -> float:
        return self.checkpoint_timeout_s if self.checkpoint_timeout_s is not None else 3 * self.hang_timeout_s

    @property
    def startup_budget_s(self) -> float:
        if self.startup_timeout_s is not None:
            return self.startup_timeout_s
        # Forked ranks publish within milliseconds; fresh interpreters import torch first,
        # several seconds each, all at once on a few shared cores.
        return self.hang_timeout_s if self.launcher == "warm" else max(self.hang_timeout_s, 120.0)

    def world_size_for(self, attempt: int) -> int:
        return self.world_sizes[min(attempt, len(self.world_sizes) - 1)]
