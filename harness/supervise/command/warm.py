"""`--cmd`'s default launcher: the user's `python SCRIPT.py ...` / `python -m MOD ...` ranks
forked from a server that imported torch (and the frameworks the script imports) once
(harness/launch/cmdserver.py), instead of a fresh interpreter per rank per attempt.

It serves a command whose interpreter is the harness's own (same executable, same
environment: a venv's python is not the system's) run on a script or `-m` module with no
interpreter options. Anything else (another program, another interpreter, `-c`, `-u`, a
rank that cannot prepare in the fork, a server that could not import without threads)
starts cold, exactly as launcher `cmd` does, and says so: one line on stderr per job and, on
every attempt event, `ranks: "cold"` with `cold_reason` (`ranks: "forked"` otherwise).

Which modules the server imports is read off the command's own files (those its golden key
covers, harness/supervise/command/golden_key.py): torch always, and whatever the files import
from the frameworks in WARM_ROOTS, down to the names (`from transformers import Trainer`
loads transformers' lazy Trainer module in the server).
"""
from __future__ import annotations

import ast
import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwreck.faults.between_attempts import corrupt_before
from trainwreck.harness.launch.launchers import AttemptChildren, CmdLauncher, ForkedServer, ForkServer, ServerSlot, \
    WarmAttempt, attempt_marker, cmd_env, start_command
from trainwreck.harness.launch.procs import child_env, forkable_here
from trainwreck.harness.launch.rank import SHARDING_MODULES, WARM_MODULES
from trainwreck.harness.launch.store import HarnessStore, Rendezvous
from trainwreck.harness.supervise.command.golden_key import command_sources
from trainwreck.rundir.layout import RunDir

WARM_ROOTS = ("torch", "transformers", "lightning", "pytorch_lightning", "accelerate", "trainwreck", "numpy")
"""Installed packages whose modules the server imports when the command's files import them
(never the user's own modules: importing those could run their code in the server)."""
TORCH_MODULES = tuple(m for m in WARM_MODULES if (m == "torch" or m.startswith("torch.")) and m not in SHARDING_MODULES)
"""What every command's server imports: the reference fork server's torch modules (rank.py) but FSDP's
and DCP's, which a script that imports them gets warmed as any other import."""
BENCHMARK_MODULES = (*TORCH_MODULES, *SHARDING_MODULES, "trainwreck.trainer.parallel", "trainwreck.trainer.data",
                     "trainwreck.trainer.sampler", "trainwreck.benchmarks.ranks")
"""What the server imports for the benchmarks' jobs and ranks (benchmarks/ranks.py, the handbook's
measurements): torch, FSDP's modules, the trainer's pieces the jobs build on and the ranks' runner
that every rank's module imports. One list for jobs and ranks alike, so one server (one key) serves
both. Never a job's own module: runpy warns when the `-m` module is already imported."""

VOLATILE_ENV = ("PYTEST_CURRENT_TEST",)
"""Variables that change between jobs of one harness process but no import reads (pytest names the
running test in one): a server started under another value still serves (each rank gets its own)."""


@dataclass(frozen=True)
class WarmPlan:
    """How the server runs a command: what it imports, keyed by what it depends on."""

    modules: tuple[str, ...]
    env: dict[str, str]

    @property
    def key(self) -> str:
        """A server serves only commands with the same interpreter, imports and environment."""
        h = hashlib.sha256(sys.executable.encode())
        env = sorted(f"{k}={v}" for k, v in self.env.items() if k not in VOLATILE_ENV)
        for item in [*self.modules, *env]:
            h.update(b"\0" + item.encode())
        return h.hexdigest()


def unservable(argv: list[str], cwd: Path, env: dict[str, str]) -> str | None:
    """Why the server cannot run `argv` as the interpreter would; None when it can."""
    if len(argv) < 2:
        return "the command is not `python SCRIPT.py ...` or `python -m MODULE ...`"
    program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if program is None:
        return f"{argv[0]!r} is not found on PATH"
    program = os.path.abspath(os.path.join(cwd, program))
    own = os.path.abspath(sys.executable)
    # The same binary in the same directory: a venv is found from where its python sits, not its target.
    if os.path.dirname(program) != os.path.dirname(own) or os.path.realpath(program) != os.path.realpath(own):
        return f"its program {argv[0]!r} is not the harness's own interpreter {sys.executable}"
    if argv[1] == "-m":
        return None if len(argv) > 2 else "`-m` names no module"
    if argv[1].startswith("-"):
        return f"it passes the interpreter option {argv[1]!r} (only `python SCRIPT.py` and `python -m MODULE` fork)"
    return None


def warm_modules(command: str, cwd: Path, env: dict[str, str]) -> tuple[str, ...]:
    """torch, and what the command's own files import from WARM_ROOTS (`module` or `module:name`)."""
    found: dict[str, None] = dict.fromkeys(TORCH_MODULES)
    for path in command_sources(command, cwd, env).files:
        if path.suffix != ".py":
            continue
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, OSError):
            continue  # the rank reports it, or the fork refuses and the cold start does
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(dict.fromkeys(a.name for a in node.names if _warmable(a.name)))
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module and _warmable(node.module):
                found[node.module] = None
                found.update(dict.fromkeys(f"{node.module}:{a.name}" for a in node.names if a.name != "*"))
    return tuple(found)


def _warmable(module: str) -> bool:
    return module.split(".")[0] in WARM_ROOTS


_servers = ServerSlot()
"""One command server at a time: it holds a framework's imports (hundreds of MB)."""


def command_server(plan: WarmPlan, here: bool = False) -> ForkServer:
    """This process's command server for `plan`, started on demand, replaced when the plan's key changes.
    `here`: forked from this process when it runs one thread (it then holds this process's imports at
    no cost; the caller vouches that its state is fit for the ranks), else a fresh interpreter. Linux
    only: elsewhere no /proc counts a library's threads, and no pidfd waits for the server."""
    def start() -> ForkServer:
        kind = ForkedServer if here and forkable_here() else ForkServer
        return kind("trainwreck.harness.launch.cmdserver", plan.modules, plan.env)
    return _servers.get(plan.key, start)


def shutdown_command_server() -> None:
    _servers.close()


def serving(plan: WarmPlan, here: bool = False) -> ForkServer | str:
    """The command server for `plan`, ready to fork; or why it cannot be used."""
    try:
        server = command_server(plan, here)
    except RuntimeError as exc:
        return f"the command server did not start ({exc})"
    if server.ready.get("threads", 1) > 1:
        return (f"the command server runs {server.ready['threads']} threads after importing "
                f"{', '.join(server.ready.get('imported', []))}: forking it is unsafe")
    return server


def fork_command(argv: list[str], cwd: Path, env: dict[str, str], log: Path,
                 modules: tuple[str, ...] = TORCH_MODULES, err: Path | None = None) -> WarmAttempt | str:
    """`argv` as one process forked from this process's command server, which imports `modules`
    (never the `-m` module itself: runpy warns about one already imported), its output in `log`
    (stderr in `err`, when given); or why not, having run nothing of it: the caller then starts it cold."""
    reason = unservable(argv, cwd, env)
    server = serving(WarmPlan(modules, env)) if reason is None else reason
    return server if isinstance(server, str) else start_command(server, argv, cwd, env, log, err)


class WarmCmdLauncher:
    """Forks each rank of each attempt from the command server; starts cold (CmdLauncher) and
    says why when the command or the fork cannot be served."""

    def __init__(self, spec: Any) -> None:
        self.command, self.argv = spec.target.command, spec.target.argv
        self.plan, self.ckpt_dir = spec.plan, spec.target.ckpt_dir
        self.cold = CmdLauncher(spec)
        self.cold_reason: str | None = None
        self.said = False

    def start(self, run_dir: Path, attempt: int, world_size: int, rdzv: Rendezvous) -> Any:
        cwd = Path.cwd()
        env = child_env()
        corrupt_before(run_dir, self.ckpt_dir, self.plan, attempt)  # the previous attempt is reaped by now
        reason = self.cold_reason or unservable(self.argv, cwd, env)
        if reason is None:
            handle = self.fork(run_dir, attempt, world_size, cwd, env)
            if isinstance(handle, WarmCmdAttempt):
                return handle
            reason = handle
        return self.start_cold(run_dir, attempt, world_size, reason)

    def fork(self, run_dir: Path, attempt: int, world_size: int, cwd: Path, env: dict[str, str]) -> Any:
        """The attempt's ranks forked from the server; or why they were not."""
        server = serving(WarmPlan(warm_modules(self.command, cwd, env), env))
        if isinstance(server, str):
            return server
        store = HarnessStore()
        try:
            rdzv = store.rendezvous(attempt)
            envs = [cmd_env(run_dir, attempt, rank, world_size, rdzv) for rank in range(world_size)]
            logs = [str(RunDir(run_dir).rank_log(attempt, rank)) for rank in range(world_size)]
            msg = server.request({"op": "start", "argv": self.argv, "cwd": str(cwd), "envs": envs, "logs": logs},
                                 ("started", "refused"))
            if msg["op"] == "started":
                return WarmCmdAttempt(server, attempt, world_size, msg["pids"], msg["pgid"], store,
                                      attempt_marker(run_dir, attempt))
            store.close()
            return f"a rank could not prepare in the fork ({msg['reason']})"
        except BaseException:
            store.close()
            raise

    def start_cold(self, run_dir: Path, attempt: int, world_size: int, reason: str) -> Any:
        self.cold_reason = reason  # once refused, every later attempt of the job starts cold too
        if not self.said:
            print(f"trainwreck: --cmd ranks start cold (fresh interpreters), not forked warm: {reason}",
                  file=sys.stderr, flush=True)
            self.said = True
        handle = self.cold.start_ranks(run_dir, attempt, world_size)
        handle.start_facts = {"ranks": "cold", "cold_reason": reason}
        return handle

    def close(self) -> None:
        pass  # the server outlives the job: the next --cmd job with the same imports reuses it


class WarmCmdAttempt(WarmAttempt):
    """A --cmd attempt whose ranks the command server forked: its exits come from the server,
    and what the ranks started dies with it, as a cold attempt's does (AttemptChildren)."""

    def __init__(self, server: ForkServer, attempt: int, world_size: int, pids: list[int], pgid: int,
                 store: HarnessStore, marker: dict[str, str]) -> None:
        super().__init__(server, attempt, world_size, pids, pgid)
        self.started = AttemptChildren(store, marker)
        self.start_facts: dict[str, Any] = {"ranks": "forked"}

    @property
    def leftovers(self) -> list[dict[str, object]]:
        return self.started.leftovers

    def _live(self, done: dict[int, int | None]) -> list[int]:
        return [pid for rank, pid in self.pids.items() if rank not in done]

    def exited(self) -> dict[int, int | None]:
        done = super().exited()
        self.started.scan(self._live(done))
        return done

    def kill(self) -> None:
        self.started.scan(self._live(super().exited()), now=True)
        super().kill()

    def reap(self, timeout_s: float) -> dict[int, int | None]:
        codes = super().reap(timeout_s)
        self.started.end(set(self.pids.values()))
        return codes
