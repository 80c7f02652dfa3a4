"""Supervising a job under the real torchrun elastic agent.

torchrun owns the restarts here (``--max-restarts``), so users see its own
semantics: any worker failure restarts the whole worker group, and its restart
count is our attempt number. The harness stays an observer that can still act:
it reads the progress boards (the only place it learns worker pids, since the
agent is their parent), applies external faults, detects hangs and kills the hung
workers, which torchrun then treats as a failure and restarts.

What it cannot do: exit codes of workers are seen only by the agent (recorded as
null, except for a completed run, where every final worker exited 0), and the
no-progress guard is torchrun's restart budget alone.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import wait
from pathlib import Path
import psutil

from trainwreck.faults.external import ExternalFaults
from trainwreck.harness.launchers import _child_env
from trainwreck.harness.rank import PR_SET_PDEATHSIG
from trainwreck.harness.spec import JobSpec
from trainwreck.harness.supervisor import REAP_TIMEOUT_S, RunRecord, final_step, record_fault, remove_empty_stacks
from trainwreck.harness.watchdog import Watchdog, WatchdogConfig, record_hang
from trainwreck.trainer.events import EventLog
from trainwreck.trainer.progress import progress_path


def torchrun_command(run_dir: Path, world_size: int, max_restarts: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(world_size), "--max-restarts", str(max_restarts),
            # torch < 2.3 polls its workers every 5 s by default; restarts should not wait that long.
            "--monitor-interval", "0.1",
            "-m", "trainwreck.harness.rank", "--run-dir", str(run_dir)]


def torchrun_env() -> dict[str, str]:
    env = _child_env()
    # torchrun >= 2.4 shares its rendezvous TCPStore with the workers, and after a restart
    # workers can read the previous round's gloo/nccl addresses and fail to connect
    # (pytorch/pytorch#135712, seen here as "connectFullMesh ... Connection refused" on
    # the second restart). Its documented switch gives every round a fresh store.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def _die_with_parent() -> None:
    # Runs in the agent between fork and exec; the death signal survives exec, so a
    # killed harness takes the agent (and, through theirs, its workers) with it.
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class TorchrunSupervisor:
    def __init__(self, spec: JobSpec, run_dir: Path) -> None:
        self.spec, self.run_dir = spec, run_dir
        self.world_size = spec.world_sizes[0]
        self.events = EventLog(run_dir / "events" / "harness.jsonl")
        self.faults = ExternalFaults(spec.plan)
        self.watch_config = WatchdogConfig(spec.hang_timeout_s, spec.checkpoint_budget_s, spec.startup_budget_s)
        self.agent: subprocess.Popen[bytes] | None = None
        self.attempt = 0
        self.pids: dict[int, dict[int, int]] = {}  # attempt -> rank -> pid, from the boards
        self.hangs = 0
        self.launch_s: list[float | None] = []

    def run(self, started: float) -> RunRecord:
        outcome, error = "error", None
        try:
            outcome = self.supervise()
        except Exception:  # noqa: BLE001 - reported in the record; the finally cleans up
            error = traceback.format_exc()
            print(error, file=sys.stderr)
        finally:
            self.kill_all()
            status = "completed" if outcome == "completed" else "failed"
            last = final_step(self.run_dir, self.attempt)
            self.events.emit("end", status=status, final_step=last, outcome=outcome,
                             attempts=self.attempt + 1)
            self.events.close()
        return RunRecord(run_dir=self.run_dir, status=status, outcome=outcome, attempts=self.attempt + 1,
                         final_step=last, hangs=self.hangs, wall_s=time.monotonic() - started,
                         launch_s=tuple(self.launch_s), error=error)

    def supervise(self) -> str:
        cmd = torchrun_command(self.run_dir, self.world_size, self.spec.max_restarts)
        with open(self.run_dir / "logs" / "torchrun.log", "ab") as log:
            self.agent = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=torchrun_env(), start_new_session=True,
                                          preexec_fn=_die_with_parent)
        pidfd = [os.pidfd_open(self.agent.pid)] if hasattr(os, "pidfd_open") else []
        try:
            return self.watch(pidfd)
        finally:
            for fd in pidfd:
                os.close(fd)

    def watch(self, pidfd: list[int]) -> str:
        assert self.agent is not None
        watchdog, started_wall, started = self.begin_attempt(0)
        watching = True  # False after we killed a hung attempt, until torchrun restarts it
        while True:
            wait(pidfd, timeout=self.spec.poll_interval_s)
            code = self.agent.poll()
            if code is not None:
                self.report_exits(self.attempt, 0 if code == 0 else None)
                return "completed" if code == 0 else "budget_exhausted"
            if progress_path(self.run_dir, self.attempt + 1, 0).parent.exists() and any(
                    progress_path(self.run_dir, self.attempt + 1, r).exists() for r in range(self.world_size)):
                self.report_exits(self.attempt, None)  # torchrun restarted the worker group
                watchdog, started_wall, started = self.begin_attempt(self.attempt + 1)
                watching = True
            board = watchdog.observe()
            pids = {r: p.pid for r, p in board.items() if p is not None}
            self.pids[self.attempt] = pids
            if self.launch_s[-1] is None and len(pids) == self.world_size and all(
                    p is not None and p.step >= 1 for p in board.values()):
                self.launch_s[-1] = max(p.t for p in board.values() if p) - started_wall
            if not watching:
                continue
            if len(pids) == self.world_size:  # a worker's pid is known once it has published
                steps = {r: p.step for r, p in board.items() if p is not None}
                for fault in self.faults.due(self.attempt, steps, time.monotonic() - started, self.world_size):
                    record_fault(self.events, self.attempt, fault, steps, pids)
                    for rank in fault.ranks:
                        _kill(pids[rank], fault.signum)
            live = [r for r in range(self.world_size) if r not in pids or psutil.pid_exists(pids[r])]
            hang = watchdog.check(live)
            if hang is not None:
                self.hangs += 1
                record_hang(self.events, self.run_dir, self.attempt, hang,
                            {r: pids[r] for r in live if r in pids}, self.watch_config.stack_wait_s)
                for pid in pids.values():
                    _kill(pid, signal.SIGKILL)  # torchrun sees failed workers and restarts the group
                watching = False

    def begin_attempt(self, attempt: int) -> tuple[Watchdog, float, float]:
        if attempt > 0:
            remove_empty_stacks(self.run_dir, attempt - 1)
        self.attempt = attempt
        self.launch_s.append(None)
        self.events.emit("attempt", attempt=attempt, world_size=self.world_size, launcher="torchrun",
                         pids=[], agent_pid=self.agent.pid if self.agent else None)
        return Watchdog(self.watch_config, self.run_dir, attempt, self.world_size), time.time(), time.monotonic()

    def report_exits(self, attempt: int, code: int | None) -> None:
        for rank in range(self.world_size):
            self.events.emit("exit", attempt=attempt, rank=rank, code=code,
                             pid=self.pids.get(attempt, {}).get(rank))

    def kill_all(self) -> None:
        """SIGKILL the agent and its workers (they run in sessions of their own, so no killpg
        reaches them; and old pids from the boards may belong to someone else by now)."""
        if self.agent is None or self.agent.poll() is not None:
            return  # the agent ended on its own and took its workers down first
        try:
            workers = psutil.Process(self.agent.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            workers = []
        try:
            os.killpg(self.agent.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.agent.wait()
        for proc in workers:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(workers, timeout=REAP_TIMEOUT_S)
        remove_empty_stacks(self.run_dir, self.attempt)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
