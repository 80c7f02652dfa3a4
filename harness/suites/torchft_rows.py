"""torchft's rows of `trainwreck frameworks`: replica-group recovery judged and measured.

    rows = torchft_rows(out_dir)                      # every scenario, this interpreter's torchft
    python -m trainwreck.harness.suites.torchft_rows --python .venv-nightly/bin/python --out DIR   # another torchft

Each row is a real replica-group job (a JobSpec of a `ReplicaGroups` target, run by the "replica-groups"
launcher, harness/supervise/replicas.py: a loopback lighthouse, one store per
group incarnation, a group restarted alone) of the example trainer
trainer/frameworks/torchft_train.py, judged by `judge` (which picks the replica-aware checkers
from run.json's `replica_groups`), with the figures the judge measured: the survivors'
longest pause and the steps they trained alone after each loss, the ids replayed, dropped and
never seen, the heals. Where a row's torchft is missing, the row is "unknown" with the
install command.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.harness.supervise.spec import LIGHTHOUSE_KIND, ReplicaGroups
from trainwreck.harness.supervise.scenarios import declare
from trainwreck.invariants.verdict import UNKNOWN, Validity

FRAMEWORK = "torchft"
INSTALL = "pip install 'trainwreck[torchft]'"
STEPS = 100
"""Updates every row commits (each group trains its own shard: 64 ids, 4 per update)."""
STEP_SECONDS = 0.3
"""Compute time each update stands for (configured: the tiny MLP takes ~2 ms, a group restart
takes 4-22 s on the shared 2-core machine, and the survivors must still be training when the
restarted group is back, or it finds no peer and trains alone from step 0)."""
KILL_STEP = 20
HEARTBEAT_S = 5.0
"""The lighthouse's heartbeat timeout in every row (torchft's default)."""
HANG_TIMEOUT_S = 90.0
"""No rank progressing this long ends a row: the survivors wait out a lighthouse restart and a
group's heal on the shared 2-core machine."""
GROUP_RESTARTS = 2
"""Restarts each group may take (kill-in-heal kills one group twice)."""
SCRIPT = "trainwreck.trainer.frameworks.torchft_train"


def _kill(rank: int, point: str = "step_start", step: int = KILL_STEP, attempt: int = 0) -> dict[str, Any]:
    return {"id": f"kill-r{rank}-{point}-a{attempt}", "kind": "kill", "rank": rank, "step": step,
            "point": point, "attempt": attempt}


@dataclass(frozen=True)
class Scenario:
    """A replica-group job of the example trainer (its own job type; declared in harness/supervise/scenarios.py's registry)."""

    summary: str
    plan: tuple[dict[str, Any], ...] = ()
    groups: int = 2
    lost_groups: tuple[int, ...] = ()
    args: tuple[str, ...] = ()


SCENARIOS: dict[str, Scenario] = declare("torchft", (
    ("golden", Scenario("two groups of one rank, no fault")),
    ("kill-between-steps", Scenario(f"group 1 SIGKILLed at the start of update {KILL_STEP}, restarted alone",
                                    (_kill(1),))),
    ("kill-in-allreduce", Scenario(f"group 1 SIGKILLed inside update {KILL_STEP}'s gradient all-reduce",
                                   (_kill(1, "in_allreduce"),))),
    ("kill-in-heal", Scenario(f"group 1 killed at update {KILL_STEP}, then again while its restart fetches a "
                              "peer's state", (_kill(1), _kill(1, "in_heal", step=1, attempt=1)))),
    ("kill-lighthouse", Scenario(f"the lighthouse SIGKILLed when a rank reaches update {KILL_STEP}, restarted "
                                 "by the harness on the same port",
                                 ({"id": "kill-lighthouse", "kind": LIGHTHOUSE_KIND, "step": KILL_STEP},))),
    ("group-never-returns", Scenario(f"group 1 SIGKILLed at update {KILL_STEP} and never restarted", (_kill(1),),
                                     lost_groups=(1,))),
    ("three-groups-lose-one", Scenario(f"three groups; group 2 SIGKILLed at update {KILL_STEP}, restarted",
                                       (_kill(2),), groups=3)),
))


@dataclass(frozen=True)
class TorchftRow:
    scenario: str
    valid: Validity
    invalid: tuple[str, ...] = ()
    reason: str = ""
    fired: tuple[str, ...] = ()
    figures: dict[str, Any] = field(default_factory=dict)
    run_dir: str | None = None
    reproduce: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"framework": FRAMEWORK, "scenario": self.scenario,
                "valid": self.valid if isinstance(self.valid, bool) else "unknown", "invalid": list(self.invalid),
                "reason": self.reason, "fired": list(self.fired), "figures": self.figures,
                "run_dir": self.run_dir, "reproduce": self.reproduce}


def torchft_version(python: str) -> str | None:
    """The torchft distribution `python` imports (pinned or nightly), or None if it has none."""
    code = ("import importlib.metadata as m\n"
            "for d in ('torchft', 'torchft-nightly'):\n"
            "    try:\n        print(d, m.version(d)); break\n"
            "    except m.PackageNotFoundError:\n        pass\n")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or None


def job_for(name: str, run_dir: Path, python: str = sys.executable) -> JobSpec:
    """The row's replica-group job: one rank per group (the launcher is the target's, "replica-groups")."""
    sc = SCENARIOS[name]
    command = shlex.join([python, "-m", SCRIPT, "--steps", str(STEPS), "--step-seconds", str(STEP_SECONDS),
                          *sc.args])
    target = ReplicaGroups(command, groups=sc.groups, lost_groups=sc.lost_groups, heartbeat_timeout_s=HEARTBEAT_S)
    return JobSpec(target=target, world_sizes=(sc.groups,), plan=[dict(f) for f in sc.plan], run_dir=run_dir,
                   hang_timeout_s=HANG_TIMEOUT_S, max_restarts=GROUP_RESTARTS,
                   scenario={"name": f"{FRAMEWORK} {name}", "summary": sc.summary})


def reproduce(name: str) -> str:
    return f"trainwreck frameworks --frameworks {FRAMEWORK} --scenarios {name}"


def judge_replica_run(run_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The judgement of a replica run and the figures it measured (see invariants/replica_groups.py)."""
    from trainwreck.invariants.judge import judge
    from trainwreck.invariants.loader import load_history
    from trainwreck.invariants.replica_groups import group_losses, load_replica_run

    judgement = judge(load_history(run_dir))
    run = load_replica_run(run_dir)
    coverage = judgement.verdicts["coverage"].counts
    losses = group_losses(run)
    end = (run.of("end") or [{}])[-1]
    figures = {"stall_s": [None if x.stall_s is None else round(x.stall_s, 2) for x in losses],
               "steps_alone": [x.alone_steps for x in losses],
               "replayed": coverage.get("replayed"), "dropped": coverage.get("dropped"),
               "never_seen": coverage.get("never_seen"), "heals": len(run.of("heal")),
               "uncommitted_steps": sum(1 for e in run.of("commit") if not e.get("committed")),
               "group_starts": end.get("group_starts"), "status": end.get("status"),
               "final_step": end.get("final_step")}
    (run_dir / "verdicts.json").write_text(json.dumps(judgement.to_json(), indent=1))
    return judgement, figures


def run_row(name: str, out_dir: Path, python: str = sys.executable) -> TorchftRow:
    version = torchft_version(python)
    if version is None:
        return TorchftRow(name, UNKNOWN, reason=f"torchft is not installed for {python}: {INSTALL}")
    run_dir = out_dir / f"{FRAMEWORK}-{name}"
    run_job(job_for(name, run_dir, python))
    judgement, figures = judge_replica_run(run_dir)
    fired = tuple(sorted({str(e.get("fault_id")) for e in _events(run_dir) if e.get("kind") == "fault"}))
    invalid = tuple(sorted(n for n, v in judgement.verdicts.items() if v.valid is False))
    reason = "; ".join([f"{n}: {v.summary}" for n, v in judgement.verdicts.items() if v.valid is not True][:2]
                       + judgement.notes[:1])
    return TorchftRow(name, judgement.valid, invalid, reason, fired, {"torchft": version, **figures}, str(run_dir),
                      reproduce(name))


def _events(run_dir: Path) -> list[dict[str, Any]]:
    from trainwreck.rundir.layout import iter_events

    return list(iter_events(run_dir, batches=False))


def torchft_rows(out_dir: Path, scenarios: Sequence[str] | None = None, python: str = sys.executable,
                 progress: Callable[[TorchftRow], None] | None = None) -> list[TorchftRow]:
    rows = []
    for name in [s for s in (scenarios or SCENARIOS) if s in SCENARIOS]:
        row = run_row(name, out_dir, python)
        if progress is not None:
            progress(row)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from trainwreck.invariants.verdict import compose, exit_code, verdict_word

    p = argparse.ArgumentParser(description="torchft's rows of trainwreck frameworks, with any interpreter")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--python", default=sys.executable, help="the interpreter whose torchft the ranks import")
    p.add_argument("--scenarios", help=f"comma-separated, from {', '.join(SCENARIOS)}")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = [s.strip() for s in args.scenarios.split(",")] if args.scenarios else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"--scenarios {unknown[0]!r} is unknown; choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = torchft_rows(args.out, names, args.python,
                        None if args.json else lambda r: print(f"{verdict_word(r.valid):<8} {r.scenario:<24} "
                                                               f"{json.dumps(r.figures)} {r.reason}", flush=True))
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
    return exit_code(compose(r.valid for r in rows))


if __name__ == "__main__":
    sys.exit(main())
