"""Run trainer ranks as forked children of the test process, for trainer-level tests.

The harness has the real launchers; these tests check the trainer alone, so they
fork ranks from the already-warm pytest process (tens of milliseconds each) and own
a loopback TCPStore on an OS-assigned port. Every child is reaped or killed.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import traceback
import uuid
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable

import torch

import trainwreck.trainer.entry  # noqa: F401  forked ranks inherit DDP's lazy imports already done
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.hooks import Hooks, NoHooks
from trainwreck.trainer.launch import RankContext, loopback_store
from trainwreck.rundir.layout import write_json_atomic
from trainwreck.trainer.standalone import run_json_fields

CRASH_CODE = 17


class CrashAt(NoHooks):
    """Exit the process abruptly at one fault point of one step (a stand-in for a kill)."""

    def __init__(self, step: int, point: str = "step_start", rank: int = 0) -> None:
        self.step, self.point_name, self.rank_to_crash = step, point, rank
        self._rank = -1

    def bind(self, events: Any, rank: int, world_size: int, attempt: int) -> None:
        self._rank = rank

    def point(self, name: str, step: int, **ctx: Any) -> None:
        if name == self.point_name and step == self.step and self._rank == self.rank_to_crash:
            os._exit(CRASH_CODE)


def write_run_json(run_dir: Path, cfg: TrainConfig, world_sizes: list[int]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "run.json", run_json_fields(cfg, world_sizes))


def _child(ctx: RankContext, cfg: TrainConfig, hooks: Hooks, port_pipe: Connection) -> None:
    from trainwreck.trainer.entry import run_rank

    try:
        # The store's port arrives once every rank is forked (see run_attempt); EOF means the
        # test process is gone, and the rank has nothing to join.
        ctx = replace(ctx, store_port=port_pipe.recv())
        port_pipe.close()
        run_rank(ctx, cfg, hooks)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def run_attempt(run_dir: Path, cfg: TrainConfig, world_size: int, attempt: int,
                hooks: Callable[[], Hooks] = NoHooks, timeout_s: float = 120.0) -> dict[int, int]:
    """One attempt of `world_size` ranks; returns rank → exit code (negative: signal)."""
    if cfg.device != "cpu":
        # A forked child cannot use CUDA once this (pytest) process has touched it, as the GPU
        # tests in the same worker do: these trainer-level tests run the CPU path on every host.
        cfg = replace(cfg, device="cpu")
    # On a GPU host this process has likely initialised the CUDA driver (asking whether
    # CUDA is available is enough), and a child forked from it cannot run even a CPU
    # optimizer step ("CUDA error: initialization error"): fork from a clean server there.
    fork = multiprocessing.get_context("forkserver" if torch.cuda.is_available() else "fork")
    prefix = f"{uuid.uuid4().hex}/{attempt}"  # one fresh namespace shared by the attempt's ranks
    # Every rank is forked before the TCPStore exists. Forked while the store's server thread
    # was serving the first ranks' connections, a later rank could inherit a lock that thread
    # held and never reach the rendezvous: CI saw ranks 2 and 3 of a 4-rank attempt silent for
    # the whole 60 s store timeout while ranks 0 and 1 waited for them.
    procs, pipes = [], []
    for rank in range(world_size):
        ctx = RankContext(run_dir=run_dir, rank=rank, world_size=world_size, attempt=attempt,
                          store_host="127.0.0.1", store_port=None,
                          store_prefix=prefix, pg_timeout_s=60)
        theirs, ours = fork.Pipe(duplex=False)
        proc = fork.Process(target=_child, args=(ctx, cfg, hooks(), theirs), daemon=True)
        proc.start()
        theirs.close()
        procs.append(proc)
        pipes.append(ours)
    store = None
    try:
        store = loopback_store(0, world_size, timedelta(seconds=timeout_s))  # 127.0.0.1 only
        for pipe in pipes:
            pipe.send(store.port)
        _supervise(procs, timeout_s)
    finally:
        for pipe in pipes:
            pipe.close()
        for proc in procs:
            if proc.exitcode is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.join()
        del store
    return {rank: proc.exitcode for rank, proc in enumerate(procs)}


def _supervise(procs: list[Any], timeout_s: float) -> None:
    """Wait for every rank; once one fails, the rest would only block in collectives."""
    pending = {proc.sentinel: proc for proc in procs}
    while pending:
        ready = wait(list(pending), timeout=timeout_s)
        if not ready:
            raise TimeoutError(f"ranks still running after {timeout_s}s")
        for sentinel in ready:
            proc = pending.pop(sentinel)
            proc.join()
            if proc.exitcode != 0:
                return


@dataclass
class Events:
    """The events of a run directory, read plainly (the checkers have their own loader)."""

    items: list[dict[str, Any]]

    @classmethod
    def read(cls, run_dir: Path) -> Events:
        items = []
        for path in sorted((run_dir / "events").glob("*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    items.append(json.loads(line))
                except ValueError:
                    pass  # a torn last line of a killed rank
        return cls(items)

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.items if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]

    def digests(self, attempt: int | None = None, rank: int = 0) -> dict[int, str]:
        return {e["step"]: e["digest"] for e in self.of("step", rank=rank)
                if attempt is None or e["attempt"] == attempt}
