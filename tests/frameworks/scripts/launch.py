"""A stand-in for `trainwreck run --cmd` (the `probe` branch builds the real one): write
run.json, start one process per rank with torchrun's environment contract, one attempt after
another, write the harness's `exit` and `end` events, and judge with the unchanged invariants.
It knows nothing of frameworks: the command is the user's."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from trainwreck.invariants import Judgement, judge, load_history
from trainwreck.trainer.rundir import FORMAT, RunDir, iter_events, write_json_atomic

ATTEMPT_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Attempt:
    world_size: int
    args: tuple[str, ...] = ()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_spec(run_dir: Path, total_steps: int, dataset_size: int, global_batch: int,
               world_sizes: Sequence[int], faults: Sequence[dict[str, Any]] = ()) -> None:
    RunDir(run_dir).events.mkdir(parents=True, exist_ok=True)
    write_json_atomic(RunDir(run_dir).run_json, {
        "format": FORMAT, "dataset_size": dataset_size, "global_batch": global_batch, "drop_last": False,
        "total_steps": total_steps, "hang_timeout_s": ATTEMPT_TIMEOUT_S, "world_sizes": list(world_sizes),
        "faults": list(faults), "launcher": "tests/frameworks/scripts/launch.py"})


def harness_event(run_dir: Path, kind: str, **fields: Any) -> None:
    with open(RunDir(run_dir).harness_events, "a") as f:
        f.write(json.dumps({"kind": kind, "t": time.time(), **fields}) + "\n")


def run_attempt(cmd: Sequence[str], run_dir: Path, attempt: int, world_size: int,
                env: dict[str, str] | None = None) -> list[int]:
    """Every rank's exit code; ranks left alive once one has died are killed (their groups)."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        rank_env = {**os.environ, **(env or {}), "RANK": str(rank), "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TRAINWRECK_RUN_DIR": str(run_dir),
                    "TRAINWRECK_ATTEMPT": str(attempt), "TRAINWRECK_STAND_IN_PROBE": "1"}
        log = open(RunDir(run_dir).root / f"a{attempt}-r{rank}.log", "w")
        procs.append(subprocess.Popen(list(cmd), env=rank_env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        log.close()
    deadline = time.monotonic() + ATTEMPT_TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.returncode not in (None, 0) for p in procs):
                break  # one died: the rest are stuck in a collective or will be
            time.sleep(0.05)  # polling exit codes, not synchronising with the ranks
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    codes = [p.returncode for p in procs]
    for rank, code in enumerate(codes):
        harness_event(run_dir, "exit", attempt=attempt, rank=rank, returncode=code)
    return codes


def corrupt_newest(run_dir: Path, fault: dict[str, Any]) -> None:
    """A `corrupt` fault (how=truncate) on a foreign store: the newest file named `file` in the
    checkpoint folder is cut to `offset` bytes (default half); the fault event comes first."""
    target = RunDir(run_dir).checkpoints / fault.get("file", "last.ckpt")
    if not target.is_file():
        return  # nothing to damage: no event, so the judge says the fault never fired
    size = target.stat().st_size
    keep = fault.get("offset", size // 2)
    harness_event(run_dir, "fault", fault_id=fault["id"], fault_kind="corrupt", rank=None, checkpoint=target.name,
                  detail=f"truncated {target.name} from {size} to {keep} bytes before attempt {fault['attempt']}")
    os.truncate(target, keep)


def run_job(cmd: Sequence[str], run_dir: Path, attempts: Sequence[Attempt], total_steps: int,
            dataset_size: int, global_batch: int, faults: Sequence[dict[str, Any]] = (),
            env: dict[str, str] | None = None) -> list[list[int]]:
    write_spec(run_dir, total_steps, dataset_size, global_batch, [a.world_size for a in attempts], faults)
    codes = []
    for n, attempt in enumerate(attempts):
        for fault in faults:
            if fault["kind"] == "corrupt" and fault.get("attempt", 1) == n:
                corrupt_newest(run_dir, fault)
        codes.append(run_attempt([*cmd, *attempt.args], run_dir, n, attempt.world_size, env))
        if all(c == 0 for c in codes[-1]):
            break
    steps = [e["step"] for e in iter_events(run_dir) if e["kind"] == "step"]
    status = "completed" if all(c == 0 for c in codes[-1]) else "failed"
    harness_event(run_dir, "end", status=status, final_step=max(steps, default=0))
    return codes


def judged(run_dir: Path, golden_dir: Path | None) -> Judgement:
    return judge(load_history(run_dir), load_history(golden_dir) if golden_dir is not None else None)


def python(script: str, *args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve().parent / script), *args]


# ----- what a run's own events show ------------------------------------------------------


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in iter_events(run_dir) if e["kind"] == kind]


def fired(run_dir: Path) -> list[str]:
    return [e["fault_id"] for e in events(run_dir, "fault")]


def ids_used_twice_in_an_epoch(run_dir: Path, total_steps: int) -> set[int]:
    """From the events alone: the lineage's batches (each attempt's updates after its restore),
    grouped by epoch, and the sample ids any epoch used more than once."""
    restores = {e["attempt"]: e["step"] for e in events(run_dir, "restore")}
    last_attempt = max(e["attempt"] for e in events(run_dir, "batch"))
    kept: dict[int, dict[int, list[int]]] = {}  # step -> rank -> ids (a later attempt overwrites)
    for e in sorted(events(run_dir, "batch"), key=lambda e: e["attempt"]):
        resumed_at = restores.get(e["attempt"], 0)
        until = restores.get(e["attempt"] + 1, total_steps) if e["attempt"] < last_attempt else total_steps
        if resumed_at < e["step"] <= until:
            kept.setdefault(e["step"], {})[e["rank"]] = (e["epoch"], e["samples"])
    per_epoch: dict[int, Counter[int]] = {}
    for ranks in kept.values():
        for epoch, samples in ranks.values():
            per_epoch.setdefault(epoch, Counter()).update(samples)
    return {i for counts in per_epoch.values() for i, n in counts.items() if n > 1}
