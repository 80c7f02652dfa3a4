"""Running every checker over a run and composing one judgement."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from trainwreck.invariants.atomicity import check_atomicity
from trainwreck.invariants.continuity import check_continuity
from trainwreck.invariants.coverage import check_coverage
from trainwreck.invariants.hang import check_hang, first_firings
from trainwreck.invariants.history import History
from trainwreck.invariants.progress import check_progress, interruption
from trainwreck.invariants.replicas import check_replicas
from trainwreck.invariants.verdict import UNKNOWN, Validity, Verdict, check_safe, compose, overall_word

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
    interrupted: dict[str, Any] | None = None
    """The `end` event of a job the harness stopped on SIGINT/SIGTERM (status "interrupted"):
    then `valid` is never False, since the verdicts judge a run cut short from outside."""

    @property
    def word(self) -> str:
        """VALID, INVALID, UNKNOWN, or INTERRUPTED: the overall word every output prints."""
        return overall_word(self.valid, self.interrupted)

    def to_json(self) -> dict[str, Any]:
        out = {
            "valid": self.valid,
            "verdicts": {name: v.to_json() for name, v in self.verdicts.items()},
            "unfired_faults": list(self.unfired_faults),
            "notes": list(self.notes),
        }
        if self.interrupted is not None:
            out["interrupted"] = dict(self.interrupted)
        return out


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
    stop = interrupted_end(history)
    if stop is None:
        return Judgement(compose(parts), verdicts, unfired, notes)
    violated = [name for name, v in verdicts.items() if v.valid is False]
    notes.append(f"the job was interrupted ({interruption(stop)}) at step {stop.get('final_step')}: not judged"
                 + (f"; {', '.join(violated)} judged the part that ran invalid, shown above" if violated else ""))
    return Judgement(UNKNOWN, verdicts, unfired, notes, {k: v for k, v in stop.items() if not k.startswith("_")})


def interrupted_end(history: History) -> dict[str, Any] | None:
    """The job's last `end` event when it says the harness was interrupted, else None."""
    ends = history.of_kind("end")
    return ends[-1] if ends and ends[-1].get("status") == "interrupted" else None


GOLDEN_COMPARISONS = "each lineage step's global batch (coverage) and digest or loss (continuity) against the golden run"
"""What only a golden run shows: a resume that restores every saved byte yet loses the RNG, the LR
schedule or the data order matches its own saves and differs from the uninterrupted run."""


def needs_golden(history: History) -> bool:
    """Whether judging this run without a golden run skips a comparison it needs: a lineage that
    crosses a restart (another attempt, a restore) can only be shown exact against one. The
    replica-group checkers compare with no golden run, and one attempt has nothing to resume."""
    from trainwreck.invariants.replica_groups import is_replica_run

    if is_replica_run(history.spec):
        return False
    return history.attempt_count() > 1 or bool(history.of_kind("restore"))


def without_golden(judgement: Judgement, history: History, why: str) -> Judgement:
    """The judgement of a run judged with no golden run: never valid when the run needed one
    (`why` says why none was used and names --golden)."""
    if not needs_golden(history):
        return judgement
    note = f"not judged without a golden run: {GOLDEN_COMPARISONS}, which this run needs (it restarted); {why}"
    return replace(judgement, valid=compose([judgement.valid, UNKNOWN]), notes=[*judgement.notes, note])
