"""Run one job: attempts, supervision, external faults, hangs, restarts, cleanup.

    record = run_job(JobSpec(config=TrainConfig.tiny(), world_sizes=(2,)))

An attempt is W rank processes in one process group. It succeeds when every rank
exits 0; it fails when a rank exits non-zero or the watchdog declares a hang, and
then the whole attempt is killed and reaped before the restart policy decides:
restart (from the newest intact checkpoint, which the trainer finds itself) while
the budget lasts and restarts keep advancing the newest committed checkpoint.

`JobSupervisor` is what every supervisor shares, whatever starts its ranks: the run record,
the harness's event log, the `fault`/`hang`/`exit`/`end` events, and one `run` that always
ends the job cleanly. `Supervisor` below (warm, spawn, cmd: the harness's own attempt loop),
`harness/supervise/torchrun.py` (the elastic agent) and `harness/supervise/replicas.py`
(replica groups) each add only how an attempt's processes are started, watched and killed.
`run_job` asks the job's launcher declaration (harness/registry.py) which of them supervises.
"""
from __future__ import annotations

import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

from trainwreck.faults.external import ExternalFault, ExternalFaults
from trainwreck.harness.launch.launchers import Attempt, Launcher
from trainwreck.harness.launch.store import HarnessStore
from trainwreck.harness.supervise.create_rundir import create_run_dir
from trainwreck.harness.supervise.interrupts import Terminated, interrupt_of, raise_if_received, stop_on_signals
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.watchdog import Hang, Watchdog, WatchdogConfig, record_hang, record_overdue
from trainwreck.harness.supervise.watchdog_variants import watchdog_class
from trainwreck.rundir.events import EventLog
from trainwreck.rundir.layout import RunDir, iter_events, next_attempt

OUTCOMES = ("completed", "budget_exhausted", "no_progress", "error", "interrupted")
"""interrupted: SIGINT or SIGTERM reached the harness, which stopped the job (`end` status
"interrupted", with the signal): nothing about the trainer, so no verdict (docs/DESIGN.md)."""
REAP_TIMEOUT_S = 30.0
"""How long a SIGKILLed attempt may take to disappear (a rank in uninterruptible I/O)."""


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    """The run directory (already removed if it was temporary and not kept)."""
    status: str
    """completed, failed or interrupted, as in the `end` event."""
    outcome: str
    """completed, budget_exhausted, no_progress or error (see OUTCOMES)."""
    attempts: int
    """Attempts started."""
    final_step: int
    """The last update the final attempt applied."""
    hangs: int
    """Hangs the watchdog declared."""
    wall_s: float
    """Seconds from run_job's call to its return."""
    launch_s: tuple[float | None, ...] = ()
    """Per attempt: seconds from its launch until every rank reached its first update."""
    error: str | None = None
    """The harness's own traceback when outcome is error."""


@dataclass
class AttemptResult:
    ok: bool
    codes: dict[int, int | None] = field(default_factory=dict)
    hang: Hang | None = None
    launch_s: float | None = None


def newest_committed_step(run_dir: Path) -> int:
    """Step of the newest `save` (a durably committed checkpoint); -1 when none."""
    return max((e["step"] for e in iter_events(run_dir, batches=False) if e.get("kind") == "save"), default=-1)


def final_step(run_dir: Path, attempt: int) -> int:
    """The last update applied by `attempt` (its restore point when it applied none)."""
    steps = [e["step"] for e in iter_events(run_dir, batches=False)
             if e.get("attempt") == attempt and e.get("kind") in ("step", "restore") and "rank" in e]
    return max(steps, default=0)


def remove_empty_stacks(run_dir: Path, attempt: int) -> None:
    """Every rank opens its stack file at start; keep only the ones that hold a dump."""
    for path in RunDir(run_dir).attempt_stacks(attempt):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except FileNotFoundError:
            pass


class JobSupervisor:
    """One job from its first attempt to its `end` event. Subclasses implement `supervise`
    (run attempts until an outcome) and `kill_all` (leave no process behind)."""

    def __init__(self, spec: JobSpec, run_dir: Path) -> None:
        self.spec, self.run_dir = spec, run_dir
        # No base fields: harness events name their attempt explicitly.
        self.events = EventLog(RunDir(run_dir).harness_events)
        self.faults = ExternalFaults(spec.plan)
        self.watch_config = WatchdogConfig(spec.hang_timeout_s, spec.checkpoint_budget_s, spec.startup_budget_s,
                                           spec.exit_budget_s)
        self.attempt = next_attempt(run_dir)  # a run resumed from what an earlier job left continues after it
        self.hangs = 0
        self.launch_s: list[float | None] = []

    def supervise(self) -> str:
        """Run attempts until the job has an outcome (one of OUTCOMES)."""
        raise NotImplementedError

    def kill_all(self) -> None:
        """SIGKILL and reap every process of every attempt still alive."""
        raise NotImplementedError

    def end_fields(self) -> dict[str, Any]:
        """What this supervisor adds to the `end` event (replica groups: how often each group started)."""
        return {}

    def run(self, started: float) -> RunRecord:
        outcome, error, stop = "error", None, {}
        try:
            outcome = self.supervise()
        except (KeyboardInterrupt, Terminated) as exc:  # the harness was stopped, not the trainer: re-raised
            outcome, received = "interrupted", interrupt_of(exc)
            stop = {"signal": received.name, "signal_t": round(received.t, 6)}
            raise
        except Exception:  # noqa: BLE001 - the record says what broke; the ranks are reaped below
            error = traceback.format_exc()
            print(error, file=sys.stderr)
        finally:
            self.kill_all()
            status = outcome if outcome in ("completed", "interrupted") else "failed"
            last = final_step(self.run_dir, self.attempt)
            self.events.emit("end", status=status, final_step=last, outcome=outcome,
                             attempts=self.attempt + 1, **self.end_fields(), **stop)
            self.events.close()
        return RunRecord(run_dir=self.run_dir, status=status, outcome=outcome, attempts=self.attempt + 1,
                         final_step=last, hangs=self.hangs, wall_s=time.monotonic() - started,
                         launch_s=tuple(self.launch_s), error=error)

    def fire(self, attempt: int, fault: ExternalFault, steps: dict[int, int], pids: dict[int, int],
             send: Callable[[int, int], None]) -> None:
        """Apply an external fault: its `fault` event first (the judge must see it even if the
        signal takes the harness's view of the attempt down), then `send(rank, signum)`."""
        at = {r: steps.get(r) for r in fault.ranks}
        self.events.emit("fault", attempt=attempt, fault_id=fault.id,
                         rank=fault.rank, ranks=list(fault.ranks),
                         detail=f"{fault.describe()} (ranks were at steps {at})", signal=fault.signal,
                         pids=[pids[r] for r in fault.ranks])
        for rank in fault.ranks:
            send(rank, fault.signum)

    def on_hang(self, attempt: int, hang: Hang, live_pids: dict[int, int]) -> None:
        """Dump the live ranks' stacks and write the `hang` event."""
        self.hangs += 1
        record_hang(self.events, self.run_dir, attempt, hang, live_pids, self.watch_config.stack_wait_s)

    def on_overdue(self, attempt: int, watchdog: Watchdog, ranks: list[int], pids: dict[int, int]) -> None:
        """Dump the stacks of ranks that said "done" but outlived the exit budget, and write `exit_overdue`."""
        record_overdue(self.events, self.run_dir, attempt, ranks, pids, max(map(watchdog.done_for, ranks)),
                       self.watch_config)

    def report_exit(self, attempt: int, rank: int, code: int | None, **extra: Any) -> None:
        self.events.emit("exit", attempt=attempt, rank=rank, code=code, **extra)

# ----- the job -----------------------------------------------------------------------


def run_job(spec: JobSpec, resume: bool = False) -> RunRecord:
    """Run `spec` to completion or to the restart policy's end; never leaves a process behind.
    `resume`: continue the run in spec.run_dir from its next attempt (JobSupervisor above)."""
    started = time.monotonic()
    run_dir = create_run_dir(spec, resume)
    temporary = spec.run_dir is None
    try:
        with stop_on_signals():  # SIGINT/SIGTERM unwind through the `finally` blocks that kill the ranks
            # The launcher's declaration names who supervises: this module's attempt loop
            # (below) or one that owns restarts itself (torchrun's agent).
            return spec.launcher_kind.supervisor_class()(spec, run_dir).run(started)
    finally:
        if temporary and not spec.keep:
            shutil.rmtree(run_dir, ignore_errors=True)


class Supervisor(JobSupervisor):
    """The harness's own attempt loop (registry.ATTEMPT_LOOP): it starts every attempt through
    the launcher's factory (warm, spawn, cmd)."""

    def __init__(self, spec: JobSpec, run_dir: Path) -> None:
        super().__init__(spec, run_dir)
        self.live: list[Attempt] = []

    def supervise(self) -> str:
        spec = self.spec
        store = HarnessStore()
        launcher = spec.launcher_kind.attempt_launcher(spec)
        try:
            stalled, at_last_restart = 0, newest_committed_step(self.run_dir)
            while True:
                result = self.run_attempt(launcher, store, self.attempt)
                if result.ok:
                    return "completed"
                if self.attempt >= spec.max_restarts:
                    return "budget_exhausted"
                newest = newest_committed_step(self.run_dir)
                # The first restart is always allowed; after that, each restart must move
                # the newest committed checkpoint forward or it counts as stalled.
                stalled = stalled + 1 if self.attempt > 0 and newest <= at_last_restart else 0
                if stalled >= spec.no_progress_patience:
                    return "no_progress"
                at_last_restart = newest
                self.attempt += 1
        finally:
            launcher.close()
            store.close()

    def run_attempt(self, launcher: Launcher, store: HarnessStore, attempt: int) -> AttemptResult:
        world_size = self.spec.world_size_for(attempt)
        started = time.monotonic()
        started_wall = time.time()
        handle = launcher.start(self.run_dir, attempt, world_size, store.rendezvous(attempt))
        self.live.append(handle)
        self.events.emit("attempt", attempt=attempt, world_size=world_size,
                         launcher=self.spec.launcher, pids=[handle.pids[r] for r in range(world_size)],
                         # --cmd's warm launcher: whether these ranks were forked or started cold, and why
                         **getattr(handle, "start_facts", {}))
        watchdog = watchdog_class(self.spec.watchdog)(self.watch_config, self.run_dir, attempt, world_size)
        result = AttemptResult(ok=False)
        reported: set[int] = set()
        try:
            while True:
                raise_if_received()  # an interrupt whose exception something swallowed still stops the job
                wait(handle.waitables(), timeout=self.spec.poll_interval_s)
                board = watchdog.observe()
                if result.launch_s is None and all(p is not None and p.step >= 1 for p in board.values()):
                    result.launch_s = max(p.t for p in board.values() if p) - started_wall
                codes = handle.exited()
                self.report_exits(attempt, codes, reported)
                if any(code != 0 for code in codes.values()):
                    break  # a rank died: the others cannot finish without it
                if len(codes) == world_size:
                    result.ok = True
                    break
                steps = {r: p.step for r, p in board.items() if p is not None}
                for fault in self.faults.due(attempt, steps, time.monotonic() - started, world_size):
                    self.fire(attempt, fault, steps, handle.pids, handle.signal)
                hang = watchdog.check(r for r in range(world_size) if r not in codes)
                if hang is not None:
                    self.on_hang(attempt, hang, {r: pid for r, pid in handle.pids.items() if r not in codes})
                    result.hang = hang
                    break
                stuck = watchdog.overdue(r for r in range(world_size) if r not in codes)
                if stuck:
                    self.on_overdue(attempt, watchdog, stuck, handle.pids)
                    # Killed below; whoever finished training (exit 0 or "done") completed the attempt.
                    result.ok = all(codes.get(r) == 0 or watchdog.done(r) for r in range(world_size))
                    break
        finally:
            # Deaths of their own first; whatever the kill below ends, the harness stopped.
            self.report_exits(attempt, handle.exited(), reported)
            handle.kill()
            codes = handle.reap(REAP_TIMEOUT_S)
            self.live.remove(handle)
            self.report_exits(attempt, codes, reported, stopped=True)
            for left in getattr(handle, "leftovers", []):  # processes a rank left behind, ended with the attempt
                self.events.emit("leftover", attempt=attempt, **left)
            self.launch_s.append(result.launch_s)
            remove_empty_stacks(self.run_dir, attempt)
        result.codes = codes
        return result

    def report_exits(self, attempt: int, codes: dict[int, int | None], reported: set[int],
                     stopped: bool = False) -> None:
        """`exit` events for the ranks not reported yet; `stopped`: they were alive when the harness
        SIGKILLed the attempt, so a -9 is the harness's (report/crash_cause.py reads it)."""
        for rank in sorted(set(codes) - reported):
            self.report_exit(attempt, rank, codes[rank],
                             stopped_by_harness=stopped and codes[rank] == -signal.SIGKILL)
            reported.add(rank)

    def kill_all(self) -> None:
        for handle in list(self.live):
            handle.kill()
        for handle in list(self.live):
            handle.reap(REAP_TIMEOUT_S)
            self.live.remove(handle)
