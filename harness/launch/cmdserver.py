"""The warm command server: `trainwreck run --cmd "python train.py ..."` with ranks forked
from a process that already imported torch (and the frameworks the script imports).

A fresh interpreter per rank per attempt pays `import torch` (and `import transformers`)
every time: seconds each on a few shared cores. This server pays it once, then forks one
child per rank, which becomes the user's `python SCRIPT.py ARGS` (or `python -m MOD ARGS`):
the rank's environment replaces os.environ, the working directory, sys.argv and sys.path[0]
are what the interpreter would set, the script runs as `__main__` (runpy), stdout and stderr
go to the rank's log, and the child exits as an interpreter does (non-daemon threads joined,
atexit handlers run, the same exit code; an uncaught KeyboardInterrupt dies by SIGINT). The
fork server's rules hold (harness/launch/forkserver.py): no torch op and no thread before a
fork, the heap frozen out of the collector, one process group per attempt.

Each child prepares its run first (chdir, environment, reading and compiling the script or
finding the module) and reports on a pipe; only when every rank of the attempt is ready does
the server let them run. A rank that cannot prepare (a missing script or module, a syntax
error, ...) has run nothing of the user's, so the server kills the attempt's children and
refuses, and the harness starts that attempt cold instead (harness/launch/launchers.py
WarmCmdLauncher), where the interpreter reports the problem as it always does.

What differs from a fresh interpreter (docs/HARNESS.md): modules imported at the server's
start read the harness's child environment, not the rank's (the two differ only in the
torchrun and TRAINWRECK_ variables, which torch reads when a process group starts, not at
import); every rank shares the server's str hash seed (PYTHONHASHSEED); sys.flags and
sys.orig_argv are the server's; torch's CPU generator and numpy's global one are reseeded from
the OS, as a fresh import seeds them; a process a rank forks without exec shows the server's initial
environment in /proc, so only its parent link (not the attempt's environment marker) finds it.

Protocol (as the fork server's, over the socket the harness passes):

    harness -> server  {"op": "start", "argv": [...], "cwd", "envs": [{...} per rank], "logs": [...],
                        "errs": [...] (optional: stderr apart from the log, per rank)}
    server -> harness  {"op": "ready", "pid", "import_s", "imported": [...], "threads"}
                       {"op": "started", "pids", "pgid"}  every rank prepared and running
                       {"op": "pages", "huge_bytes"}      once, before a "started" (forkserver.py settle)
                       {"op": "refused", "reason"}        no rank ran; start the attempt cold
                       {"op": "exit", "pid", "code"}

    python -m trainwreck.harness.launch.cmdserver FD PARENT_PID MODULE...
"""
from __future__ import annotations

import atexit
import importlib
import io
import os
import runpy
import select
import signal
import sys
import threading
import time
import types
from importlib.machinery import SourceFileLoader
from multiprocessing.connection import Connection
from typing import Any

from trainwreck.harness.launch.forkserver import Server, freeze_heap
from trainwreck.harness.launch.procs import set_parent_death_signal, signal_pid, thread_count

PREPARE_TIMEOUT_S = 60.0
"""How long the ranks of an attempt may take to prepare (-m imports the module's parent packages)."""
REFUSED_CODE = 97
"""A child that could not prepare exits with this; the server never reports it (the harness starts cold)."""


class CmdServer(Server):
    def on_start(self, msg: dict[str, Any]) -> None:
        self.start_command(msg["argv"], msg["cwd"], msg["envs"], msg["logs"], msg.get("errs"))

    def start_command(self, argv: list[str], cwd: str, envs: list[dict[str, str]], logs: list[str],
                      errs: list[str | None] | None = None) -> None:
        status_r, status_w = os.pipe()
        gate_r, gate_w = os.pipe()

        def body(env: dict[str, str], log: str, err: str | None, pgid: int) -> None:
            os.close(status_r)
            os.close(gate_w)
            self.command_child(argv, cwd, env, log, err, pgid, status_w, gate_r)  # never returns

        pids, pgid = self.fork_attempt([lambda pgid, env=env, log=log, err=err: body(env, log, err, pgid)
                                        for env, log, err in zip(envs, logs, errs or [None] * len(logs))])
        os.close(status_w)
        os.close(gate_r)
        reason = self.await_prepared(status_r, len(pids))
        os.close(status_r)
        if reason is not None:
            for pid in pids:
                signal_pid(pid, signal.SIGKILL)  # none has run a line of the user's code
            for pid in pids:
                os.waitpid(pid, 0)
            os.close(gate_w)
            self.conn.send({"op": "refused", "reason": reason})
            return
        self.children.update(pids)
        os.write(gate_w, b"g" * len(pids))  # each rank reads one byte, then runs
        os.close(gate_w)
        self.conn.send({"op": "started", "pids": pids, "pgid": pgid})

    def await_prepared(self, status_r: int, ranks: int) -> str | None:
        """None once every rank said it is ready; else why one could not prepare."""
        data, deadline = b"", time.monotonic() + PREPARE_TIMEOUT_S
        while data.count(b"\n") < ranks:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([status_r], [], [], left)[0]:
                return f"the ranks did not prepare in {PREPARE_TIMEOUT_S:g} s"
            chunk = os.read(status_r, 65536)
            if not chunk:  # every child closed its end: one died before reporting
                return "a rank died while preparing"
            data += chunk
        for line in data.decode(errors="replace").splitlines():
            if line != "ok":
                return line
        return None

    def command_child(self, argv: list[str], cwd: str, env: dict[str, str], log: str, err: str | None, pgid: int,
                      status_w: int, gate_r: int) -> None:
        try:
            server = self.leave_server(pgid, log, err)
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has it
            set_parent_death_signal(server)
            main, code, sys_argv = prepare(argv, cwd, env)
        except BaseException as exc:  # noqa: BLE001 - any failure here means: start this attempt cold
            report(status_w, f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300])
            os._exit(REFUSED_CODE)
        report(status_w, "ok")
        os.close(status_w)
        if os.read(gate_r, 1) != b"g":
            os._exit(REFUSED_CODE)
        os.close(gate_r)
        os._exit(run_as_main(main, code, sys_argv))


def report(fd: int, line: str) -> None:
    os.write(fd, (line + "\n").encode())  # one write under PIPE_BUF: ranks' lines never interleave


def prepare(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[types.ModuleType, types.CodeType, list[str]]:
    """Become the interpreter `argv` starts, up to its first line of user code: the directory,
    the environment, stdio, sys.path[0], the code to run as `__main__` and its sys.argv."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    fresh_stdio(env)
    reseed_generators()
    main = types.ModuleType("__main__")
    if argv[1] == "-m":
        sys.path[0] = os.getcwd()
        name, spec, code = runpy._get_module_details(argv[2])  # what `python -m` calls
        main.__dict__.update(__name__="__main__", __file__=spec.origin, __cached__=spec.cached,
                             __loader__=spec.loader, __package__=spec.parent, __spec__=spec)
        return main, code, [spec.origin or argv[2], *argv[3:]]
    path = os.path.abspath(argv[1])
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main.__dict__.update(__name__="__main__", __file__=path, __cached__=None,
                         __loader__=SourceFileLoader("__main__", path), __package__=None, __spec__=None)
    return main, code, argv[1:]


def fresh_stdio(env: dict[str, str]) -> None:
    """stdout/stderr over the rank's log as a new interpreter would open them: the server's
    were opened for its own fds (a terminal: line-buffered)."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=old.encoding,
                                  errors=old.errors, line_buffering=name == "stderr" or os.isatty(fd),
                                  write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def reseed_generators() -> None:
    """torch's CPU generator and numpy's global one were seeded once, from the OS, in the server;
    a fresh interpreter seeds its own, so an unseeded script draws other numbers in every rank and
    every attempt (its golden run's repeat then finds it nondeterministic, as it should). Python's
    `random` reseeds itself after a fork."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def run_as_main(main: types.ModuleType, code: types.CodeType, argv: list[str]) -> int:
    """Run `code` as `__main__` and end as the interpreter would; the exit code."""
    sys.argv = argv
    sys.modules["__main__"] = main
    try:
        runpy._run_code(code, main.__dict__, None, "__main__", main.__spec__, main.__package__, main.__file__)
        status = 0
    except SystemExit as exc:
        status = exit_status(exc)
    except KeyboardInterrupt as exc:
        print_uncaught(exc, code)
        status = -signal.SIGINT
    except BaseException as exc:  # noqa: BLE001 - the interpreter prints any uncaught exception and exits 1
        print_uncaught(exc, code)
        status = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as at exit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - nothing may unwind into the server's frames
        pass
    if status == -signal.SIGINT:  # the interpreter re-raises an uncaught ^C: the process dies by it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status & 0xFF


def print_uncaught(exc: BaseException, code: types.CodeType) -> None:
    """The traceback as the interpreter prints it: from the script's first frame, without the
    server's (a log reader takes the first frame for the script's)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code is not code:
        tb = tb.tb_next
    if tb is not None:
        exc.with_traceback(tb)  # the default hook prints the exception's own traceback, not its argument
    sys.excepthook(type(exc), exc, exc.__traceback__)


def exit_status(exc: SystemExit) -> int:
    """What the interpreter makes of sys.exit(code): None 0, an int itself, anything else printed and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def warm(modules: list[str]) -> list[str]:
    """Import each `module` or `module:attribute` (a lazy package's attribute imports its module);
    the ones that imported. A module that fails is left to the rank, which imports it itself."""
    done = []
    for item in modules:
        name, _, attribute = item.partition(":")
        try:
            module = importlib.import_module(name)
            if attribute:
                getattr(module, attribute)
            done.append(item)
        except Exception:  # noqa: BLE001 - the script's own import reports it, in the rank's log
            pass
    return done


def main(argv: list[str]) -> None:
    fd, parent, modules = int(argv[0]), int(argv[1]), argv[2:]
    started = time.perf_counter()
    set_parent_death_signal(parent)  # before the imports, as the fork server does
    imported = warm(modules)
    freeze_heap()
    conn = Connection(fd)
    conn.send({"op": "ready", "pid": os.getpid(), "import_s": time.perf_counter() - started,
               "imported": imported, "threads": thread_count()})
    CmdServer(conn).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
