"""The warm fork server: a process that has already imported torch and the trainer and
forks one fresh child per rank per attempt.

Forking costs milliseconds where a fresh interpreter costs seconds of imports, yet
every rank is still its own process, so a kill is a real process death. The server
never runs a torch op or creates a thread pool before forking, which keeps the fork
safe. Everything the server holds when it forks is frozen out of the garbage collector
(`gc.freeze`): a rank's own collections, and the full one a rank runs before it tears its
process group down, then walk only what the rank made, not the ~300k objects of torch's
imports (measured: 0.2 s of CPU per rank per collection, and the copy-on-write of every
page they sit on). Once it has forked 16 ranks, the heap moves onto huge pages
(harness/launch/pages.py): each later fork copies ~110 page-table entries of it, not ~55 000.
Protocol (pickled dicts over a socket the harness passes as a file descriptor):

    harness -> server  {"op": "start", "ctxs": [json...], "logs": [path...]}
    server -> harness  {"op": "ready", "pid", "import_s"}  once, after the warm imports
                       {"op": "started", "pids": [...], "pgid"}  reply to start
                       {"op": "pages", "huge_bytes"}  once, before a "started": the heap on huge pages (settle)
                       {"op": "exit", "pid", "code"}    a child ended (negative: killed by that signal)

    python -m harness.launch.forkserver FD PARENT_PID
"""
from __future__ import annotations

import gc
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Callable

from trainwreck.harness.launch.pages import collapse_heap
from trainwreck.harness.launch.procs import set_parent_death_signal, signal_pid

COLLAPSE_AFTER_FORKS = 16
"""Ranks a server forks before it moves its heap onto huge pages (`Server.settle`). The move costs
about what 16 forks then save (~0.3 s of CPU, against ~20 ms a fork: 10 of the server's and 10 of
the rank's, measured 2026-11-28); both grow with the heap, so the count does not. A server that
forks fewer, as a short `trainwreck run` does, never pays; one that forks many pays at most twice
what knowing its future would have cost."""


class Server:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.children: set[int] = set()
        self.forked = 0  # ranks forked so far
        self.settled = False  # the heap is on huge pages (or the kernel refused): see settle
        # SIGCHLD writes to this pipe, so one wait() covers requests and child exits.
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

    def serve(self) -> None:
        while True:
            ready = wait([self.conn, self.wake_r])
            if self.wake_r in ready:
                while True:
                    try:
                        if not os.read(self.wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
            self.reap()
            if self.conn in ready:
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    self.shutdown()
                    return
                if msg["op"] == "start":
                    self.settle()
                    self.on_start(msg)

    def settle(self) -> None:
        """Once the server has forked COLLAPSE_AFTER_FORKS ranks, before its next attempt forks and
        with no rank alive: the heap onto huge pages (harness/launch/pages.py), so that every later
        fork copies less. Never before: a short run would pay for it and gain nothing. Never while
        ranks run: their first writes hold the pages it moves, and the kernel refuses those
        (measured: 18-176 MB of ~190 MB moved, against all of it with no child). Says how much
        moved, for a reader who checks (launchers.py `ForkServer.huge_bytes`)."""
        if self.forked >= COLLAPSE_AFTER_FORKS and not self.settled and not self.children:
            self.settled = True
            self.conn.send({"op": "pages", "huge_bytes": collapse_heap()})

    def on_start(self, msg: dict) -> None:
        """One attempt's request (harness/launch/cmdserver.py serves a user's command instead)."""
        self.start(msg["ctxs"], msg["logs"])

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.conn.send({"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def start(self, ctxs: list[str], logs: list[str]) -> None:
        pids, pgid = self.fork_attempt([lambda pgid, c=ctx_json, log=log: self.child(c, pgid, log)
                                        for ctx_json, log in zip(ctxs, logs)])
        self.children.update(pids)
        self.conn.send({"op": "started", "pids": pids, "pgid": pgid})

    def fork_attempt(self, bodies: list[Callable[[int], None]]) -> tuple[list[int], int]:
        """One child per body, all in one new process group that the first leads: each child runs
        `body(pgid)` (0 for the first: it leads), which never returns. The children's pids and the group."""
        pgid, pids = 0, []
        freeze_heap()
        for body in bodies:
            pid = os.fork()
            if pid == 0:
                body(pgid)  # never returns
            pgid = pgid or pid
            try:
                # Both sides call setpgid so the child is in the group whichever runs first.
                os.setpgid(pid, pgid)
            except OSError:
                pass  # it already died, or the leader did; kills by pid still reach it
            pids.append(pid)
        self.forked += len(pids)
        return pids, pgid

    def leave_server(self, pgid: int, log: str, err: str | None = None) -> int:
        """A forked child's first steps: join the attempt's group, drop the server's signal
        handling, socket and pipes, write to the rank's log (stderr to `err`, when given).
        Returns the server's pid."""
        try:
            os.setpgid(0, pgid)  # pgid 0: the first rank leads the attempt's group
        except OSError:
            pass
        server = os.getppid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        self.conn.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        for path, targets in ((log, (1,) if err else (1, 2)), (err, (2,))):
            if path:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                for target in targets:
                    os.dup2(fd, target)
                os.close(fd)
        return server

    def child(self, ctx_json: str, pgid: int, log: str) -> None:
        code = 1
        try:
            server = self.leave_server(pgid, log)
            from trainwreck.harness.launch import rank

            set_parent_death_signal(server)
            rank.run(rank.ctx_from_json(ctx_json))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)  # never run the server's atexit/finally code in a rank

    def shutdown(self) -> None:
        for pid in list(self.children):
            signal_pid(pid, signal.SIGKILL)
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def freeze_heap() -> None:
    """Move every object the server holds into the collector's permanent generation, so the
    children forked next never traverse (nor copy) them. Collect first so no garbage is frozen
    with them: cheap after the first time, since what is frozen is not traversed again."""
    gc.collect()
    gc.freeze()


def main(argv: list[str]) -> None:
    fd, parent = int(argv[0]), int(argv[1])
    started = time.perf_counter()
    # Before the seconds of torch's import, not after: a harness SIGKILLed while the server
    # still imports would otherwise leave it running until the import ends.
    set_parent_death_signal(parent)  # the harness dies -> the server dies -> its ranks die
    from trainwreck.harness.launch.rank import warm_imports, warm_kernels  # imports torch

    warm_imports()
    try:
        warm_kernels()
    except Exception:  # noqa: BLE001 - said, and the ranks then pay the first-call work themselves
        traceback.print_exc()
    freeze_heap()  # the one expensive collection, paid here, before the server says it is ready
    conn = Connection(fd)
    conn.send({"op": "ready", "pid": os.getpid(), "import_s": time.perf_counter() - started})
    Server(conn).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
