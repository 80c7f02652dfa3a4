"""How fast the invariant checkers judge a big run: `python -m benchmarks.checker`.

Writes a synthetic, valid run directory of `steps` updates x `ranks` ranks
(batch and step events per rank per update, a save every 50 steps with
retention pruning, one killed rank and a restore halfway), then times
`load_history` + `judge` together in a fresh process (peak memory is the
checker's own), since reading the events is most of the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from trainwreck.invariants import FORMAT, judge, load_history
from trainwreck.rundir.layout import RunDir

SAVE_EVERY = 50
KEEP_LAST = 3
T0 = 1_700_000_000.0


def _digest(step: int) -> str:
    return f"{(step * 0x9E3779B97F4A7C15) % (1 << 64):016x}"


def _loss(step: int) -> str:
    return repr(2.5 / (1.0 + step * 1e-4))


def _epoch_ids(size: int, epoch: int) -> list[int]:
    """A cheap permutation of 0..size-1 that changes with the epoch."""
    a = 7919 if size % 7919 else 104729
    b = epoch * 31337
    return [(i * a + b) % size for i in range(size)]


def write_run(run_dir: str, steps: int, ranks: int, batch_per_rank: int, save_every: int = SAVE_EVERY) -> None:
    global_batch = ranks * batch_per_rank
    dataset_size = global_batch * 1000
    crash_at = steps // 2 + save_every // 2  # attempt 0 dies mid-way between saves
    resume_from = (crash_at // save_every) * save_every
    spec = {
        "format": FORMAT,
        "dataset_size": dataset_size,
        "global_batch": global_batch,
        "drop_last": True,
        "total_steps": steps,
        "hang_timeout_s": 10.0,
        "world_sizes": [ranks],
        "max_restarts": 3,
        "faults": [{"id": "k1", "kind": "kill", "rank": 1, "step": crash_at}],
    }
    paths = RunDir(run_dir)
    paths.events.mkdir(parents=True, exist_ok=True)
    with open(paths.run_json, "w") as f:
        json.dump(spec, f)
    harness = [
        {"kind": "exit", "t": T0 + crash_at * 0.01 + 0.5, "attempt": 0, "rank": 1, "code": -9},
        {"kind": "end", "t": T0 + steps * 0.01 + 60, "status": "completed", "final_step": steps},
    ]
    with open(paths.harness_events, "w") as f:
        f.writelines(json.dumps(ev) + "\n" for ev in harness)
    for attempt, first, last in ((0, 1, crash_at), (1, resume_from + 1, steps)):
        for rank in range(ranks):
            path = paths.rank_events(attempt, rank, 1000 + 100 * attempt + rank)
            with open(path, "w") as f:
                _write_rank(f, spec, attempt, rank, first, last, resume_from if attempt else 0, crash_at, save_every)


def _write_rank(f: Any, spec: dict[str, Any], attempt: int, rank: int, first: int, last: int, restored: int,
                crash_at: int, save_every: int) -> None:
    ranks = spec["world_sizes"][0]
    size, gb = spec["dataset_size"], spec["global_batch"]
    per_rank = gb // ranks
    steps_per_epoch = size // gb
    head = f'"attempt": {attempt}, "rank": {rank}, "world_size": {ranks}'
    t = T0 + first * 0.01 + attempt * 60
    out = [f'{{"kind": "start", "t": {t}, {head}, "pid": {1000 + rank}}}\n']
    if restored:
        out.append(f'{{"kind": "restore", "t": {t}, {head}, "step": {restored}, "checkpoint": "step-{restored:08d}", "digest": "{_digest(restored)}"}}\n')
    epoch, ids = -1, []
    for step in range(first, last + 1):
        e = (step - 1) // steps_per_epoch
        if e != epoch:
            epoch, ids = e, _epoch_ids(size, e)
        lo = ((step - 1) % steps_per_epoch) * gb + rank * per_rank
        t = T0 + step * 0.01 + attempt * 60
        if attempt == 0 and step == crash_at:
            if rank == 1:
                out.append(f'{{"kind": "fault", "t": {t}, {head}, "fault_id": "k1", "detail": "SIGKILL before update {step}"}}\n')
            break
        out.append(f'{{"kind": "batch", "t": {t}, {head}, "step": {step}, "epoch": {e}, "samples": {ids[lo:lo + per_rank]}}}\n')
        out.append(f'{{"kind": "step", "t": {t + 0.005}, {head}, "step": {step}, "loss": {_loss(step)}, "digest": "{_digest(step)}"}}\n')
        if rank == 0 and step % save_every == 0:
            out.append(f'{{"kind": "save", "t": {t + 0.006}, {head}, "step": {step}, "checkpoint": "step-{step:08d}", "digest": "{_digest(step)}"}}\n')
            old = step - KEEP_LAST * save_every
            if old > 0:
                out.append(f'{{"kind": "prune", "t": {t + 0.007}, {head}, "checkpoint": "step-{old:08d}"}}\n')
        if len(out) > 20_000:
            f.writelines(out)
            out.clear()
    f.writelines(out)


def judge_dir(run_dir: str) -> dict[str, Any]:
    """Load and judge one run directory, timed; run in a fresh process by
    `bench_checker` so that peak memory is the checker's own."""
    started, cpu = time.perf_counter(), _cpu()
    history = load_history(run_dir)
    judgement = judge(history)
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    if judgement.valid is not True:
        bad = {n: v.summary for n, v in judgement.verdicts.items() if v.valid is not True}
        raise RuntimeError(f"the synthetic run should be valid, got {judgement.valid}: {bad}")
    events = history.event_count
    return {
        "checker_events": events,
        "checker_seconds": round(seconds, 3),
        "checker_events_per_s": round(events / seconds),
        # Six people share these 2 cores: wall time includes waiting for a core,
        # CPU time does not; both are reported so that a reader can tell which bounds.
        "checker_cpu_seconds": round(cpu, 3),
        "checker_events_per_cpu_s": round(events / cpu),
        # The checker's own process, and the largest of the workers that parse files in
        # parallel (invariants/loader.py) - they run side by side, so both count.
        "checker_peak_rss_mb": peak_rss_mb(),
        "checker_worker_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
    }


def peak_rss_mb() -> int:
    """This process's peak resident memory: VmHWM, where Linux gives it. Not ru_maxrss: a process
    started by fork and exec keeps its parent's peak in it, so the benchmark's parent, torch
    imported, set the checker's figure (an empty child of a 300 MB parent read 313 MB; VmHWM 14)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the parsing workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_checker(steps: int = 100_000, ranks: int = 8, batch_per_rank: int = 4,
                  save_every: int = SAVE_EVERY) -> dict[str, Any]:
    """Write a synthetic valid run, judge it in a fresh process, report events judged per second."""
    with tempfile.TemporaryDirectory(prefix="trainwreck-bench-") as tmp:
        write_run(tmp, steps, ranks, batch_per_rank, save_every)
        done = subprocess.run([sys.executable, "-m", "trainwreck.benchmarks.checker", "--judge", tmp],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the checker benchmark failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def bench_checker_16m(steps: int = 1_000_000, ranks: int = 8, batch_per_rank: int = 4) -> dict[str, Any]:
    """Peak memory judging ten times the benchmark history (16 M events): the checker
    holds compact columns, not an object per event (docs/INVARIANTS.md, "Reading")."""
    result = bench_checker(steps, ranks, batch_per_rank)
    return {"checker_events_16m": result["checker_events"],
            "checker_peak_rss_mb_16m": result["checker_peak_rss_mb"],
            "checker_worker_peak_rss_mb_16m": result["checker_worker_peak_rss_mb"],
            "checker_events_per_cpu_s_16m": result["checker_events_per_cpu_s"]}


RARE_SAVES = 5_000
"""A save every 5 000 updates: the sparse events (kept as dicts) no longer grow with the run."""


def bench_checker_bounded(steps: int = 1_000_000, ranks: int = 8, batch_per_rank: int = 4) -> dict[str, Any]:
    """Peak memory judging `steps` and twice as many updates (16 M and 32 M events by default), the
    columns on disk (invariants/spill.py), a save every RARE_SAVES updates: what is left in memory
    grows with the sparse events, not with the batch and step events, so doubling the run should
    leave the peak where it was."""
    small = bench_checker(steps, ranks, batch_per_rank, RARE_SAVES)
    large = bench_checker(2 * steps, ranks, batch_per_rank, RARE_SAVES)
    return {"checker_bounded_events": [small["checker_events"], large["checker_events"]],
            "checker_bounded_peak_rss_mb": [small["checker_peak_rss_mb"], large["checker_peak_rss_mb"]],
            "checker_rss_growth_doubled": round(large["checker_peak_rss_mb"] / small["checker_peak_rss_mb"], 3),
            "checker_bounded_events_per_s": [small["checker_events_per_s"], large["checker_events_per_s"]]}


def report_dir(run_dir: str) -> dict[str, Any]:
    """`trainwreck report RUN_DIR` in this process (a fresh one, from `bench_report`), its own peak
    memory and its parsing workers' with it."""
    from trainwreck.harness.cli import main as cli

    started = time.perf_counter()
    code = cli(["report", run_dir])
    if code != 0:
        raise RuntimeError(f"trainwreck report exited {code}")
    return {"seconds_in_process": round(time.perf_counter() - started, 3), "peak_rss_mb": peak_rss_mb(),
            "worker_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
            "html_mb": round(os.path.getsize(os.path.join(run_dir, "report", "report.html")) / 2**20, 2)}


def bench_report(steps: int = 100_000, ranks: int = 8, batch_per_rank: int = 4, suffix: str = "1_6m") -> dict[str, Any]:
    """Write the checker benchmark's run and time `trainwreck report` of it in a fresh process, start-up
    and imports included (what a user waits for), with its peak memory and the HTML's size."""
    with tempfile.TemporaryDirectory(prefix="trainwreck-bench-") as tmp:
        write_run(tmp, steps, ranks, batch_per_rank)
        started, cpu = time.perf_counter(), _children_cpu()
        done = subprocess.run([sys.executable, "-m", "trainwreck.benchmarks.checker", "--report", tmp],
                              capture_output=True, text=True, check=False)
        seconds, cpu = time.perf_counter() - started, _children_cpu() - cpu
        events = sum(1 for name in os.listdir(os.path.join(tmp, "events"))
                     for _ in open(os.path.join(tmp, "events", name), "rb"))
    if done.returncode != 0:
        raise RuntimeError(f"the report benchmark failed: {done.stderr.strip()[-2000:]}")
    inner = json.loads(done.stdout.strip().splitlines()[-1])
    return {f"report_events_{suffix}": events, f"report_s_{suffix}": round(seconds, 3),
            f"report_cpu_s_{suffix}": round(cpu, 3), f"report_peak_rss_mb_{suffix}": inner["peak_rss_mb"],
            f"report_worker_peak_rss_mb_{suffix}": inner["worker_peak_rss_mb"],
            f"report_html_mb_{suffix}": inner["html_mb"]}


def _children_cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checker", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch-per-rank", type=int, default=4)
    parser.add_argument("--judge", metavar="RUN_DIR", help="judge this run directory only (used by bench_checker)")
    parser.add_argument("--report", metavar="RUN_DIR", help="report this run directory only (used by bench_report)")
    args = parser.parse_args(argv)
    if args.report:
        result = report_dir(args.report)
    else:
        result = judge_dir(args.judge) if args.judge else bench_checker(args.steps, args.ranks, args.batch_per_rank)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
