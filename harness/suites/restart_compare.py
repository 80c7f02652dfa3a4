"""Rank restart or full-job restart? The same torchft job, the same kill, both restart scopes.

    python -m trainwreck.harness.suites.restart_compare --out DIR [--json]

Two replica-group jobs of trainer/frameworks/torchft_train.py (two groups of one rank, a tiny
MLP, a checkpoint every `SAVE_EVERY` updates, resuming from the newest intact one at start),
each with group 1 SIGKILLed at the start of update `KILL_AT`:

- **group**: torchft's answer: group 1 restarts alone and heals from group 0, which trains on;
- **job**: the answer every other supervisor in trainwreck gives: both groups are stopped and
  restarted together, from the newest checkpoint.

Each is judged (invariants/replica_groups.py) and measured from its own events: updates done
twice (lost work), seconds from the kill until the job committed an update beyond the last
one committed before it (recovery), the survivors' longest pause and the updates they
trained alone, ids replayed/dropped/never seen, wall time. `comparison_markdown` renders the
table a handbook chapter quotes; every number in it comes from the two runs.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.harness.supervise.spec import ReplicaGroups
from trainwreck.harness.suites.torchft_rows import GROUP_RESTARTS, HANG_TIMEOUT_S, HEARTBEAT_S, SCRIPT, \
    judge_replica_run

STEPS, STEP_SECONDS, SAVE_EVERY, KILL_AT = 80, 0.2, 10, 27
"""Configured: 80 updates of 0.2 s stand-in compute, a checkpoint every 10, the kill before update 27
(7 updates after the last checkpoint, which a whole-job restart redoes)."""
SCOPES = ("group", "job")


@dataclass(frozen=True)
class ScopeResult:
    scope: str
    valid: Any
    figures: dict[str, Any]
    run_dir: str


def job_for(scope: str, run_dir: Path, python: str) -> JobSpec:
    """Two groups of one rank, group 1 killed before update KILL_AT, restarted with `scope`."""
    command = shlex.join([python, "-m", SCRIPT, "--steps", str(STEPS), "--step-seconds", str(STEP_SECONDS),
                          "--save-every", str(SAVE_EVERY), "--resume"])
    plan = [{"id": "kill-group-1", "kind": "kill", "rank": 1, "step": KILL_AT}]
    return JobSpec(target=ReplicaGroups(command, restart=scope, heartbeat_timeout_s=HEARTBEAT_S), world_sizes=(2,),
                   plan=plan, run_dir=run_dir, hang_timeout_s=HANG_TIMEOUT_S, max_restarts=GROUP_RESTARTS,
                   scenario={"name": f"restart scope: {scope}", "summary": f"group 1 killed before update {KILL_AT}"})


def measure(run_dir: Path) -> dict[str, Any]:
    """The comparison's figures, from the run's own events."""
    from trainwreck.invariants.replica_groups import load_replica_run

    run = load_replica_run(run_dir)
    fault_t = min(float(e["t"]) for e in run.of("fault"))
    steps = run.of("step")
    before = max((int(e["step"]) for e in steps if float(e["t"]) <= fault_t), default=0)
    beyond = [float(e["t"]) for e in steps if float(e["t"]) > fault_t and int(e["step"]) > before]
    per_group = Counter((run.group_of(e), int(e["step"])) for e in steps)
    redone = sorted({step for (_, step), n in per_group.items() if n > 1})
    times = [float(e["t"]) for e in run.events]
    return {"last_step_before_kill": before, "updates_redone": len(redone),
            "recovery_s": round(min(beyond) - fault_t, 2) if beyond else None, "wall_s": round(max(times) - min(times), 1),
            "restored_from": [e.get("step") for e in run.of("restore")][:1]}


def compare(out_dir: Path, python: str = sys.executable) -> list[ScopeResult]:
    results = []
    for scope in SCOPES:
        run_dir = out_dir / f"restart-{scope}"
        run_job(job_for(scope, run_dir, python))
        judgement, figures = judge_replica_run(run_dir)
        results.append(ScopeResult(scope, judgement.valid, {**measure(run_dir), **figures}, str(run_dir)))
    return results


ROWS = (("updates done twice (lost work)", "updates_redone"), ("recovery: kill to the next new update, s", "recovery_s"),
        ("survivor's longest pause, s", "stall_s"), ("updates the survivor trained alone", "steps_alone"),
        ("heals from a live peer", "heals"), ("ids replayed", "replayed"), ("ids dropped", "dropped"),
        ("ids never seen", "never_seen"), ("wall time of the job, s", "wall_s"))


def comparison_markdown(results: list[ScopeResult]) -> str:
    head = "| measured | " + " | ".join(f"{r.scope} restart" for r in results) + " |"
    lines = [head, "|---|" + "---|" * len(results)]
    for label, key in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(r.figures.get(key)) for r in results) + " |")
    lines.append("| verdict | " + " | ".join(_cell(r.valid) for r in results) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value) or "-"
    if value is True:
        return "VALID"
    if value is False:
        return "INVALID"
    return "-" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="rank (group) restart vs full-job restart, same job, same kill")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--python", default=sys.executable, help="the interpreter whose torchft the ranks import")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = compare(args.out, args.python)
    if args.json:
        print(json.dumps([{"scope": r.scope, "valid": r.valid, "figures": r.figures, "run_dir": r.run_dir}
                          for r in results], indent=1))
    else:
        print(f"configured: {STEPS} updates, {STEP_SECONDS} s each, checkpoint every {SAVE_EVERY}, "
              f"group 1 killed before update {KILL_AT}, heartbeat timeout {HEARTBEAT_S} s\n")
        print(comparison_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
