"""The replica-groups launcher: restart one group (its ranks only) while the other groups train on.

Every other launcher here restarts the whole job. A replica-group trainer (torchft: see
trainer/frameworks/torchft_adapter.py) survives the loss of a group: the others keep
committing steps, and the restarted group heals from a live peer. `ReplicaSupervisor` runs a
JobSpec whose target is `ReplicaGroups` (harness/supervise/spec.py, which says what the job
is and which faults it takes; harness/registry.py declares this launcher as "replica-groups"):

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
  (up to the job's ``max_restarts`` per group; a group in ``lost_groups`` never is), the others
  untouched; with ``restart="job"`` every group is stopped and restarted together;
- a watchdog: no rank progressing for ``hang_timeout_s`` (the startup budget until every live
  rank has published) ends the job (a `hang` event).

Events: `exit` and `fault` as usual (plus `replica_group`), `group_start` {replica_group,
incarnation, pids} for each start, and restarts.JobSupervisor's `end`, with `group_starts`.
Outcomes: completed (every group that still had a process exited 0, at run.json's
total_steps); budget_exhausted (a failed group could not restart and none was left);
no_progress (the watchdog fired, or the ranks exited 0 short of total_steps); error; interrupted.

    python -m trainwreck.harness.supervise.replicas --spec JSON [--out DIR]   # ReplicaGroups.reproduce
"""
from __future__ import annotations

import argparse
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

from trainwreck.faults.foreign import HOOKS_FACTORY
from trainwreck.harness.errors import INPUT_ERRORS
from trainwreck.harness.launch.procs import child_env, process_group_kwargs, set_parent_death_signal, signal_group
from trainwreck.harness.launch.store import HOST, HarnessStore
from trainwreck.harness.supervise.interrupts import raise_if_received
from trainwreck.harness.supervise.supervisor import JobSupervisor, final_step
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.spec import LIGHTHOUSE_KIND, ReplicaGroups, replica_job_fields
from trainwreck.harness.supervise.watchdog import Watchdog
from trainwreck.rundir.layout import RunDir, read_run_json

LIGHTHOUSE_START_S = 30.0
"""How long the lighthouse may take to report its port."""
REAP_S = 10.0
LISTENING = re.compile(r"listening on: http://[^:\s]+:(\d+)")


class Lighthouse:
    """torchft's lighthouse as a child process on 127.0.0.1; the port is the one it reports."""

    def __init__(self, target: ReplicaGroups, log: Path) -> None:
        self.target, self.log = target, log
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # The lighthouse of the torchft the ranks import: beside the command's interpreter.
        argv0 = shlex.split(self.target.command)[0]
        binary = Path(argv0 if "/" in argv0 else sys.executable).with_name("torchft_lighthouse")
        exe = str(binary) if binary.exists() else "torchft_lighthouse"
        cmd = [exe, "--bind", f"{HOST}:{self.port}", "--min_replicas", "1",
               "--heartbeat_timeout_ms", str(int(self.target.heartbeat_timeout_s * 1000)),
               "--join_timeout_ms", str(int(self.target.join_timeout_s * 1000))]
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
    late: set[int] = field(default_factory=set)  # group ranks killed after "done" for not exiting (exit_overdue)
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


class ReplicaSupervisor(JobSupervisor):
    """The "replica-groups" launcher's supervisor: the groups of one job, each restarted on its own."""

    def __init__(self, spec: JobSpec, run_dir: Path) -> None:
        super().__init__(spec, run_dir)
        self.target: ReplicaGroups = spec.target  # type: ignore[assignment]  # the registry: it serves REPLICA_GROUPS
        self.world_size = spec.world_sizes[0]
        self.group_size = self.target.group_size(self.world_size)
        self.paths = RunDir(run_dir)
        self.lighthouse = Lighthouse(self.target, self.paths.logs / "lighthouse.log")
        self.live: dict[int, Incarnation] = {}
        self.starts: dict[int, int] = {g: 0 for g in range(self.target.groups)}
        self.lighthouse_faults = [dict(f) for f in spec.plan if f.get("kind") == LIGHTHOUSE_KIND]
        self.finished_ok = True
        self.completed: set[int] = set()  # groups whose every rank exited 0
        self.gate = HarnessStore()  # the first incarnations' meeting point (trainer's ReplicaProbe.ready)
        self.boards = Watchdog(self.watch_config, run_dir, 0, self.world_size)  # which ranks said "done", since when

    def rank_env(self, group: int, group_rank: int, store: HarnessStore, gated: bool) -> dict[str, str]:
        env = child_env()
        env.update({
            "RANK": str(group_rank), "WORLD_SIZE": str(self.group_size), "LOCAL_RANK": str(group_rank),
            "LOCAL_WORLD_SIZE": str(self.group_size), "MASTER_ADDR": HOST, "MASTER_PORT": str(store.port),
            "TORCHFT_LIGHTHOUSE": self.lighthouse.address, "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": str(self.target.groups),
            "TRAINWRECK_REPLICA_GROUP": str(group), "TRAINWRECK_REPLICA_GROUPS": str(self.target.groups),
            "TRAINWRECK_INCARNATION": str(self.starts[group]),
            "TRAINWRECK_RUN_DIR": str(self.paths.root.absolute()), "TRAINWRECK_ATTEMPT": "0",
            "TRAINWRECK_HOOKS": HOOKS_FACTORY,
        })
        if gated:  # every group starts together: they meet before their first update
            env["TRAINWRECK_REPLICA_GATE"] = f"{HOST}:{self.gate.port}"
        return env

    def start_group(self, group: int, gated: bool = False) -> None:
        store = HarnessStore()
        procs: list[subprocess.Popen[bytes]] = []
        parent = os.getpid()
        for r in range(self.group_size):
            with open(self.paths.rank_log(0, group * self.group_size + r), "ab") as log:
                procs.append(subprocess.Popen(
                    shlex.split(self.target.command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=self.rank_env(group, r, store, gated),
                    **process_group_kwargs(procs[0].pid if procs else 0, lambda: set_parent_death_signal(parent))))
        self.live[group] = Incarnation(group, self.starts[group], procs, store)
        self.events.emit("group_start", replica_group=group, incarnation=self.starts[group],
                         pids=[p.pid for p in procs])
        self.events.flush()
        self.starts[group] += 1

    def supervise(self) -> str:
        self.lighthouse.start()
        for g in range(self.target.groups):
            self.start_group(g, gated=True)
        last_progress, last_seen = time.monotonic(), self.progress()
        while self.live:
            # A pidfd becomes readable when its process ends; the timeout bounds how late a
            # lighthouse fault or the watchdog looks at the progress boards.
            wait([fd for inc in self.live.values() for fd in inc.pidfds], timeout=0.1)
            raise_if_received()  # an interrupt whose exception something swallowed still stops the job
            for group in list(self.live):
                if group in self.live:  # a job restart may have replaced or ended it meanwhile
                    self.reap_exits(self.live[group])
            seen = self.progress()  # every board read once per poll; the checks below use this reading
            self.fire_lighthouse_faults(seen)
            self.end_overdue()
            if seen != last_seen or self.only_exiting():  # ranks past "done" are exiting, not hung
                last_progress, last_seen = time.monotonic(), seen
            elif time.monotonic() - last_progress > self.silence_budget_s():
                self.record_hang(seen, time.monotonic() - last_progress)
                return "no_progress"
        if not self.finished_ok:
            return "budget_exhausted"
        return "completed" if self.reached_total_steps() else "no_progress"

    def running(self) -> dict[int, tuple[Incarnation, int]]:
        """Every rank process still running: global rank -> (its incarnation, its group rank)."""
        return {inc.group * self.group_size + r: (inc, r) for inc in self.live.values()
                for r, proc in enumerate(inc.procs) if r not in inc.done and proc.poll() is None}

    def only_exiting(self) -> bool:
        """Every running rank has said "done": the silence is teardown, bounded by end_overdue."""
        running = self.running()
        return bool(running) and all(map(self.boards.done, running))

    def end_overdue(self) -> None:
        """Ranks past "done" for longer than the exit budget: stack-dumped, killed, and counted as
        finished (their training was over), as the attempt loop does (supervisor.py). Reads the
        boards as `progress` last read them."""
        running = self.running()
        stuck = self.boards.overdue(running)
        if not stuck:
            return
        self.on_overdue(0, self.boards, stuck, {g: running[g][0].procs[running[g][1]].pid for g in stuck})
        for g in stuck:
            inc, r = running[g]
            if inc.procs[r].poll() is not None:
                continue  # it exited after all: reap_exits reports its own code
            inc.procs[r].kill()
            inc.procs[r].wait(REAP_S)
            inc.done[r] = inc.procs[r].returncode
            inc.late.add(r)
            self.events.emit("exit", rank=g, code=inc.done[r], replica_group=inc.group, incarnation=inc.number,
                             stopped_by_harness=True)
            self.reap_exits(inc)

    def silence_budget_s(self) -> float:
        """hang_timeout_s once every live rank is up; until then the startup budget (imports are slow)."""
        return self.spec.hang_timeout_s if self.all_up() else self.spec.startup_budget_s

    def reached_total_steps(self) -> bool:
        """The ranks trained the updates their trainer declared in run.json (exit 0 alone is not enough)."""
        total = read_run_json(self.run_dir).get("total_steps")
        return not isinstance(total, int) or final_step(self.run_dir, self.attempt) >= total

    def all_up(self) -> bool:
        """Every live rank has published progress since its incarnation started."""
        for inc in self.live.values():
            for r in range(len(inc.procs)):
                board = self.paths.rank_progress(0, inc.group * self.group_size + r)
                try:
                    if board.stat().st_mtime < inc.started:
                        return False
                except FileNotFoundError:
                    return False
        return True

    def record_hang(self, seen: dict[int, int], silent_s: float) -> None:
        """No rank moved for hang_timeout_s: the suspects are the ranks furthest behind."""
        self.hangs += 1
        behind = min(seen.values(), default=0)
        suspects = sorted(r for r in range(self.world_size) if seen.get(r, 0) == behind)
        self.events.emit("hang", ranks=suspects, waiting=sorted(set(range(self.world_size)) - set(suspects)),
                         last_step=max(seen.values(), default=0), detected_after_s=round(silent_s, 3))

    def reap_exits(self, inc: Incarnation) -> None:
        for r, proc in enumerate(inc.procs):
            if r not in inc.done and proc.poll() is not None:  # poll() keeps the code once it has it
                inc.done[r] = proc.returncode
                self.events.emit("exit", rank=inc.group * self.group_size + r, code=proc.returncode,
                                 replica_group=inc.group, incarnation=inc.number)
        if not inc.done:
            return
        if all(code == 0 or r in inc.late for r, code in inc.done.items()):
            if len(inc.done) == len(inc.procs):
                self.completed.add(inc.group)
                inc.store.close()
                inc.close_fds()
                del self.live[inc.group]
            return
        self.restart_after_failure(inc)

    def restart_after_failure(self, inc: Incarnation) -> None:
        """A rank of `inc` died: its group goes (with restart="job", every group) and comes back
        while the budget lasts: the job's max_restarts, per group."""
        budget, scope = self.spec.max_restarts, self.target.restart
        for gone in (list(self.live.values()) if scope == "job" else [inc]):
            self.stop(gone)
        if scope == "job":
            if all(self.starts[g] <= budget for g in range(self.target.groups)):
                for g in range(self.target.groups):
                    self.start_group(g, gated=True)
            else:
                self.finished_ok = False
            return
        others = set(range(self.target.groups)) - {inc.group}
        # A group restarted after every other one finished would train alone from step 0.
        if (inc.group not in self.target.lost_groups and self.starts[inc.group] <= budget
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
                self.events.emit("exit", rank=inc.group * self.group_size + r, code=inc.done[r],
                                 replica_group=inc.group, incarnation=inc.number, stopped_by_harness=True)
        del self.live[inc.group]

    def progress(self) -> dict[int, int]:
        """Each rank's newest published update (ranks that published nothing are left out)."""
        return {rank: board.step for rank, board in self.boards.observe().items() if board is not None}

    def fire_lighthouse_faults(self, seen: dict[int, int]) -> None:
        reached = max(seen.values(), default=0)
        for fault in [f for f in self.lighthouse_faults if reached >= int(f.get("step", 0))]:
            self.lighthouse_faults.remove(fault)
            self.events.emit("fault", fault_id=fault["id"], rank=None, fault_kind=LIGHTHOUSE_KIND,
                             detail=f"lighthouse (pid {self.lighthouse.proc.pid if self.lighthouse.proc else None}) "
                                    f"SIGKILLed when a rank reached update {reached}")
            self.events.flush()
            self.lighthouse.kill()
            self.lighthouse.start()  # same port: the ranks know only that address

    def kill_all(self) -> None:
        for inc in list(self.live.values()):
            inc.kill()
        self.live.clear()
        self.lighthouse.kill()
        self.gate.close()

    def end_fields(self) -> dict[str, Any]:
        return {"group_starts": dict(self.starts)}


def main(argv: list[str] | None = None) -> int:
    """Rerun a replica-group job from its reproduce line and judge it: exit 0 valid, 1 invalid, 2 unknown."""
    from trainwreck.harness.supervise.supervisor import run_job
    from trainwreck.invariants.verdict import exit_code

    p = argparse.ArgumentParser(description="rerun a replica-group job (ReplicaGroups.reproduce) and judge it")
    p.add_argument("--spec", required=True, help="the job as JSON, as the reproduce line gives it")
    p.add_argument("--out", type=Path, help="a new run directory (default: a temporary one, kept)")
    args = p.parse_args(argv)
    try:
        spec = JobSpec(**replica_job_fields(args.spec), run_dir=args.out, keep=True)
        record = run_job(spec)
    except INPUT_ERRORS as exc:
        print(f"trainwreck: {exc}", file=sys.stderr)
        return 2
    judgement = spec.target.judge(record.run_dir, None)
    print(f"{judgement.word} ({record.outcome}): {record.run_dir}")
    return exit_code(judgement.valid)


if __name__ == "__main__":
    sys.exit(main())
