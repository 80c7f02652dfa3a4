"""Launchers start the W rank processes of one attempt and hand back an ``Attempt``.

``WarmLauncher``  forks ranks from a fork server that already imported torch (default; fast)
``SpawnLauncher`` fresh interpreters ``python -m harness.launch.rank`` (slow, nothing shared)
``CmdLauncher``   a user's own command per rank, torchrun's environment contract (fresh interpreters;
                  harness/supervise/command/warm.py forks them from a server instead, --cmd's default)

Which name starts which, and the launcher that owns restarts itself (the torchrun agent,
harness/supervise/torchrun.py), are declared once in harness/registry.py; each class here is built
from the job's spec (`factory(spec)`) by the harness's attempt loop.

Every attempt is one process group, so one killpg takes the whole attempt; every
rank also has a parent-death signal, so a dead harness leaves nothing behind.
"""
from __future__ import annotations

import atexit
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Protocol

from trainwreck.faults.foreign import HOOKS_FACTORY as CMD_HOOKS_FACTORY
from trainwreck.faults.between_attempts import corrupt_before
from trainwreck.harness.launch import gpus
from trainwreck.harness.launch.procs import child_env, descendants, end_processes, forkable_here, marked_processes, \
    process_group_kwargs, set_parent_death_signal, signal_group, signal_pid
from trainwreck.harness.launch.rank import ctx_to_json
from trainwreck.harness.launch.store import HarnessStore, Rendezvous
from trainwreck.trainer.launch import RankContext
from trainwreck.rundir.layout import RunDir

SERVER_START_TIMEOUT_S = 180.0
"""How long the fork server may take to import torch (seconds; a loaded 2-core box is slow)."""


def rank_contexts(run_dir: Path, attempt: int, world_size: int, rdzv: Rendezvous) -> list[RankContext]:
    base = RankContext(run_dir=Path(run_dir), rank=0, world_size=world_size, attempt=attempt,
                       store_host=rdzv.host, store_port=rdzv.port, store_prefix=rdzv.prefix)
    return [replace(base, rank=r, local_rank=r) for r in range(world_size)]


class Attempt(Protocol):
    """The processes of one attempt."""

    attempt: int
    world_size: int
    pids: dict[int, int]
    """rank -> pid of every rank started."""

    def exited(self) -> dict[int, int | None]:
        """rank -> exit code of the ranks that have ended (None: unknown); never blocks."""

    def waitables(self) -> list[Any]:
        """Objects for multiprocessing.connection.wait that become ready when a rank ends."""

    def signal(self, rank: int, sig: int) -> None:
        """Send `sig` to one rank if it is still running."""

    def kill(self) -> None:
        """SIGKILL the whole attempt (its process group and every rank)."""

    def reap(self, timeout_s: float) -> dict[int, int | None]:
        """Wait until every rank has ended; returns rank -> code (None: unknown)."""


class Launcher(Protocol):
    """Starts the attempts of one job; built by its registry entry's `factory(spec)`."""

    def start(self, run_dir: Path, attempt: int, world_size: int, rdzv: Rendezvous) -> Attempt: ...

    def close(self) -> None: ...


# ----- warm: the fork server ---------------------------------------------------------


class ForkServer:
    """The harness side of harness.launch.forkserver: one per harness process, reused across runs."""

    def __init__(self, module: str = "trainwreck.harness.launch.forkserver", args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        """`module`: the server's main (harness/launch/cmdserver.py serves a user's command), given
        the socket's fd, this pid and `args`; `env`: its environment (default child_env())."""
        ours, theirs = socket.socketpair()
        self.owner = os.getpid()
        self.proc = self.launch(ours, theirs, module, args, env)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.exits: dict[int, int] = {}
        self.huge_bytes: int | None = None  # of the server's heap on huge pages, once it says (forkserver.py)
        if not self.conn.poll(SERVER_START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"the fork server did not become ready in {SERVER_START_TIMEOUT_S}s")
        ready = self._recv()
        self.pid: int = ready["pid"]
        self.import_s: float = ready["import_s"]
        self.ready: dict[str, Any] = ready

    def launch(self, ours: socket.socket, theirs: socket.socket, module: str, args: tuple[str, ...],
               env: dict[str, str] | None) -> Any:
        """The server's process (a fresh interpreter): anything with poll(), wait(timeout) and kill()."""
        return subprocess.Popen(
            [sys.executable, "-m", module, str(theirs.fileno()), str(os.getpid()), *args],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            # Its own session: a Ctrl-C in the terminal reaches only the harness, which
            # then kills the attempts in order instead of racing them.
            start_new_session=True, env=child_env() if env is None else env,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None and os.getpid() == self.owner

    def _recv(self) -> dict[str, Any]:
        try:
            msg = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError("the fork server died; see the log of the ranks or rerun") from exc
        if msg["op"] == "exit":
            self.exits[msg["pid"]] = msg["code"]
        elif msg["op"] == "pages":
            self.huge_bytes = msg["huge_bytes"]
        return msg

    def pump(self) -> None:
        """Take every message already waiting (exit reports), without blocking."""
        while True:
            try:
                if not self.conn.poll(0):
                    return
                self._recv()
            except (EOFError, OSError, RuntimeError):
                return  # the server is gone; alive() says so

    def request(self, msg: dict[str, Any], replies: tuple[str, ...]) -> dict[str, Any]:
        """Send `msg` and wait for the server's reply whose op is in `replies` (exit reports on the
        way are recorded as they come)."""
        self.conn.send(msg)
        while True:
            reply = self._recv()
            if reply["op"] in replies:
                return reply

    def start(self, ctxs: list[RankContext], logs: list[Path]) -> tuple[list[int], int]:
        msg = self.request({"op": "start", "ctxs": [ctx_to_json(c) for c in ctxs], "logs": [str(p) for p in logs]},
                           ("started",))
        return msg["pids"], msg["pgid"]

    def close(self) -> None:
        try:
            self.conn.close()  # EOF tells the server to kill its children and exit
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ForkedServer(ForkServer):
    """A server forked from this process rather than started as a fresh interpreter: what this
    process has imported, the server holds without paying for it again (a benchmark job forked
    from the command server holds torch, and its ranks need nothing more). Only for a process
    running one thread: a fork copies every lock another thread holds at that moment, held
    forever (harness/launch/procs.py `thread_count`). The server leaves this process's
    session and never returns into its frames: it ends by os._exit, running none of this
    process's atexit handlers. It keeps this process's other open files, as the ranks a fresh
    server forks keep that server's. Its environment becomes `env` (default child_env(), as a
    fresh server's: gloo on loopback), and its signal state a fresh interpreter's."""

    def launch(self, ours: socket.socket, theirs: socket.socket, module: str, args: tuple[str, ...],
               env: dict[str, str] | None) -> Any:
        parent = os.getpid()
        environment = child_env() if env is None else env
        sys.stdout.flush()  # else text still in this process's buffers could be written again by the server
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ours.close()  # else the server never sees this end's EOF, its signal to stop
                os.setsid()  # its own session and stdin, as the fresh server has
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.close(null)
                fresh_signal_state()
                os.environ.clear()  # read by what runs later: gloo's interface, a rank's subprocesses
                os.environ.update(environment)
                importlib.import_module(module).main([str(theirs.fileno()), str(parent), *args])
                code = 0
            except BaseException:  # noqa: BLE001 - reported, then the process ends: never unwind into the job
                traceback.print_exc()
            finally:
                os._exit(code)
        return ForkedProcess(pid)


def fresh_signal_state() -> None:
    """The signal state a fresh interpreter starts with, in a forked server: this process's
    handlers (the harness's interrupt handlers would swallow a SIGTERM meant to end the server),
    its blocked signals and its wakeup fd do not carry over."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        handler = signal.getsignal(sig)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


class ForkedProcess:
    """A child this process forked, with the part of Popen's interface a server needs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            pidfd = os.pidfd_open(self.pid)  # readable once the child has ended (Linux 5.3)
            try:
                if not select.select([pidfd], [], [], timeout)[0]:
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            finally:
                os.close(pidfd)
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            signal_pid(self.pid, signal.SIGKILL)


class ServerSlot:
    """One server of a kind per harness process: started on demand, reused by later jobs while
    its key holds, replaced when the key changes or the server died (a forked copy of this
    process starts its own), and closed at exit: a clean EOF beats relying on the parent-death
    signal alone."""

    def __init__(self) -> None:
        self.key = ""
        self.server: ForkServer | None = None
        atexit.register(self.close)

    def get(self, key: str, start: Callable[[], ForkServer]) -> ForkServer:
        if self.server is not None and (self.key != key or not self.server.alive()):
            self.close()
        if self.server is None:
            self.server, self.key = start(), key
        return self.server

    def close(self) -> None:
        if self.server is not None and self.server.owner == os.getpid():
            self.server.close()
        self.server = None


_servers = ServerSlot()


def fork_server() -> ForkServer:
    """This process's fork server, started (or replaced, if it died) on demand."""
    return _servers.get("", ForkServer)


def fork_server_from_here() -> None:
    """Start this process's fork server now, forked from this process, when that is safe
    (procs.py `forkable_here`): it then holds the torch this process imported instead of a fresh
    interpreter importing it again, about 2 s of a 4.5 s start on two busy cores. Call it before
    opening run files, locks or sockets, which the server would hold too. Not where torch sees a
    CUDA device: asking it for the count started CUDA's driver in this process (`check_gpus` asks
    before any job), and a forked child cannot use a driver its parent started. Otherwise nothing
    happens, and `fork_server` starts a fresh server when the first attempt asks for one."""
    if forkable_here() and gpus.cuda_device_count() == 0:
        _servers.get("", ForkedServer)


def shutdown_fork_server() -> None:
    _servers.close()


class WarmAttempt:
    def __init__(self, server: ForkServer, attempt: int, world_size: int, pids: list[int], pgid: int) -> None:
        self.server, self.attempt, self.world_size = server, attempt, world_size
        self.pids = dict(enumerate(pids))
        self.pgid = pgid

    def exited(self) -> dict[int, int | None]:
        self.server.pump()
        out: dict[int, int | None] = {r: self.server.exits[p] for r, p in self.pids.items() if p in self.server.exits}
        if not self.server.alive():
            # Its children died with it (parent-death signal); their codes are lost.
            out.update({r: out.get(r) for r in self.pids})
        return out

    def waitables(self) -> list[Any]:
        return [self.server.conn] if self.server.alive() else []

    def signal(self, rank: int, sig: int) -> None:
        if rank not in self.exited():
            signal_pid(self.pids[rank], sig)

    def kill(self) -> None:
        if len(self.exited()) < len(self.pids):
            signal_group(self.pgid, signal.SIGKILL)
            for rank, pid in self.pids.items():
                if rank not in self.exited():
                    signal_pid(pid, signal.SIGKILL)  # a rank that missed the group

    def reap(self, timeout_s: float) -> dict[int, int | None]:
        deadline = time.monotonic() + timeout_s
        while len(self.exited()) < len(self.pids) and time.monotonic() < deadline:
            wait(self.waitables() or [], timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        codes = self.exited()
        for pid in self.pids.values():
            self.server.exits.pop(pid, None)  # pids get reused; forget them once reported
        return codes

    def finish(self, timeout_s: float) -> int | None:
        """The exit code of a one-process attempt (start_command's) once it ends. Past `timeout_s`,
        or when the wait is interrupted, it is killed and reaped instead, and the code is None."""
        code = None
        try:
            code = self.reap(timeout_s).get(0)
        finally:
            if code is None:
                self.kill()
                self.reap(10)
        return code


def start_command(server: ForkServer, argv: list[str], cwd: Path, env: dict[str, str], log: Path,
                  err: Path | None = None) -> WarmAttempt | str:
    """`argv` (`python -m MODULE ...` or `python SCRIPT ...`) as one process forked from a command
    server (harness/launch/cmdserver.py) in its own process group, its output in `log` (its stderr
    in `err`, when given); or, when the server refused it (it could not prepare, so nothing of it
    ran), why."""
    msg = server.request({"op": "start", "argv": [sys.executable, *argv[1:]], "cwd": str(cwd), "envs": [env],
                          "logs": [str(log)], "errs": [str(err) if err else None]}, ("started", "refused"))
    if msg["op"] == "refused":
        return f"it could not prepare in the fork ({msg['reason']})"
    return WarmAttempt(server, 0, 1, msg["pids"], msg["pgid"])


class WarmLauncher:
    def __init__(self, spec: Any = None) -> None:
        pass  # every warm job shares this process's fork server

    def start(self, run_dir: Path, attempt: int, world_size: int, rdzv: Rendezvous) -> WarmAttempt:
        server = fork_server()
        ctxs = rank_contexts(run_dir, attempt, world_size, rdzv)
        pids, pgid = server.start(ctxs, [RunDir(run_dir).rank_log(attempt, c.rank) for c in ctxs])
        return WarmAttempt(server, attempt, world_size, pids, pgid)

    def close(self) -> None:
        pass  # the server outlives the job: the next run reuses it


# ----- spawn: fresh interpreters -----------------------------------------------------


class SpawnAttempt:
    def __init__(self, attempt: int, world_size: int, procs: list[subprocess.Popen[bytes]]) -> None:
        self.attempt, self.world_size = attempt, world_size
        self.procs = procs
        self.pids = {r: p.pid for r, p in enumerate(procs)}
        self.pgid = procs[0].pid
        # A pidfd becomes readable when its process ends, so exits wake the supervisor.
        self._pidfds = [os.pidfd_open(p.pid) for p in procs] if hasattr(os, "pidfd_open") else []

    def exited(self) -> dict[int, int | None]:
        return {r: p.returncode for r, p in enumerate(self.procs) if p.poll() is not None}

    def waitables(self) -> list[Any]:
        return list(self._pidfds)

    def signal(self, rank: int, sig: int) -> None:
        if self.procs[rank].poll() is None:
            self.procs[rank].send_signal(sig)

    def kill(self) -> None:
        if any(p.poll() is None for p in self.procs):
            signal_group(self.pgid, signal.SIGKILL)
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()

    def reap(self, timeout_s: float) -> dict[int, int | None]:
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds = []
        return self.exited()


class SpawnLauncher:
    def __init__(self, spec: Any = None) -> None:
        pass

    def start(self, run_dir: Path, attempt: int, world_size: int, rdzv: Rendezvous) -> SpawnAttempt:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for ctx in rank_contexts(run_dir, attempt, world_size, rdzv):
                cmd = [sys.executable, "-m", "trainwreck.harness.launch.rank", "--ctx", ctx_to_json(ctx),
                       "--parent-pid", str(os.getpid())]
                with open(RunDir(run_dir).rank_log(attempt, ctx.rank), "ab") as log:
                    procs.append(subprocess.Popen(
                        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        env=child_env(),
                        # The first rank leads the attempt's process group, the others join it.
                        **process_group_kwargs(procs[0].pid if procs else 0),
                    ))
        except BaseException:
            for proc in procs:
                proc.kill()
                proc.wait()
            raise
        return SpawnAttempt(attempt, world_size, procs)

    def close(self) -> None:
        pass


# ----- cmd: a user's own command, once per rank -------------------------------------


class CmdLauncher:
    """Starts the user's command once per rank with torchrun's environment contract, so an
    unmodified torchrun script runs as it would under torchrun. A loopback store in the
    harness plays the elastic agent's store (TORCHELASTIC_USE_AGENT_STORE): every rank's
    env:// rendezvous connects to it as a client, so no rank listens on a port of its own.
    env:// adds no per-attempt prefix (torch expects a new agent store per restart), so
    each attempt gets a new store, not the job's: reused keys break the next attempt."""

    def __init__(self, spec: Any) -> None:
        """`spec`: a JobSpec whose target is a harness/supervise/command/target.py Command (checked non-empty there)."""
        self.argv = spec.target.argv
        self.plan, self.ckpt_dir = spec.plan, spec.target.ckpt_dir

    def start(self, run_dir: Path, attempt: int, world_size: int, rdzv: Rendezvous) -> SpawnAttempt:
        corrupt_before(run_dir, self.ckpt_dir, self.plan, attempt)  # the previous attempt is reaped by now
        return self.start_ranks(run_dir, attempt, world_size)

    def start_ranks(self, run_dir: Path, attempt: int, world_size: int) -> CmdAttempt:
        """The attempt's ranks, once its between-attempt faults are applied."""
        store = HarnessStore()
        rdzv = store.rendezvous(attempt)
        procs: list[subprocess.Popen[bytes]] = []
        parent = os.getpid()
        try:
            for rank in range(world_size):
                with open(RunDir(run_dir).rank_log(attempt, rank), "ab") as log:
                    procs.append(subprocess.Popen(
                        self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        env=cmd_env(run_dir, attempt, rank, world_size, rdzv),
                        **process_group_kwargs(procs[0].pid if procs else 0,
                                               lambda: set_parent_death_signal(parent))))
        except BaseException:
            for proc in procs:
                proc.kill()
                proc.wait()
            store.close()
            raise
        return CmdAttempt(attempt, world_size, procs, store, attempt_marker(run_dir, attempt))

    def close(self) -> None:
        pass


CHILD_SCAN_S = 0.5
"""Seconds between two looks for a --cmd attempt's child processes."""


class AttemptChildren:
    """Whatever the ranks of one --cmd attempt started, which dies with the attempt, and the
    store they rendezvous on (closed once they are reaped).

    A user's command may start children (data loaders, a server, a `setsid` daemon). Killing
    the ranks' process group misses a `setsid` child always, and misses every child once the
    ranks have exited (then nothing kills the group). So the attempt ends them itself: the
    live descendants of its ranks, found through their parents while the ranks live, and any
    process still carrying the attempt's environment marker (TRAINWRECK_RUN_DIR and
    TRAINWRECK_ATTEMPT, inherited whatever session or parent a child ends up with). What was
    ended is kept in `leftovers`, and the supervisor logs it."""

    def __init__(self, store: HarnessStore, marker: dict[str, str] | None) -> None:
        self.store, self.marker = store, marker
        self.children: list[int] = []
        self.leftovers: list[dict[str, object]] = []
        self._scanned = 0.0

    def scan(self, live: list[int], now: bool = False) -> None:
        """Remember the descendants of the `live` ranks (at most twice a second unless `now`: a
        /proc scan each): once a rank exits, a child it left is reparented and only the marker is left."""
        if now or time.monotonic() - self._scanned >= CHILD_SCAN_S:
            self._scanned = time.monotonic()
            self.children = list(dict.fromkeys(self.children + descendants(live)))

    def end(self, ranks: set[int]) -> None:
        """After the ranks (pids `ranks`) are reaped: end what they left, close the store."""
        marked = marked_processes(self.marker, ranks) if self.marker else []
        self.leftovers = end_processes([pid for pid in self.children + marked if pid not in ranks])
        self.store.close()


class CmdAttempt(SpawnAttempt):
    """A --cmd attempt of fresh interpreters: its ranks and what they started (AttemptChildren)."""

    def __init__(self, attempt: int, world_size: int, procs: list[subprocess.Popen[bytes]],
                 store: HarnessStore, marker: dict[str, str] | None = None) -> None:
        super().__init__(attempt, world_size, procs)
        self.started = AttemptChildren(store, marker)
        self.start_facts: dict[str, Any] = {}
        """What the attempt event says of how its ranks started (a fallback from warm ranks says why)."""

    @property
    def leftovers(self) -> list[dict[str, object]]:
        return self.started.leftovers

    def exited(self) -> dict[int, int | None]:
        self.started.scan([p.pid for p in self.procs if p.returncode is None])
        return super().exited()

    def kill(self) -> None:
        self.started.scan([p.pid for p in self.procs if p.poll() is None], now=True)
        super().kill()

    def reap(self, timeout_s: float) -> dict[int, int | None]:
        codes = super().reap(timeout_s)
        self.started.end({p.pid for p in self.procs})
        return codes


def attempt_marker(run_dir: Path, attempt: int) -> dict[str, str]:
    """The environment variables that mark every process of one --cmd attempt (see CmdAttempt)."""
    return {"TRAINWRECK_RUN_DIR": str(Path(run_dir).absolute()), "TRAINWRECK_ATTEMPT": str(attempt)}


def cmd_env(run_dir: Path, attempt: int, rank: int, world_size: int, rdzv: Rendezvous) -> dict[str, str]:
    """What torchrun gives a worker (single host), plus where the probe writes."""
    env = child_env()
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size), "MASTER_ADDR": rdzv.host, "MASTER_PORT": str(rdzv.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_RUN_ID": rdzv.prefix.split("/")[0],
        "TRAINWRECK_RUN_DIR": str(Path(run_dir).absolute()), "TRAINWRECK_ATTEMPT": str(attempt),
        # The probe builds the plan's in-rank faults with this (kill/hang at its points, crashes
        # inside the framework's save) and records each save's file operations.
        "TRAINWRECK_HOOKS": CMD_HOOKS_FACTORY,
    })
    return env
