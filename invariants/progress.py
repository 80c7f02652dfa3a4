"""`progress`: the job ended `completed` at `total_steps` within its restart budget."""

from __future__ import annotations

from typing import Any

from trainwreck.invariants.history import History
from trainwreck.invariants.lineage import walk_lineage
from trainwreck.invariants.verdict import UNKNOWN, Evidence, Verdict

NAME = "progress"


def check_progress(history: History, golden: History | None = None) -> Verdict:
    if not history.has_events:
        return Verdict(NAME, UNKNOWN, "no events at all: nothing shows the job ran")
    total = history.spec["total_steps"]
    attempts = history.attempt_count()
    lineage = walk_lineage(history)
    counts = {"attempts": attempts, "total_steps": total, "lineage_final_step": lineage.final_step}
    ends = history.of_kind("end")
    if not ends:
        # Killed with its harness, or still running: nothing says how it ends (docs/DESIGN.md).
        return Verdict(NAME, UNKNOWN, "no end event: the job is still running or was killed before it ended,"
                       " so whether it completes is not known", counts,
                       [f"the lineage reaches step {lineage.final_step} of {total} over {attempts} attempt(s)"])
    end = ends[-1]
    if end["status"] == "interrupted":
        # The harness itself was stopped (Ctrl-C, SIGTERM) and killed the ranks: nothing about the trainer.
        return Verdict(NAME, UNKNOWN, f"the job was interrupted ({interruption(end)}) at step {end['final_step']} "
                       f"of {total}, so whether it completes is not known", counts,
                       [f"the lineage reaches step {lineage.final_step} of {total} over {attempts} attempt(s)"])
    evidence = Evidence()
    if end["status"] != "completed":
        evidence.add(f"the job ended {end['status']!r} at step {end['final_step']} ({end['_src']})")
    elif end["final_step"] != total:
        evidence.add(f"the job ended completed at step {end['final_step']}, not total_steps {total} ({end['_src']})")
    if lineage.final_step != total:
        evidence.add(f"the last update of the lineage is step {lineage.final_step}, not total_steps {total}")
    budget = history.spec.get("max_restarts")
    if budget is not None and attempts - 1 > budget:
        evidence.add(f"{attempts - 1} restart(s) exceed the budget max_restarts={budget}")
    if evidence:
        return Verdict(NAME, False, evidence.lines[0], counts, evidence.listing())
    within = f" within max_restarts={budget}" if budget is not None else ""
    return Verdict(NAME, True, f"completed at step {total} after {attempts} attempt(s){within}", counts)


def interruption(end: dict[str, Any]) -> str:
    """What stopped an interrupted job, from its `end` event: "SIGINT to the harness" (older or
    foreign writers may leave the signal out)."""
    sig = end.get("signal")
    return f"{sig} to the harness" if isinstance(sig, str) and sig else "the harness was stopped"
