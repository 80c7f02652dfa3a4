"""The benchmarks' gloo jobs: one process per rank on loopback, forked from a warm command server.

Each rank runs `python -m MODULE --rank R --world W --port P --out F ARGS`; rank 0 writes its
figures to F as JSON. The ranks used to be fresh interpreters, and importing torch and its FSDP
modules costs about 5 CPU-seconds a process on the 2-core machine: most of a short measuring job.
They are now forked from the harness's command server (harness/launch/cmdserver.py, the one
`--cmd` uses), which imported BENCHMARK_MODULES once. Each is still a process of its own, in its own
process group, running MODULE as `__main__` the way `python -m` does, its output in a log of its own.

The server is forked from this process when it runs one thread, as a benchmark job does when
it starts (`python -m trainwreck.benchmarks.fsdp`, or one the handbook forked from its own command
server): it then holds torch and FSDP's modules already, and the job pays no second import (about
5 s of the handbook's 8 s a measurement here). Otherwise the server is a fresh interpreter: `python
-m trainwreck.benchmarks` has run threaded benchmarks (hashing pools, process groups) before a job,
and a fork copies whatever lock a thread held at that moment (a job forked from it once deadlocked
there, idle). So the server starts before the job's TCPStore, whose own thread would rule the fork
out. A job the server cannot serve starts its ranks cold, as before, and says why on stderr.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainwreck.harness.launch.procs import child_env
from trainwreck.harness.supervise.command.warm import BENCHMARK_MODULES, WarmPlan, fork_command, serving

JOB_TIMEOUT_S = 300.0
"""How long one job's ranks may take, all together, before they are killed."""


def run_ranks(module: str, world: int, args: list[str], what: str) -> dict[str, Any]:
    """One gloo job of `world` ranks of `module`; rank 0's figures. Every rank is reaped or killed;
    a failed job's error quotes the end of each failed rank's log."""
    # One OpenMP thread: numpy's BLAS pool would make the server unforkable. The same environment
    # for the server and the ranks, so the ranks find it under its key.
    env = child_env()
    server = serving(WarmPlan(BENCHMARK_MODULES, env), here=True)  # before the store starts its thread
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="trainwreck-bench-") as tmp:
        out = Path(tmp) / "rank0.json"
        argvs = [[sys.executable, "-m", module, "--rank", str(r), "--world", str(world), "--port", str(store.port),
                  "--out", str(out), *args] for r in range(world)]
        logs = [Path(tmp) / f"rank{r}.log" for r in range(world)]
        codes = server if isinstance(server, str) else _forked(argvs, logs, env)
        if isinstance(codes, str):
            print(f"trainwreck.benchmarks: the {what} ranks start cold (fresh interpreters): {codes}",
                  file=sys.stderr, flush=True)
            codes = _cold(argvs, logs)
        if any(code != 0 for code in codes) or not out.exists():
            tails = "".join(f"\n--- rank {r} (exit {code}):\n{_tail(log)}"
                            for r, (code, log) in enumerate(zip(codes, logs)) if code != 0)
            raise RuntimeError(f"the {what} job at world {world} failed: exit codes {codes}{tails}")
        return json.loads(out.read_text())


def _forked(argvs: list[list[str]], logs: list[Path], env: dict[str, str]) -> list[int | None] | str:
    """Each rank forked from the command server, then reaped (killed past JOB_TIMEOUT_S); the exit
    codes (None: killed or lost). Why not, having left nothing running, when one could not fork."""
    ranks, codes = [], []
    try:
        for argv, log in zip(argvs, logs):
            rank = fork_command(argv, Path.cwd(), env, log, BENCHMARK_MODULES)
            if isinstance(rank, str):
                return rank
            ranks.append(rank)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        for rank in ranks:
            codes.append(rank.finish(max(0.0, deadline - time.monotonic())))
        return codes
    finally:
        for rank in ranks[len(codes):]:  # not waited for (a refused fork, an interrupt): killed unless ended
            rank.finish(0)


def _cold(argvs: list[list[str]], logs: list[Path]) -> list[int | None]:
    """Each rank a fresh interpreter (plain subprocesses: multiprocessing's spawn leaves a
    resource-tracker process behind); the exit codes (None: killed past JOB_TIMEOUT_S)."""
    procs = []
    try:
        for argv, log in zip(argvs, logs):
            with open(log, "wb") as f:
                procs.append(subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT))
        deadline, codes = time.monotonic() + JOB_TIMEOUT_S, []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)  # killed below
        return codes
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def gloo_rank(rank: int, world: int, port: int, out: Path, measure: Callable[[int], dict[str, Any]]) -> None:
    """One rank of a `run_ranks` job: join the loopback store, run `measure(world)` on every rank,
    rank 0 writes its figures to `out`, and every rank leaves the group together."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    result = measure(world)
    if rank == 0:
        out.write_text(json.dumps(result))
    dist.barrier()  # every rank done before any tears the group down (a gloo peer aborted at exit without it)
    dist.destroy_process_group()
