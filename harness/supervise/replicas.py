"""Replica-group jobs: restart one group (its ranks only) while the other groups train on.

Every other supervisor here restarts the whole job. A replica-group trainer (torchft: see
trainer/frameworks/torchft_adapter.py) survives the loss of a group: the others keep
committing steps, and the restarted group heals from a live peer. This supervisor runs
such a job:

- a **lighthouse** it starts and owns, ``torchft_lighthouse --bind 127.0.0.1:0``: the kernel
  picks the port and the lighthouse reports it ("Lighthouse listening on: http://HOST:PORT"
  in its log); a planned ``lighthouse_kill`` SIGKILLs it when a rank reaches the fault's step,
  and it is restarted on the same port (the ranks know only that address);
- per group incarnation, a fresh **TCPStore** on 127.0.0.1 (harness/launch/store.py's loopback socket
  hand-over): torchft's Manager keeps its address keys at the store's root, so a restarted
  group must not read its predecessor's;
- the group's ranks, torchrun's environment per group (RANK/WORLD_SIZE inside the group,
  MASTER_ADDR/PORT of its store) plus ``TORCHFT_LIGHTHOUSE`` and trainwreck's replica variables;
- when a rank of a group dies, the rest of **that group** is killed and the group restarted
  (up to ``max_group_restarts``; a group in ``lost_groups`` never is), the others untouched;
- a watchdog: no rank progressing for ``hang_timeout_s`` ends the job failed (a `hang` event).

Events: `exit` and `fault` as usual (plus `replica_group`), `group_start` {replica_group,
incarnation, pids} for each start, and `end` when every group that still has a process
finished (completed: all ranks alive at the end exited 0 after `total_steps`).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from trainwreck.faults.cmdrank import HOOKS_FACTORY
from trainwreck.harness.errors import SpecError
from trainwreck.harness.launch.procs import child_env, process_group_kwargs, set_parent_death_signal, signal_group
from trainwreck.harness.launch.store import HOST, HarnessStore
from trainwreck.trainer.events import FORMAT, EventLog
from trainwreck.trainer.progress import read_progress
from trainwreck.trainer.rundir import RunDir, iter_events, write_json_atomic

LIGHTHOUSE_KIND = "lighthouse_kill"
"""The harness's own fault kind here: SIGKILL the lighthouse when any rank reaches `step`."""
RANK_KINDS = ("kill", "hang")
LIGHTHOUSE_START_S = 30.0
"""How long the lighthouse may take to report its port."""
REAP_S = 10.0
LISTENING = re.compile(r"listening on: http://[^:\s]+:(\d+)")


class ReplicaJobError(SpecError):
    """A replica job that cannot run as given; the message names the field and the fix."""


@dataclass(frozen=True)
class ReplicaJob:
    """One replica-group job: the command every rank runs, the groups, the plan."""

    command: str
    run_dir: Path
    groups: int = 2
    group_world_size: int = 1
    total_steps: int = 30
    plan: tuple[dict[str, Any], ...] = ()
    max_group_restarts: int = 2
    """Restarts per group before it is given up."""
    lost_groups: tuple[int, ...] = ()
    """Groups that are never restarted (a group that never comes back)."""
    restart: str = "group"
    """"group": a failed group restarts alone; "job": every group is stopped and restarted together
    (the whole-job restart every other supervisor here makes, for comparison)."""
    heartbeat_timeout_s: float = 5.0
    """The lighthouse's ``--heartbeat_timeout_ms`` (torchft's default: 5 s)."""
    join_timeout_s: float = 1.0
    """The lighthouse's ``--join_timeout_ms``: how long a quorum waits for stragglers."""
    hang_timeout_s: float = 90.0
    """No rank progressing for this long ends the job failed (once every live rank is up)."""
    startup_timeout_s: float = 180.0
    """How long a rank may take to publish its first progress (importing torch and torchft on a
    loaded 2-core machine took over 20 s here); a silence this long is a hang even during startup."""
    scenario: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.restart not in ("group", "job"):
            raise ReplicaJobError(f"restart={self.restart!r} is not a restart scope; use 'group' or 'job'")
        if self.groups < 1 or self.group_world_size < 1:
            raise ReplicaJobError(f"groups={self.groups}, group_world_size={self.group_world_size}: both must be >= 1")
        for f in self.plan:
            if f.get("kind") not in (*RANK_KINDS, LIGHTHOUSE_KIND):
                raise ReplicaJobError(f"fault {f.get('id')!r}: kind {f.get('kind')!r} is not one a replica job "
                                      f"fires; use one of {', '.join((*RANK_KINDS, LIGHTHOUSE_KIND))}")
            if f.get("kind") != LIGHTHOUSE_KIND and not 0 <= int(f.get("rank", 0)) < self.world_size:
                raise ReplicaJobError(f"fault {f.get('id')!r}: rank {f.get('rank')} is outside the job's "
                                      f"{self.world_size} ranks (groups x group_world_size)")

    @property
    def world_size(self) -> int:
        return self.groups * self.group_world_size

    def run_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "hang_timeout_s": self.hang_timeout_s, "world_sizes": [self.world_size],
                "faults": [dict(f) for f in self.plan], "max_restarts": 0, "launcher": "replica-groups",
                "command": self.command, "scenario": self.scenario,
                "replica_groups": {"groups": self.groups, "group_world_size": self.group_world_size,
                                   "restart": self.restart, "max_group_restarts": self.max_group_restarts,
                                   "lost_groups": list(self.lost_groups),
                                   "heartbeat_timeout_s": self.heartbeat_timeout_s,
                                   "join_timeout_s": self.join_timeout_s}}


@dataclass(frozen=True)
class ReplicaRecord:
    run_dir: Path
    status: str
    final_step: int
    group_starts: dict[int, int]
    """Per group: how many times it was started."""
    wall_s: float


class Lighthouse:
    """torchft's lighthouse as a child process on 127.0.0.1; the port is the one it reports."""

    def __init__(self, job: ReplicaJob, log: Path) -> None:
        self.job, self.log = job, log
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # The lighthouse of the torchft the ranks import: beside the command's interpreter.
        argv0 = shlex.split(self.job.command)[0]
        binary = Path(argv0 if "/" in argv0 else sys.executable).with_name("torchft_lighthouse")
        exe = str(binary) if binary.exists() else "torchft_lighthouse"
        cmd = [exe, "--bind", f"{HOST}:{self.port}", "--min_replicas", "1",
               "--heartbeat_timeout_ms", str(int(self.job.heartbeat_timeout_s * 1000)),
               "--join_timeout_ms", str(int(self.job.join_timeout_s * 1000))]
        offset = self.log.stat().st_size if self.log.exists() else 0
        parent = os.getpid()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         **process_group_kwargs(0, lambda: set_parent_death_signal(parent)))
        self.port = self._reported_port(offset)

    def _reported_port(self, offset: int) -> int:
        deadline = time.monotonic() + LIGHTHOUSE_START_S
        assert self.proc is not None
        while time.monotonic() < deadline and self.proc.poll() is None:
            with open(self.log, "rb") as f:
                f.seek(offset)
                found = LISTENING.search(f.read().decode(errors="replace"))
            if found:
                return int(found.group(1))
            time.sleep(0.05)  # polling the lighthouse's own log for its report
        self.kill()
        raise RuntimeError(f"the lighthouse did not report its port within {LIGHTHOUSE_START_S} s; see {self.log}")

    @property
    def address(self) -> str:
        return f"http://{HOST}:{self.port}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(REAP_S)


@dataclass
class Incarnation:
    """One start of one group: its ranks and the store they rendezvous on."""

    group: int
    number: int
    procs: list[subprocess.Popen[bytes]]
    store: HarnessStore
    done: dict[int, int] = field(default_factory=dict)  # group rank -> exit code
    started: float = field(default_factory=time.time)  # wall clock: compared with progress files' mtimes
    pidfds: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pidfds = [os.pidfd_open(p.pid) for p in self.procs]

    def close_fds(self) -> None:
        for fd in self.pidfds:
            os.close(fd)
        self.pidfds = []

    def kill(self) -> None:
        signal_group(self.procs[0].pid, signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(REAP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(REAP_S)
        self.store.close()
        self.close_fds()


class ReplicaSupervisor:
    def __init__(self, job: ReplicaJob) -> None:
        self.job = job
        self.run = RunDir(job.run_dir)
        self.events = EventLog(self.run.harness_events)
        self.lighthouse = Lighthouse(job, self.run.logs / "lighthouse.log")
        self.live: dict[int, Incarnation] = {}
        self.starts: dict[int, int] = {g: 0 for g in range(job.groups)}
        self.lighthouse_faults = [dict(f) for f in job.plan if f.get("kind") == LIGHTHOUSE_KIND]
        self.finished_ok = True
        self.completed: set[int] = set()  # groups whose every rank exited 0
        self.gate = HarnessStore()  # the first incarnations' meeting point (trainer's ReplicaProbe.ready)

    def rank_env(self, group: int, group_rank: int, store: HarnessStore, gated: bool) -> dict[str, str]:
        env = child_env()
        env.update({
            "RANK": str(group_rank), "WORLD_SIZE": str(self.job.group_world_size), "LOCAL_RANK": str(group_rank),
            "LOCAL_WORLD_SIZE": str(self.job.group_world_size), "MASTER_ADDR": HOST, "MASTER_PORT": str(store.port),
            "TORCHFT_LIGHTHOUSE": self.lighthouse.address, "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": str(self.job.groups),
            "TRAINWRECK_REPLICA_GROUP": str(group), "TRAINWRECK_REPLICA_GROUPS": str(self.job.groups),
            "TRAINWRECK_INCARNATION": str(self.starts[group]),
            "TRAINWRECK_RUN_DIR": str(self.run.root.absolute()), "TRAINWRECK_ATTEMPT": "0",
            "TRAINWRECK_HOOKS": HOOKS_FACTORY,
        })
        if gated:  # every group starts together: they meet before their first update
            env["TRAINWRECK_REPLICA_GATE"] = f"{HOST}:{self.gate.port}"
        return env

    def start_group(self, group: int, gated: bool = False) -> None:
        store = HarnessStore()
        procs: list[subprocess.Popen[bytes]] = []
        parent = os.getpid()
        for r in range(self.job.group_world_size):
            rank = group * self.job.group_world_size + r
            with open(self.run.rank_log(0, rank), "ab") as log:
                procs.append(subprocess.Popen(
                    shlex.split(self.job.command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=self.rank_env(group, r, store, gated),
                    **process_group_kwargs(procs[0].pid if procs else 0, lambda: set_parent_death_signal(parent))))
        self.live[group] = Incarnation(group, self.starts[group], procs, store)
        self.events.emit("group_start", replica_group=group, incarnation=self.starts[group],
                         pids=[p.pid for p in procs])
        self.events.flush()
        self.starts[group] += 1

    def supervise(self) -> str:
        self.lighthouse.start()
        for g in range(self.job.groups):
            self.start_group(g, gated=True)
        last_progress, last_seen = time.monotonic(), self.progress()
        while self.live:
            # A pidfd becomes readable when its process ends; the timeout bounds how late a
            # lighthouse fault or the watchdog looks at the progress boards.
            wait([fd for inc in self.live.values() for fd in inc.pidfds], timeout=0.1)
            for group in list(self.live):
                if group in self.live:  # a job restart may have replaced or ended it meanwhile
                    self.reap_exits(self.live[group])
            self.fire_lighthouse_faults()
            seen = self.progress()
            if seen != last_seen:
                last_progress, last_seen = time.monotonic(), seen
            else:
                silent = time.monotonic() - last_progress
                if silent > (self.job.hang_timeout_s if self.all_up() else self.job.startup_timeout_s):
                    self.record_hang(seen, silent)
                    return "failed"
        return "completed" if self.finished_ok else "failed"

    def all_up(self) -> bool:
        """Every live rank has published progress since its incarnation started."""
        for inc in self.live.values():
            for r in range(len(inc.procs)):
                board = self.run.rank_progress(0, inc.group * self.job.group_world_size + r)
                try:
                    if board.stat().st_mtime < inc.started:
                        return False
                except FileNotFoundError:
                    return False
        return True

    def record_hang(self, seen: dict[int, int], silent_s: float) -> None:
        """No rank moved for hang_timeout_s: the suspects are the ranks furthest behind."""
        behind = min(seen.values(), default=0)
        suspects = sorted(r for r in range(self.job.world_size) if seen.get(r, 0) == behind)
        self.events.emit("hang", ranks=suspects, waiting=sorted(set(range(self.job.world_size)) - set(suspects)),
                         last_step=max(seen.values(), default=0), detected_after_s=round(silent_s, 3))

    def reap_exits(self, inc: Incarnation) -> None:
        for r, proc in enumerate(inc.procs):
            if proc.returncode is None and proc.poll() is not None and r not in inc.done:
                inc.done[r] = proc.returncode
                self.events.emit("exit", rank=inc.group * self.job.group_world_size + r, code=proc.returncode,
                                 replica_group=inc.group, incarnation=inc.number)
        if not inc.done:
            return
        if all(code == 0 for code in inc.done.values()):
            if len(inc.done) == len(inc.procs):
                self.completed.add(inc.group)
                inc.store.close()
                inc.close_fds()
                del self.live[inc.group]
            return
        # A rank died: its group goes; with restart="job", every group goes.
        doomed = list(self.live.values()) if self.job.restart == "job" else [inc]
        for gone in doomed:
            self.stop(gone)
        if self.job.restart == "job":
            if all(self.starts[g] <= self.job.max_group_restarts for g in range(self.job.groups)):
                for g in range(self.job.groups):
                    self.start_group(g, gated=True)
            else:
                self.finished_ok = False
            return
        others = set(range(self.job.groups)) - {inc.group}
        # A group restarted after every other one finished would train alone from step 0.
        if (inc.group not in self.job.lost_groups and self.starts[inc.group] <= self.job.max_group_restarts
                and not others <= self.completed):
            self.start_group(inc.group)
        elif not self.live:
            self.finished_ok = False

    def stop(self, inc: Incarnation) -> None:
        """Kill what is left of one incarnation; its `exit` events say the harness stopped them."""
        inc.kill()
        for r, proc in enumerate(inc.procs):
            if r not in inc.done:
                inc.done[r] = proc.returncode if proc.returncode is not None else -9
                self.events.emit("exit", rank=inc.group * self.job.group_world_size + r, code=inc.done[r],
                                 replica_group=inc.group, incarnation=inc.number, stopped_by_harness=True)
        del self.live[inc.group]

    def progress(self) -> dict[int, int]:
        seen = {}
        for rank in range(self.job.world_size):
            board = read_progress(self.run.rank_progress(0, rank))
            if board is not None:
                seen[rank] = board.step
        return seen

    def fire_lighthouse_faults(self) -> None:
        reached = max(self.progress().values(), default=0)
        for fault in [f for f in self.lighthouse_faults if reached >= int(f.get("step", 0))]:
            self.lighthouse_faults.remove(fault)
            self.events.emit("fault", fault_id=fault["id"], rank=None, fault_kind=LIGHTHOUSE_KIND,
                             detail=f"lighthouse (pid {self.lighthouse.proc.pid if self.lighthouse.proc else None}) "
                                    f"SIGKILLed when a rank reached update {reached}")
            self.events.flush()
            self.lighthouse.kill()
            self.lighthouse.start()  # same port: the ranks know only that address

    def close(self) -> None:
        for inc in list(self.live.values()):
            inc.kill()
        self.live.clear()
        self.lighthouse.kill()
        self.gate.close()


def final_step(run_dir: Path) -> int:
    return max((int(e["step"]) for e in iter_events(run_dir, batches=False) if e.get("kind") == "step"), default=0)


def run_replica_job(job: ReplicaJob) -> ReplicaRecord:
    """Run `job` into its run directory (which must not hold a run) and return what happened."""
    started = time.monotonic()
    run = RunDir(job.run_dir)
    if run.run_json.exists():
        raise ReplicaJobError(f"{job.run_dir} already holds a run (run.json exists); pick another --out")
    for sub in RunDir.SUBDIRS:
        (run.root / sub).mkdir(parents=True, exist_ok=True)
    write_json_atomic(run.run_json, job.run_json())
    sup = ReplicaSupervisor(job)
    status = "failed"
    try:
        status = sup.supervise()
    finally:
        sup.close()
        last = final_step(run.root)
        if status == "completed" and last < job.total_steps:
            status = "failed"
        sup.events.emit("end", status=status, final_step=last, group_starts=sup.starts)
        sup.events.close()
    return ReplicaRecord(run.root, status, last, dict(sup.starts), time.monotonic() - started)
