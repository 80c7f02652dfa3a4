"""Scenario throughput and hang-detection latency, on the warm launcher with a cached golden run.

Throughput: kill-and-resume scenarios per minute, and the ratio of a scenario's wall
time to the training compute inside it (the sum of rank 0's step phases), i.e. what
the harness, restarts and judging cost on top of the training itself. A scenario is
measured alone (`scenario_wall_s`, `scenarios_per_min_single`), and `scenarios_per_min`
counts scenarios finished per minute of wall with `scenarios_concurrency` of them side by
side: that many harness processes, each with its own fork server, as `pytest -n N` runs a
suite. Each harness warms up before it is measured (`warm_up`): its golden run, its fork
server's start and the server's one move of its heap onto huge pages, costs paid once however
many scenarios follow. Much of one scenario is waiting (fsyncs, a rank waiting for its peer, process
start and exit), which another scenario's ranks can use.

Hang latency: inject a SIGSTOP hang N times and measure fault → `hang` event,
against the configured timeout; beside it, what gloo does alone: its default
collective timeout (read from torch) and that its timeout error names no rank.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from trainwreck.harness.judge.runner import run_judged, spec_for
from trainwreck.harness.launch.launchers import fork_server
from trainwreck.harness.supervise.scenarios import Scenario, get_scenario
from trainwreck.trainer.config import backend_fields
from trainwreck.rundir.layout import iter_events
from trainwreck.invariants import load_history


SIDE_BY_SIDE = 2
"""Scenarios run side by side for `scenarios_per_min`: the 2 cores the targets are stated on."""


def cpu_scenario(name: str) -> Scenario:
    """A built-in scenario on gloo and the CPU: the figures' targets are stated for CPU ranks, and
    on a GPU host the scenario's `auto` device would move a world-size-1 job onto the GPU."""
    scenario = get_scenario(name)
    return replace(scenario, config={**scenario.config, **backend_fields("gloo")})


RUNNER_STEPS = {"golden": "golden_for", "job": "run_job", "root_cause": "_root_cause", "publish": "publish"}
"""run_judged's steps timed by `timed_runner` (harness/judge/runner.py names); the judgement is the rest."""
HARNESS_KINDS = ("attempt", "exit", "end")
HARNESS_PARTS = ("golden", "fork", "between", "job_other", "judge", "root_cause", "publish")
"""The parts of `scenario_split` that are the harness's own work, not the training ranks': the golden
run's lookup, forking, between attempts, the run directory, judging, the crash's cause, the report."""


@contextmanager
def timed_runner() -> Iterator[dict[str, float]]:
    """Seconds spent in each of run_judged's steps while the block runs, summed over its calls: the
    runner's module functions are wrapped for the block's duration (a measurement, never the suite)."""
    from trainwreck.harness.judge import runner

    seconds = dict.fromkeys(RUNNER_STEPS, 0.0)
    real = {step: getattr(runner, name) for step, name in RUNNER_STEPS.items()}

    def timed(step: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return real[step](*args, **kwargs)
            finally:
                seconds[step] += time.perf_counter() - started
        return call

    try:
        for step, name in RUNNER_STEPS.items():
            setattr(runner, name, timed(step))
        yield seconds
    finally:
        for step, name in RUNNER_STEPS.items():
            setattr(runner, name, real[step])


def job_split(run_dir: Path) -> dict[str, float]:
    """Where a job's wall went, from its own events (every `t` is the same wall clock): per attempt,
    the harness's `attempt` to rank 0's `start` (the fork), to its first `batch` (process group, model,
    restore), to its last `step` (split by rank 0's step phases into compute, saves and the rest), to
    the attempt's last `exit` (teardown); between attempts, the last `exit` to the next `attempt`
    (detecting the death, stopping the survivors, choosing the restore). Seconds, summed."""
    events = list(iter_events(run_dir))
    harness = [e for e in events if e.get("kind") in HARNESS_KINDS]
    split = dict.fromkeys(("fork", "setup", "compute", "saves", "steps_other", "teardown", "between"), 0.0)
    starts = sorted((e["attempt"], e["t"]) for e in harness if e["kind"] == "attempt")
    previous_exit = None
    for attempt, t_attempt in starts:
        mine = [e for e in events if e.get("attempt") == attempt and e.get("rank") == 0 and e.get("kind") != "exit"]
        first = {k: min((e["t"] for e in mine if e["kind"] == k), default=None) for k in ("start", "batch")}
        steps = [e for e in mine if e["kind"] == "step"]
        exits = [e["t"] for e in harness if e["kind"] == "exit" and e.get("attempt") == attempt]
        if first["start"] is None or first["batch"] is None or not steps or not exits:
            raise RuntimeError(f"attempt {attempt} of {run_dir} lacks a start, batch, step or exit event")
        phases = [e.get("phases", {}) for e in steps]
        saves = sum(p.get("checkpoint", 0.0) for p in phases)
        compute = sum(sum(p.values()) for p in phases) - saves
        last_step = max(e["t"] for e in steps)
        if previous_exit is not None:
            split["between"] += t_attempt - previous_exit
        split["fork"] += first["start"] - t_attempt
        split["setup"] += first["batch"] - first["start"]
        split["compute"] += compute
        split["saves"] += saves
        split["steps_other"] += last_step - first["batch"] - compute - saves
        previous_exit = max(exits)
        split["teardown"] += previous_exit - last_step
    return split


WARM_UP_MAX = 8
"""At most this many scenarios warm a harness up. A kill-and-resume scenario forks 4 ranks, so its
fork server settles in the fifth (COLLAPSE_AFTER_FORKS / 4 + 1); one that never does (a rank
alive at every start) is measured as it is."""


def warm_up(scenario: Scenario, out: Path) -> int:
    """Scenarios run unmeasured before a harness is timed: the first builds the golden run and
    starts the fork server; more follow until the server has moved its heap onto huge pages, or
    said the kernel refused (harness/launch/forkserver.py `Server.settle`, once it has forked
    COLLAPSE_AFTER_FORKS ranks). How many ran."""
    for count in range(1, WARM_UP_MAX + 1):
        run_judged(spec_for(scenario, out / f"warmup{count}"), scenario.name)
        if fork_server().huge_bytes is not None:
            break
    return count


def run_scenarios(out: Path, runs: int) -> tuple[list[float], list[float], list[dict[str, float]]]:
    """`runs` kill-resume scenarios one after another in this process (after an unmeasured one that
    builds the golden run and the fork server): each one's wall seconds, wall/compute ratio and
    `scenario_split`. Raises unless every scenario was judged valid."""
    scenario = cpu_scenario("kill-resume")
    walls, ratios, splits = [], [], []
    warm_up(scenario, out)
    for i in range(runs):
        with timed_runner() as steps:
            started = time.perf_counter()
            judged = run_judged(spec_for(scenario, out / f"run{i}"), scenario.name)
            wall = time.perf_counter() - started
        if judged.judgement.valid is not True:
            raise RuntimeError(f"kill-resume was not valid in run {i}: {judged.record.run_dir}")
        job = job_split(judged.record.run_dir)  # the run's events, read once for both figures
        walls.append(wall)
        # The training's own time: rank 0's step phases over every attempt (redo work is compute too).
        ratios.append(wall / (job["compute"] + job["saves"]))
        splits.append(scenario_split(wall, steps, job))
    return walls, ratios, splits


def scenario_split(wall: float, steps: dict[str, float], job: dict[str, float]) -> dict[str, float]:
    """One scenario's wall in parts that add up to it: the runner's steps, the job's parts from its
    events, `job_other` the job's time outside its attempts (the run directory, the end event) and
    `judge` what run_judged did besides its timed steps (the invariants against the golden run)."""
    parts = {"golden": steps["golden"], **job, "job_other": steps["job"] - sum(job.values()),
             "judge": wall - sum(steps.values()), "root_cause": steps["root_cause"], "publish": steps["publish"]}
    return {name: round(seconds, 4) for name, seconds in parts.items()}


def bench_throughput(runs: int = 5, concurrency: int = SIDE_BY_SIDE) -> dict[str, Any]:
    """Scenarios alone (median wall of `runs`), then `concurrency` harness processes side by side,
    `runs` scenarios each: finished scenarios per minute of the wall from the common start to the last."""
    with tempfile.TemporaryDirectory(prefix="tw-throughput-") as tmp:
        walls, ratios, splits = run_scenarios(Path(tmp), runs)
        huge = fork_server().huge_bytes  # the scenarios' server: how much of its heap is on huge pages
        side_by_side_s = _side_by_side(Path(tmp), concurrency, runs) if concurrency > 1 else sum(walls)
    return {"scenarios_per_min": round(60.0 * concurrency * runs / side_by_side_s, 1),
            "scenarios_concurrency": concurrency,
            "scenarios_per_min_single": round(60.0 / statistics.median(walls), 1),
            "scenario_wall_s": round(statistics.median(walls), 3),
            "scenario_wall_to_compute_ratio": round(statistics.median(ratios), 1),
            "fork_server_huge_mb": None if huge is None else round(huge / (1 << 20)),  # harness/launch/pages.py
            # each part's median over the scenarios alone (so the parts need not add up to the median wall)
            "scenario_split_s": {name: round(statistics.median(s[name] for s in splits), 3) for name in splits[0]}}


def _side_by_side(out: Path, workers: int, runs: int) -> float:
    """Seconds from the moment `workers` warmed-up harness processes are told to go until the
    last of them has finished its `runs` scenarios (each judged valid, or this raises).
    Fresh interpreters, not forks of this process (whose threads may hold locks) and not
    multiprocessing's spawn (which leaves a resource-tracker process behind)."""
    procs = [subprocess.Popen([sys.executable, "-m", "trainwreck.benchmarks.scenarios", "--worker",
                               "--runs", str(runs), "--out", str(out / f"worker{i}")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(workers)]
    try:
        for proc in procs:
            _expect(proc, "ready")
        started = time.perf_counter()
        for proc in procs:
            proc.stdin.write("go\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        for proc in procs:
            _expect(proc, "done")
        return time.perf_counter() - started
    except BaseException:
        for proc in procs:
            proc.kill()  # its fork server and ranks follow it (parent-death signals)
        raise
    finally:
        for proc in procs:
            proc.stdin.close()  # type: ignore[union-attr]  # a worker still waiting for "go" ends
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _expect(proc: subprocess.Popen[str], word: str) -> None:
    line = proc.stdout.readline().strip()  # type: ignore[union-attr]
    if line != word:
        raise RuntimeError(f"a side-by-side scenario worker said {line!r} instead of {word!r}; "
                           "its stderr above says why")


def _worker(out: Path, runs: int) -> None:
    """One side-by-side harness: warm up, say ready, wait for go, run, say done. The protocol owns
    stdout; everything else this process (and its fork server) prints goes to stderr."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    scenario = cpu_scenario("kill-resume")
    warm_up(scenario, out)
    print("ready", file=protocol, flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    for i in range(runs):
        judged = run_judged(spec_for(scenario, out / f"run{i}"), scenario.name)
        if judged.judgement.valid is not True:
            raise RuntimeError(f"kill-resume was not valid in run {i}: {judged.record.run_dir}")
    print("done", file=protocol, flush=True)


def hang_latencies(hangs: int, timeout_s: float, world_size: int | None = None,
                   out: Path | None = None, scenario: Scenario | None = None) -> tuple[list[float], list[str]]:
    """Fault-to-`hang`-event seconds of `hangs` hang-detect runs (world_size None: the scenario's own),
    and a line per run the invariants did not pass (reported, not hidden: the latency still counts).
    The runs go to out/hang<i> when `out` is given, else to a directory removed afterwards."""
    scenario = scenario or cpu_scenario("hang-detect")
    latencies, invalid = [], []
    with tempfile.TemporaryDirectory(prefix="tw-hang-") as tmp:
        for i in range(hangs):
            spec = replace(spec_for(scenario, Path(out or tmp) / f"hang{i}"), hang_timeout_s=timeout_s)
            if world_size is not None:
                spec = replace(spec, world_sizes=(world_size,))
            judged = run_judged(spec, scenario.name)
            if judged.judgement.valid is not True:
                bad = {n: v.summary for n, v in judged.judgement.verdicts.items() if v.valid is not True}
                invalid.append(f"run {i}: {bad}")
            latencies.append(_hang_latency(judged.record.run_dir))
    return latencies, invalid


def bench_hang_16(hangs: int = 3, timeout_s: float = 1.0) -> dict[str, Any]:
    """The worst hang latency with 16 ranks on this machine."""
    latencies, invalid = hang_latencies(hangs, timeout_s, world_size=16)
    return {"hang_latency_max_s_16": round(max(latencies), 3),
            "hang_latency_median_s_16": round(statistics.median(latencies), 3), "hang_runs_16": hangs,
            "hang_invalid_runs_16": invalid}


def bench_hang(hangs: int = 20, timeout_s: float = 1.0) -> dict[str, Any]:
    from torch.distributed import constants

    latencies, invalid = hang_latencies(hangs, timeout_s)
    return {
        "hang_invalid_runs": invalid,
        "hang_timeout_s": timeout_s,
        "hang_latency_min_s": round(min(latencies), 3),
        "hang_latency_median_s": round(statistics.median(latencies), 3),
        "hang_latency_max_s": round(max(latencies), 3),
        "hang_runs": hangs,
        "gloo_default_timeout_s": constants.default_pg_timeout.total_seconds(),
        **gloo_alone(),
    }


def _gloo_rank(rank: int, port: int, timeout_s: float, queue: Any) -> None:
    import datetime
    import os
    import signal

    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=timeout_s))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # the hung rank never joins the collective
    started = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1))
        queue.put((time.perf_counter() - started, "no error"))
    except Exception as exc:  # noqa: BLE001  the point is to read what gloo says
        queue.put((time.perf_counter() - started, str(exc)))


def gloo_alone(timeout_s: float = 3.0) -> dict[str, Any]:
    """What plain gloo does about a hung peer: when the survivor fails, and whether it says who hung."""
    import multiprocessing
    import os
    import re
    import signal

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    ranks = [fork.Process(target=_gloo_rank, args=(r, store.port, timeout_s, queue)) for r in (0, 1)]
    for proc in ranks:
        proc.start()
    try:
        seconds, message = queue.get(timeout=timeout_s * 10)
    finally:
        for proc in ranks:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
            proc.join()
    return {"gloo_probe_timeout_s": timeout_s, "gloo_error_after_s": round(seconds, 3),
            "gloo_names_rank": bool(re.search(r"\brank\D{0,3}1\b", message, re.IGNORECASE)),
            "gloo_error": message.splitlines()[0][:200] if message else ""}


def _hang_latency(run_dir: Path) -> float:
    history = load_history(run_dir)
    fault = next(e for e in history.events if e.get("kind") == "fault")
    hang = next(e for e in history.events if e.get("kind") == "hang")
    if fault.get("rank") not in hang.get("ranks", []):
        raise RuntimeError(f"the hang in {run_dir} did not name rank {fault.get('rank')}")
    return float(hang["t"]) - float(fault["t"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.scenarios", description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="internal: one side-by-side harness of bench_throughput")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.out, args.runs)
    else:
        print(json.dumps({**bench_throughput(args.runs), **bench_hang(3)}, indent=1))


if __name__ == "__main__":
    main()
