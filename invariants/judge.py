"""Running every checker over a run and composing one judgement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from trainwreck.invariants.atomicity import check_atomicity
from trainwreck.invariants.continuity import check_continuity
from trainwreck.invariants.coverage import check_coverage
from trainwreck.invariants.hang import check_hang, first_firings
from trainwreck.invariants.history import History
from trainwreck.invariants.progress import check_progress
from trainwreck.invariants.replicas import check_replicas
from trainwreck.invariants.verdict import UNKNOWN, Validity, Verdict, check_safe, compose

Checker = Callable[[History, "History | None"], Verdict]

# The invariant names of DESIGN.md, in report order.
CHECKERS: dict[str, Checker] = {
    "coverage": check_coverage,
    "continuity": check_continuity,
    "atomicity": check_atomicity,
    "hang": check_hang,
    "replicas": check_replicas,
    "progress": check_progress,
}


def checkers_for(history: History) -> dict[str, Checker]:
    """The classic checkers; for a replica-group run (run.json `replica_groups`), the
    replica-aware coverage, continuity and progress of invariants/replica_groups.py instead
    of the lineage-based ones (a group restart is not a whole-job restart), plus `hang`."""
    from trainwreck.invariants.replica_groups import is_replica_run, replica_checkers

    if not is_replica_run(history.spec):
        return CHECKERS
    return {**replica_checkers(history.run_dir), "hang": check_hang}


def read_elsewhere(spec: dict[str, Any], note: str) -> bool:
    """A loader note about kinds the replica checkers read themselves (not worth telling)."""
    from trainwreck.invariants.replica_groups import REPLICA_KINDS, is_replica_run

    return is_replica_run(spec) and any(note.endswith(f"unknown kind {kind!r}") for kind in REPLICA_KINDS)


@dataclass(frozen=True)
class Judgement:
    """Every verdict on a run, and what they add up to."""

    valid: Validity
    verdicts: dict[str, Verdict]
    unfired_faults: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "verdicts": {name: v.to_json() for name, v in self.verdicts.items()},
            "unfired_faults": list(self.unfired_faults),
            "notes": list(self.notes),
        }


def unfired_faults(history: History) -> list[Any]:
    """Planned faults with no `fault` event: the run did not test them."""
    fired = first_firings(history)
    return [f["id"] for f in history.spec["faults"] if f["id"] not in fired]


def skip_reasons(history: History, unfired: list[Any]) -> list[str]:
    """One note per unfired fault that recorded why it could not act (its first `fault_skip`)."""
    reasons: dict[Any, str] = {}
    for ev in history.of_kind("fault_skip"):
        if ev["fault_id"] in unfired and isinstance(ev.get("reason"), str):
            reasons.setdefault(ev["fault_id"], ev["reason"])
    return [f"fault {fid} could not act: {reasons[fid]}" for fid in unfired if fid in reasons]


def judge(history: History, golden: History | None = None) -> Judgement:
    """All six checkers, each crash-safe, composed false > unknown > true.

    A planned fault that never fired adds an "unknown": the run did not test
    what it meant to. A violation still wins, since it was really observed."""
    verdicts = {name: check_safe(name, fn, history, golden) for name, fn in checkers_for(history).items()}
    unfired = unfired_faults(history)
    notes = [note for note in history.notes if not read_elsewhere(history.spec, note)]
    if golden is not None:
        notes.extend(f"golden: {note}" for note in golden.notes)
    planned = {f["id"] for f in history.spec["faults"]}
    strays = sorted({str(fid) for fid in first_firings(history) if fid not in planned})
    if strays:
        notes.append(f"fault events with ids not in the plan: {', '.join(strays)}")
    parts: list[Validity] = [v.valid for v in verdicts.values()]
    if unfired:
        parts.append(UNKNOWN)
        notes.append(f"planned fault(s) never fired, so the run did not test them: {', '.join(map(str, unfired))}")
        notes.extend(skip_reasons(history, unfired))
    return Judgement(compose(parts), verdicts, unfired, notes)
