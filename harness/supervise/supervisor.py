"""Run one job: attempts, supervision, external faults, hangs, restarts, cleanup.

    record = run_job(JobSpec(config=TrainConfig.tiny(), world_sizes=(2,)))

An attempt is W rank processes in one process group. It succeeds when every rank
exits 0; it fails when a rank exits non-zero or the watchdog declares a hang, and
then the whole attempt is killed and reaped before the restart policy decides:
restart (from the newest intact checkpoint, which the trainer finds itself) while
the budget lasts and restarts keep advancing the newest committed checkpoint.
The record, the events and the end of a job are shared with the torchrun supervisor
(harness/supervise/restarts.py); this module holds `run_job`, which asks the job's launcher
declaration (harness/registry.py) who supervises, and the harness's own attempt loop.
"""
from __future__ import annotations

import shutil
import signal
import time
from multiprocessing.connection import wait
from pathlib import Path

from trainwreck.harness.launch.launchers import Attempt, Launcher
from trainwreck.harness.supervise.restarts import (REAP_TIMEOUT_S, AttemptResult, JobSupervisor, RunRecord,
                                         newest_committed_step, remove_empty_stacks)
from trainwreck.harness.supervise.interrupts import raise_if_received, stop_on_signals
from trainwreck.harness.supervise.create_rundir import create_run_dir
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.launch.store import HarnessStore
from trainwreck.harness.supervise.watchdog_variants import watchdog_class


# ----- the job -----------------------------------------------------------------------


def run_job(spec: JobSpec, resume: bool = False) -> RunRecord:
    """Run `spec` to completion or to the restart policy's end; never leaves a process behind.
    `resume`: continue the run in spec.run_dir from its next attempt (harness/supervise/restarts.py)."""
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
