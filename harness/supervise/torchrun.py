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

import os
import signal
import subprocess
import sys
import time
import uuid
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import psutil

from trainwreck.harness.launch.procs import child_env, set_parent_death_signal, signal_group, signal_pid
from trainwreck.harness.supervise.supervisor import REAP_TIMEOUT_S, JobSupervisor, remove_empty_stacks
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.launch.store import HOST, HarnessStore
from trainwreck.harness.supervise.watchdog import Watchdog
from trainwreck.rundir.layout import RunDir


def torchrun_command(run_dir: Path, world_size: int, max_restarts: int, rdzv_port: int,
                     rdzv_id: str) -> list[str]:
    """torchrun as a rendezvous client of the harness's loopback store.

    ``--standalone`` would make the agent host its rendezvous store, and a TCPStore server
    listens on every interface whatever host it is given; instead the harness hosts the
    store on 127.0.0.1 (``is_host=false`` keeps the agent a client). ``--local-addr``
    makes the agent publish 127.0.0.1 as MASTER_ADDR, so rank 0's own store is loopback
    too (see `trainwreck.trainer.launch.init_process_group`). ``--log-dir`` keeps the
    agent's ``torchelastic_*`` directory inside the run directory instead of the system
    temp directory, where nothing ever removed it.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{rdzv_port}", "--rdzv-id", rdzv_id,
            "--rdzv-conf", "is_host=false", "--local-addr", HOST,
            "--log-dir", str(RunDir(run_dir).logs / "torchelastic"),
            "--nproc-per-node", str(world_size), "--max-restarts", str(max_restarts),
            # torch < 2.3 polls its workers every 5 s by default; restarts should not wait that long.
            "--monitor-interval", "0.1",
            "-m", "trainwreck.harness.launch.rank", "--run-dir", str(run_dir)]


def torchrun_env() -> dict[str, str]:
    env = child_env()
    # torchrun >= 2.4 shares its rendezvous TCPStore with the workers, and after a restart
    # workers can read the previous round's gloo/nccl addresses and fail to connect
    # (pytorch/pytorch#135712, seen here as "connectFullMesh ... Connection refused" on
    # the second restart). Its documented switch gives every round a fresh store, hosted
    # by rank 0 on MASTER_ADDR:MASTER_PORT.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


class TorchrunSupervisor(JobSupervisor):
    """The elastic agent starts and restarts the worker group; the harness watches it."""

    def __init__(self, spec: JobSpec, run_dir: Path) -> None:
        super().__init__(spec, run_dir)
        self.world_size = spec.world_sizes[0]
        self.agent: subprocess.Popen[bytes] | None = None
        self.pids: dict[int, dict[int, int]] = {}  # attempt -> rank -> pid, from the boards
        self.stop_reason: str | None = None

    def supervise(self) -> str:
        # The agent's rendezvous store lives here, on loopback, for the whole job; it is
        # dropped when supervising ends (the agent has then exited or is about to be killed).
        store = HarnessStore()
        try:
            return self.run_agent(store.port)
        finally:
            store.close()

    def run_agent(self, rdzv_port: int) -> str:
        cmd = torchrun_command(self.run_dir, self.world_size, self.spec.max_restarts, rdzv_port,
                               uuid.uuid4().hex[:12])
        return self.start_and_watch(cmd, RunDir(self.run_dir).torchrun_log, torchrun_env())

    def start_and_watch(self, argv: list[str], log_path: Path, env: dict[str, str]) -> str:
        """Start the agent in its own session, its output appended to `log_path`, and watch it."""
        with open(log_path, "ab") as log:
            self.agent = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True,
                                          # The death signal survives exec: a killed harness
                                          # takes the agent (and, through theirs, its workers).
                                          preexec_fn=set_parent_death_signal)
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
        gone_since: float | None = None  # since when the attempt has no worker left
        while True:
            wait(pidfd, timeout=self.spec.poll_interval_s)
            code = self.agent.poll()
            if code is not None:
                self.report_exits(self.attempt, 0 if code == 0 else None)
                return "completed" if code == 0 else "budget_exhausted"
            if any(RunDir(self.run_dir).rank_progress(self.attempt + 1, r).exists() for r in range(self.world_size)):
                self.report_exits(self.attempt, None)  # torchrun restarted the worker group
                watchdog, started_wall, started = self.begin_attempt(self.attempt + 1)
                watching, gone_since = True, None
            board = watchdog.observe()
            pids = {r: p.pid for r, p in board.items() if p is not None}
            self.pids[self.attempt] = pids
            gone = not watching or (len(pids) == self.world_size and not any(map(psutil.pid_exists, pids.values())))
            gone_since = (gone_since or time.monotonic()) if gone else None
            if gone_since is not None and time.monotonic() - gone_since > self.spec.startup_budget_s:
                return self.never_restarted(gone_since)
            if self.launch_s[-1] is None and len(pids) == self.world_size and all(
                    p is not None and p.step >= 1 for p in board.values()):
                self.launch_s[-1] = max(p.t for p in board.values() if p) - started_wall
            if not watching:
                continue
            if len(pids) == self.world_size:  # a worker's pid is known once it has published
                steps = {r: p.step for r, p in board.items() if p is not None}
                for fault in self.faults.due(self.attempt, steps, time.monotonic() - started, self.world_size):
                    self.fire(self.attempt, fault, steps, pids, lambda rank, sig: signal_pid(pids[rank], sig))
            live = [r for r in range(self.world_size) if r not in pids or psutil.pid_exists(pids[r])]
            if len(live) < self.world_size:
                self.on_rank_lost(self.attempt)
            hang = watchdog.check(live)
            if hang is not None:
                self.on_hang(self.attempt, hang, {r: pids[r] for r in live if r in pids})
                for pid in pids.values():
                    signal_pid(pid, signal.SIGKILL)  # torchrun sees failed workers and restarts the group
                watching = False
            stuck = watchdog.overdue(r for r in live if r in pids)
            if stuck and all(watchdog.done(r) for r in live):
                # Every worker finished training; the agent would wait on the stuck ones forever.
                self.on_overdue(self.attempt, watchdog, stuck, pids)
                self.report_exits(self.attempt, None)
                return "completed"

    def never_restarted(self, since: float) -> str:
        """The agent keeps running but started no new group within the startup budget after the
        last one ended (Ray waiting for a node that will not come back): end the job, saying so,
        rather than wait forever."""
        self.stop_reason = (f"no worker group followed attempt {self.attempt} within "
                            f"{time.monotonic() - since:.0f} s (the startup budget, "
                            f"{self.spec.startup_budget_s:.0f} s): the agent did not restart it")
        self.report_exits(self.attempt, None)
        return "no_progress"

    def end_fields(self) -> dict[str, Any]:
        return {"reason": self.stop_reason} if self.stop_reason else {}

    def begin_attempt(self, attempt: int) -> tuple[Watchdog, float, float]:
        if attempt > 0:
            remove_empty_stacks(self.run_dir, attempt - 1)
        self.attempt = attempt
        self.launch_s.append(None)
        self.events.emit("attempt", attempt=attempt, world_size=self.world_size, launcher=self.spec.launcher,
                         pids=[], agent_pid=self.agent.pid if self.agent else None)
        return Watchdog(self.watch_config, self.run_dir, attempt, self.world_size), time.time(), time.monotonic()

    def on_rank_lost(self, attempt: int) -> None:
        """A worker of `attempt` is gone and the agent is about to restart the group: the
        last moment the harness can act between attempts (nothing to do under torchrun)."""

    def report_exits(self, attempt: int, code: int | None) -> None:
        for rank in range(self.world_size):
            self.report_exit(attempt, rank, code, pid=self.pids.get(attempt, {}).get(rank))

    def kill_all(self) -> None:
        """SIGKILL the agent and its workers (they run in sessions of their own, so no killpg
        reaches them; and old pids from the boards may belong to someone else by now)."""
        if self.agent is None or self.agent.poll() is not None:
            return  # the agent ended on its own and took its workers down first
        try:
            workers = psutil.Process(self.agent.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            workers = []
        signal_group(self.agent.pid, signal.SIGKILL)
        self.agent.wait()
        for proc in workers:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(workers, timeout=REAP_TIMEOUT_S)
        remove_empty_stacks(self.run_dir, self.attempt)
