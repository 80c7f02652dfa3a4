"""Where a harness signal planned at step k lands in a `--cmd` script, over many runs.

    python -m trainwreck.benchmarks.signal_landing [--runs 20] [--step 8] [--cmd "python train.py ..."]

The harness fires a `signal` fault once a rank's progress board shows step k, and a probe
user waits at update k's start for it (trainer/probe.py `enter`), so the signal should land
at k every time, never an update or more later. Each run is a real `trainwreck run --cmd`
job (no golden run, no judging); the figure is read from the run's own `fault` event
("ranks were at steps {1: k}"). Prints one line per run and the tally.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.rundir.layout import iter_events

EXAMPLE = Path(__file__).resolve().parent.parent / "trainer" / "frameworks" / "examples" / "ddp_tutorial"
DEFAULT_CMD = f"{sys.executable} {EXAMPLE / 'multigpu_torchrun.py'} 4 1"


def landed_at(command: str, step: int, out: Path) -> int | None:
    """The step rank 1 was at when the harness's SIGKILL planned at `step` was sent (None: never fired)."""
    plan = [{"id": "k1", "kind": "signal", "signal": "SIGKILL", "rank": 1, "step": step}]
    run_job(JobSpec(target=Command(command), world_sizes=(2, 2), plan=plan, hang_timeout_s=30.0, run_dir=out,
                    keep=True))
    for event in iter_events(out, batches=False):
        if event.get("kind") == "fault" and event.get("fault_id") == "k1":
            found = re.search(r"ranks were at steps \{1: (\d+)\}", event.get("detail", ""))
            return int(found.group(1)) if found else None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--step", type=int, default=8)
    parser.add_argument("--cmd", default=DEFAULT_CMD, help="the --cmd script (default: the DDP tutorial example)")
    args = parser.parse_args(argv)
    tally: Counter[int | None] = Counter()
    scratch = Path(tempfile.mkdtemp(prefix="trainwreck-landing-"))
    try:
        for i in range(args.runs):
            at = landed_at(args.cmd, args.step, scratch / f"run{i}")
            tally[at] += 1
            print(f"run {i + 1}/{args.runs}: SIGKILL planned at step {args.step} landed at step {at}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    on_time = tally.get(args.step, 0)
    print(f"{on_time} of {args.runs} landed at step {args.step}; all: {dict(tally)}")
    return 0 if on_time == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
