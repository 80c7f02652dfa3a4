"""Run one job: attempts, supervision, external faults, hangs, restarts, cleanup.

    record = run_job(JobSpec(config=TrainConfig.tiny(), world_sizes=(2,)))

An attempt is W rank processes in one process group. It succeeds when every rank
exits 0; it fails when a rank exits non-zero or the watchdog declares a hang, and
then the whole attempt is killed and reaped before the restart policy decides:
restart (from the newest intact checkpoint, which the trainer finds itself) while
the budget lasts and restarts keep advancing the newest committed checkpoint.
"""
from __future__ import annotations

import json
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from types import FrameType
from typing import Any, Iterator

from trainwreck.faults.external import ExternalFault, ExternalFaults
from trainwreck.harness.launchers import Attempt, get_launcher
from trainwreck.harness.rundir import create_run_dir
from trainwreck.harness.spec import JobSpec
from trainwreck.harness.store import HarnessStore
from trainwreck.harness.watchdog import Hang, WatchdogConfig, record_hang
from trainwreck.harness.watchdogs import watchdog_class
from trainwreck.trainer.events import EventLog

OUTCOMES = ("completed", "budget_exhausted", "no_progress", "error")
REAP_TIMEOUT_S = 30.0
"""How long a SIGKILLed attempt may take to disappear (a rank in uninterruptible I/O)."""


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    """The run directory (already removed if it was temporary and not kept)."""
    status: str
    """completed or failed, as in the `end` event."""
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


# ----- reading the run's own events --------------------------------------------------


def iter_events(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Every event of the run; a torn line (a rank killed mid-write) is skipped."""
    for path in sorted((Path(run_dir) / "events").glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def record_fault(events: EventLog, attempt: int, fault: ExternalFault, steps: dict[int, int],
                 pids: dict[int, int]) -> None:
    """The `fault` event of an external fault. Written before the signal is sent: the judge
    must see the fault even if the signal takes the harness's view of the attempt down."""
    at = {r: steps.get(r) for r in fault.ranks}
    events.emit("fault", attempt=attempt, fault_id=fault.id,
                rank=fault.ranks[0] if fault.kind == "signal" else None, ranks=list(fault.ranks),
                detail=f"{fault.describe()} (ranks were at steps {at})", signal=fault.signal,
                pids=[pids[r] for r in fault.ranks])


def newest_committed_step(run_dir: Path) -> int:
    """Step of the newest `save` (a durably committed checkpoint); -1 when none."""
    return max((e["step"] for e in iter_events(run_dir) if e.get("kind") == "save"), default=-1)


def final_step(run_dir: Path, attempt: int) -> int:
    """The last update applied by `attempt` (its restore point when it applied none)."""
    steps = [e["step"] for e in iter_events(run_dir)
             if e.get("attempt") == attempt and e.get("kind") in ("step", "restore") and "rank" in e]
    return max(steps, default=0)


# ----- cleanup on SIGINT/SIGTERM -----------------------------------------------------


class Terminated(SystemExit):
    """SIGTERM reached the harness: clean up, then exit 143 like an unhandled SIGTERM would."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


class SignalGuard:
    """Turns SIGTERM/SIGINT into exceptions for the duration of a job, so `finally` blocks
    kill and reap every attempt; a second signal during that cleanup is ignored."""

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}
        self._fired = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self._fired:
            return  # already unwinding: let the cleanup finish
        self._fired = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated()

    def __enter__(self) -> SignalGuard:
        import threading

        if threading.current_thread() is threading.main_thread():  # signal() works only there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ----- the job -----------------------------------------------------------------------


def run_job(spec: JobSpec) -> RunRecord:
    """Run `spec` to completion or to the restart policy's end; never leaves a process behind."""
    started = time.monotonic()
    run_dir = create_run_dir(spec)
    temporary = spec.run_dir is None
    try:
        with SignalGuard():
            if spec.launcher == "torchrun":
                from trainwreck.harness.torchrun import TorchrunSupervisor

                supervisor: Any = TorchrunSupervisor(spec, run_dir)
            else:
                supervisor = Supervisor(spec, run_dir)
            return supervisor.run(started)
    finally:
        if temporary and not spec.keep:
            shutil.rmtree(run_dir, ignore_errors=True)


class Supervisor:
    """The attempt loop of the warm and spawn launchers."""

    def __init__(self, spec: JobSpec, run_dir: Path) -> None:
        self.spec, self.run_dir = spec, run_dir
        # No base fields: harness events name their attempt explicitly.
        self.events = EventLog(run_dir / "events" / "harness.jsonl")
        self.faults = ExternalFaults(spec.plan)
        self.watch_config = WatchdogConfig(spec.hang_timeout_s, spec.checkpoint_budget_s, spec.startup_budget_s)
        self.live: list[Attempt] = []
        self.hangs = 0
        self.launch_s: list[float | None] = []

    def run(self, started: float) -> RunRecord:
        attempt, outcome, error = 0, "error", None
        try:
            outcome, attempt = self.attempt_loop()
        except Exception:  # noqa: BLE001 - the record says what broke; the ranks are reaped below
            error = traceback.format_exc()
            print(error, file=sys.stderr)
        finally:
            self.kill_all()
            status = "completed" if outcome == "completed" else "failed"
            last = final_step(self.run_dir, attempt)
            self.events.emit("end", status=status, final_step=last, outcome=outcome,
                             attempts=attempt + 1)
            self.events.close()
        return RunRecord(run_dir=self.run_dir, status=status, outcome=outcome, attempts=attempt + 1,
                         final_step=last, hangs=self.hangs, wall_s=time.monotonic() - started,
                         launch_s=tuple(self.launch_s), error=error)

    def attempt_loop(self) -> tuple[str, int]:
        spec = self.spec
        store = HarnessStore()
        launcher = get_launcher(spec.launcher)
        try:
            attempt, stalled, at_last_restart = 0, 0, newest_committed_step(self.run_dir)
            while True:
                result = self.run_attempt(launcher, store, attempt)
                if result.ok:
                    return "completed", attempt
                if attempt >= spec.max_restarts:
                    return "budget_exhausted", attempt
                newest = newest_committed_step(self.run_dir)
                # The first restart is always allowed; after that, each restart must move
                # the newest committed checkpoint forward or it counts as stalled.
                stalled = stalled + 1 if attempt > 0 and newest <= at_last_restart else 0
                if stalled >= spec.no_progress_patience:
                    return "no_progress", attempt
                at_last_restart = newest
                attempt += 1
        finally:
            launcher.close()
            store.close()

    def run_attempt(self, launcher: Any, store: HarnessStore, attempt: int) -> AttemptResult:
        world_size = self.spec.world_size_for(attempt)
        started = time.monotonic()
        started_wall = time.time()
        handle = launcher.start(self.run_dir, attempt, world_size, store.rendezvous(attempt))
        self.live.append(handle)
        self.events.emit("attempt", attempt=attempt, world_size=world_size,
                         launcher=self.spec.launcher, pids=[handle.pids[r] for r in range(world_size)])
        watchdog = watchdog_class(self.spec.watchdog)(self.watch_config, self.run_dir, attempt, world_size)
        result = AttemptResult(ok=False)
        reported: set[int] = set()
        try:
            while True:
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
                    self.fire(handle, fault, steps)
                hang = watchdog.check(r for r in range(world_size) if r not in codes)
                if hang is not None:
                    self.on_hang(handle, hang, codes)
                    result.hang = hang
                    break
        finally:
            handle.kill()
            codes = handle.reap(REAP_TIMEOUT_S)
            self.live.remove(handle)
            self.report_exits(attempt, codes, reported)
            self.launch_s.append(result.launch_s)
            remove_empty_stacks(self.run_dir, attempt)
        result.codes = codes
        return result

    def report_exits(self, attempt: int, codes: dict[int, int | None], reported: set[int]) -> None:
        for rank in sorted(set(codes) - reported):
            self.events.emit("exit", attempt=attempt, rank=rank, code=codes[rank])
            reported.add(rank)

    def fire(self, handle: Attempt, fault: ExternalFault, steps: dict[int, int]) -> None:
        record_fault(self.events, handle.attempt, fault, steps, handle.pids)
        for rank in fault.ranks:
            handle.signal(rank, fault.signum)

    def on_hang(self, handle: Attempt, hang: Hang, codes: dict[int, int | None]) -> None:
        self.hangs += 1
        live = {r: pid for r, pid in handle.pids.items() if r not in codes}
        record_hang(self.events, self.run_dir, handle.attempt, hang, live, self.watch_config.stack_wait_s)

    def kill_all(self) -> None:
        for handle in list(self.live):
            handle.kill()
        for handle in list(self.live):
            handle.reap(REAP_TIMEOUT_S)
            self.live.remove(handle)


def remove_empty_stacks(run_dir: Path, attempt: int) -> None:
    """Every rank opens its stack file at start; keep only the ones that hold a dump."""
    for path in (Path(run_dir) / "stacks").glob(f"a{attempt:03d}-*.txt"):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except FileNotFoundError:
            pass
