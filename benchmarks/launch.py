"""Launch latency: from an attempt's start until every rank is at update 1.

Measured by the supervisor itself (RunRecord.launch_s): the clock starts just before
the launcher is asked for the attempt, and stops at the newest of the ranks' own
progress-board timestamps the first time all of them show step >= 1. The warm
launcher is measured with its fork server already up (that is the point of it: one
server per harness process, reused by every attempt and every run).

    python -m benchmarks.launch [--ranks 2,4] [--launchers warm,spawn,torchrun] [--repeats 1]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable
from unittest import mock

from trainwreck.harness.supervise import supervisor
from trainwreck.harness.supervise.watchdog import Hang, Watchdog

from trainwreck.harness.launch.launchers import fork_server
from trainwreck.harness.launch.procs import child_env
from trainwreck.harness.registry import CMD, CMD_WARM, DEFAULT_LAUNCHER, REFERENCE, TORCHRUN, WARM, get_launcher, \
    launcher_names
from trainwreck.harness.supervise.command.target import Command
from trainwreck.rundir.layout import iter_events
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.trainer.config import TrainConfig, backend_fields

CPU = backend_fields("gloo")
"""Launch figures are CPU figures on a GPU host too (a world-size-1 `auto` job would take the GPU)."""


def launch_once(launcher: str, world_size: int) -> float:
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=2, **CPU), world_sizes=(world_size,),
                             launcher=launcher, hang_timeout_s=120.0))
    if record.outcome != "completed" or not record.launch_s or record.launch_s[0] is None:
        raise RuntimeError(f"{launcher} with {world_size} ranks did not complete: {record}")
    return record.launch_s[0]


def bench_launch(ranks: tuple[int, ...] = (2, 4), launchers: tuple[str, ...] = launcher_names(REFERENCE),
                 repeats: int = 1, skip: frozenset[tuple[str, int]] = frozenset()) -> dict[str, float]:
    """Median seconds from attempt start to all ranks at step 1, keyed launch_{launcher}_s_{ranks};
    `skip` leaves out (launcher, ranks) pairs not worth their time (spawn at 16 ranks in --quick)."""
    out: dict[str, float] = {}
    forked = [name for name in launchers if get_launcher(name).fork_server]
    if forked:
        out["warm_server_ready_s"] = round(fork_server().import_s, 3)  # paid once per harness process
        launch_once(forked[0], min(ranks))  # first fork also faults in the server's pages
    for launcher in launchers:
        for n in ranks:
            if (launcher, n) in skip:
                continue
            times = [launch_once(launcher, n) for _ in range(repeats)]
            out[f"launch_{launcher}_s_{n}"] = round(statistics.median(times), 4)
    for n in ranks:
        warm, torchrun = out.get(f"launch_{WARM}_s_{n}"), out.get(f"launch_{TORCHRUN}_s_{n}")
        if warm and torchrun:
            out[f"torchrun_over_warm_{n}"] = round(torchrun / warm, 1)
    return out


class _TimedWatchdog(Watchdog):
    """The reference watchdog, adding up the CPU its own thread spends in it."""

    cpu_s = 0.0

    def observe(self) -> dict[int, Any]:
        started = time.thread_time()
        try:
            return super().observe()
        finally:
            _TimedWatchdog.cpu_s += time.thread_time() - started

    def check(self, live: Iterable[int]) -> Hang | None:
        started = time.thread_time()
        try:
            return super().check(live)
        finally:
            _TimedWatchdog.cpu_s += time.thread_time() - started


def bench_watchdog_cpu(world_size: int = 16, total_steps: int = 40) -> dict[str, float]:
    """The watchdog's own CPU (reading every board and judging silence, in the
    harness process) per rank, as a percentage of one core over the job's wall time."""
    _TimedWatchdog.cpu_s = 0.0
    with mock.patch.object(supervisor, "watchdog_class", lambda name: _TimedWatchdog):
        started = time.perf_counter()
        record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=total_steps, **CPU), world_sizes=(world_size,),
                                 launcher=DEFAULT_LAUNCHER, hang_timeout_s=120.0))
        wall = time.perf_counter() - started
    if record.outcome != "completed":
        raise RuntimeError(f"the watchdog CPU run did not complete: {record}")
    return {"watchdog_cpu_pct_per_rank": round(100.0 * _TimedWatchdog.cpu_s / wall / world_size, 3),
            f"watchdog_cpu_s_{world_size}": round(_TimedWatchdog.cpu_s, 3)}


KILL_AT_8 = [{"id": "k1", "kind": "signal", "signal": "SIGKILL", "rank": 1, "step": 8}]
"""The --cmd kill-and-resume: rank 1 dies at update 8 of 60, both ranks restart from the step-6 checkpoint."""
CMD_HANG_S = 120.0
"""The watchdog of those jobs: at load 9 on 2 cores a cold attempt went 30 s (--cmd's default) without
progress and was declared hung; the benchmark times starts, not the watchdog."""


def cmd_kill_resume_s(launcher: str, out: Path) -> float:
    """Wall seconds of one 2-rank `--cmd` kill-and-resume of plain_ddp.py (two attempts of two ranks),
    the job alone (its golden run is cached in practice); checked to have run as `launcher` starts ranks."""
    from trainwreck.trainer.frameworks import EXAMPLES

    spec = JobSpec(target=Command(f"{sys.executable} {EXAMPLES / 'plain_ddp.py'} --total-steps 60"), world_sizes=(2,),
                   plan=[dict(f) for f in KILL_AT_8], hang_timeout_s=CMD_HANG_S, launcher=launcher, run_dir=out, keep=True)
    started = time.perf_counter()
    record = run_job(spec)
    wall = time.perf_counter() - started
    starts = [e.get("ranks") for e in iter_events(out, batches=False) if e["kind"] == "attempt"]
    shutil.rmtree(out, ignore_errors=True)
    if record.outcome != "completed" or record.attempts != 2 or (launcher == CMD_WARM and starts != ["forked"] * 2):
        raise RuntimeError(f"--cmd kill-and-resume with {launcher} did not run as planned ({starts}): {record}")
    return wall


def bench_cmd(repeats: int = 1) -> dict[str, float]:
    """`--cmd` kill-and-resume, cold (launcher cmd: fresh interpreters) against warm (cmd-warm, its
    command server already up, as the reference's fork server is measured above: one server per
    harness process, reused by every attempt and every job with the same imports; its start is
    cmd_server_ready_s, paid once)."""
    from trainwreck.harness.supervise.command.warm import WarmPlan, command_server, warm_modules
    from trainwreck.trainer.frameworks import EXAMPLES

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cmd-") as tmp:
        env = child_env()
        plan = WarmPlan(warm_modules(f"{sys.executable} {EXAMPLES / 'plain_ddp.py'}", Path.cwd(), env), env)
        started = time.perf_counter()
        out["cmd_server_ready_s"] = round(command_server(plan).import_s, 3)
        # The first job also faults in the server's pages: what one lone `trainwreck run --cmd` pays.
        cmd_kill_resume_s(CMD_WARM, Path(tmp) / "first")
        out["cmd_kill_resume_first_warm_s"] = round(time.perf_counter() - started, 3)
        for launcher in (CMD_WARM, CMD):
            walls = [cmd_kill_resume_s(launcher, Path(tmp) / f"{launcher}-{i}") for i in range(repeats)]
            out[f"cmd_kill_resume_{launcher.replace('-', '_')}_s"] = round(statistics.median(walls), 3)
    out["cmd_warm_speedup"] = round(out[f"cmd_kill_resume_{CMD}_s"] / out["cmd_kill_resume_cmd_warm_s"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4", help="comma-separated world sizes")
    parser.add_argument("--launchers", default=",".join(launcher_names(REFERENCE)))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    result = bench_launch(tuple(int(r) for r in args.ranks.split(",")), tuple(args.launchers.split(",")),
                          args.repeats)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
