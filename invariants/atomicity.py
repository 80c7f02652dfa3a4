"""`atomicity`: only committed, intact checkpoints are restored, damage is
rejected before anything is restored, and no intact progress is thrown away.

The checker replays what each attempt could see at its start: for every
checkpoint name, its latest commit (`save`), whether a fault damaged it since,
and whether retention pruned it. The reference loader walks checkpoints
newest-first and stops at the first intact one, so every damaged checkpoint
newer than the restore point (all of them, for a fresh start) was considered
and must be rejected before the attempt restores or trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainwreck.invariants.history import History
from trainwreck.invariants.lineage import content_of, resolve_save, restore_point, save_of_restore
from trainwreck.invariants.verdict import UNKNOWN, Evidence, Verdict

NAME = "atomicity"

Pos = tuple[float, str, int]

# Order of the state changes that an attempt's start sees. Damage applied by
# the harness between attempts (attempt = the attempt it affects) comes before
# that attempt's own saves; damage from inside a rank counts at the end of its
# attempt, so a save in the same attempt (the very write a fault tore) cannot
# clear it - only a later attempt's fresh save of that name does.
_BEFORE_ATTEMPT, _DURING, _AFTER_ATTEMPT = 0, 1, 2


@dataclass
class Stored:
    """What one checkpoint name holds at some moment."""

    save: dict[str, Any] | None = None
    damage: dict[str, Any] | None = None
    prune: dict[str, Any] | None = None

    @property
    def intact(self) -> bool:
        return self.save is not None and self.damage is None and self.prune is None


def check_atomicity(history: History, golden: History | None = None) -> Verdict:
    attempts = history.attempts()
    if not attempts:
        return Verdict(NAME, UNKNOWN, "no rank events: no attempt to judge")
    changes = _state_changes(history)
    evidence = Evidence()
    counts = {"attempts": len(attempts), "restores": 0, "rejects_required": 0, "fresh_starts": 0}
    state: dict[str, Stored] = {}
    applied = 0
    for attempt in attempts:
        while applied < len(changes) and changes[applied][0] < (attempt, _DURING):
            _apply(state, changes[applied])
            applied += 1
        _judge_attempt(history, attempt, state, evidence, counts)
    counts["violations"] = evidence.total
    if evidence:
        return Verdict(NAME, False, f"{evidence.total} violation(s): {evidence.lines[0]}", counts, evidence.listing())
    ran = history.attempts_run()
    silent = len(ran) - len(attempts)
    counts.update(attempts=len(ran), attempts_without_rank_events=silent)
    # An attempt whose ranks wrote nothing still counts (the harness ran it); what it did at its start is unknown.
    unseen = f"; {silent} attempt(s) left no rank events, so their start is not judged" if silent else ""
    return Verdict(
        NAME,
        True,
        f"{len(ran)} attempt(s), {len(ran) - 1} restart(s): each started from the newest intact checkpoint"
        f" ({counts['fresh_starts']} fresh), {counts['rejects_required']} damaged checkpoint(s) rejected first{unseen}",
        counts,
    )


def _state_changes(history: History) -> list[tuple[tuple[int, int, Pos], str, dict[str, Any]]]:
    starts = _attempt_starts(history)
    changes = []
    for ev in history.of_kind("save"):
        changes.append(((ev["attempt"], _DURING, ev["_pos"]), "save", ev))
    for ev in history.of_kind("prune"):
        changes.append(((ev["attempt"], _DURING, ev["_pos"]), "prune", ev))
    for ev in damage_events(history):
        start = starts.get(ev["attempt"])
        between = ev.get("rank") is None or (start is not None and ev["t"] < start)
        phase = _BEFORE_ATTEMPT if between else _AFTER_ATTEMPT
        changes.append(((ev["attempt"], phase, ev["_pos"]), "damage", ev))
    changes.sort(key=lambda c: c[0])
    return changes


def damage_events(history: History) -> list[dict[str, Any]]:
    """Fault events that say they damaged a checkpoint."""
    return [ev for ev in history.of_kind("fault") if isinstance(ev.get("checkpoint"), str)]


def _attempt_starts(history: History) -> dict[int, float]:
    """The earliest time each attempt's ranks were seen alive."""
    starts: dict[int, float] = {}
    for ev in history.of_kind("start"):
        starts[ev["attempt"]] = min(starts.get(ev["attempt"], ev["t"]), ev["t"])
    for (attempt, _), log in history.logs.items():
        if log.first_pos is not None:
            starts[attempt] = min(starts.get(attempt, log.first_pos[0]), log.first_pos[0])
    return starts


def _apply(state: dict[str, Stored], change: tuple[Any, str, dict[str, Any]]) -> None:
    _, what, ev = change
    stored = state.setdefault(ev["checkpoint"], Stored())
    if what == "save":
        state[ev["checkpoint"]] = Stored(save=ev)
    elif what == "prune":
        stored.prune = ev
    elif stored.damage is None:
        stored.damage = ev


def _describe(name: str, stored: Stored) -> str:
    if stored.save is None:
        return name
    return f"{name} (step {stored.save['step']}, saved in attempt {stored.save['attempt']})"


def _passed_over(history: History, attempt: int, name: str, stored: Stored) -> str:
    """What the events show about a committed checkpoint an attempt did not resume from: the
    `save` event that announced it, and what the attempt itself said of it. The checker
    sees no disk: "intact" means only that no fault, prune or reject was recorded against it
    before the attempt; when the attempt then rejected it (a power cut can take an announced
    checkpoint away), the reject is the evidence of what was on disk."""
    assert stored.save is not None
    said = (f"{name} (step {stored.save['step']}) was announced by the save event at {stored.save['_src']} "
            f"(attempt {stored.save['attempt']}) and no fault or retention touched it since")
    rejects = [ev for ev in history.of_kind("reject") if ev["attempt"] == attempt and ev["checkpoint"] == name]
    if rejects:
        return (f"{said}, yet the attempt found it unusable and rejected it ({rejects[0].get('reason')}, "
                f"{rejects[0]['_src']}): a checkpoint announced as committed was lost")
    return (f"{said}, and the attempt neither restored nor rejected it: needless lost work if it was still on disk "
            "(a power cut can take an announced checkpoint away without a trace)")


def _judge_attempt(history: History, attempt: int, state: dict[str, Stored], evidence: Evidence, counts: dict[str, int]) -> None:
    intact = [(s.save["step"], name) for name, s in state.items() if s.intact and s.save]
    newest = max(intact) if intact else None
    chosen = restore_point(history, attempt)
    restores = [ev for ev in history.of_kind("restore") if ev["attempt"] == attempt]
    point = chosen["step"] if chosen else 0
    if chosen is None:
        counts["fresh_starts"] += 1
        if newest is not None:
            evidence.add(f"attempt {attempt} started fresh although {_passed_over(history, attempt, newest[1], state[newest[1]])}")
    counts["restores"] += len({ev["checkpoint"] for ev in restores})
    for name in sorted({ev["checkpoint"] for ev in restores}):
        ev = next(e for e in restores if e["checkpoint"] == name)
        stored = _stored_for(history, state, ev)
        where = f"attempt {attempt} restored {name} ({ev['_src']})"
        if stored.save is None:
            evidence.add(f"{where}, which was never committed: {_why_uncommitted(history, ev)}")
        elif stored.damage is not None:
            evidence.add(f"{where}, which fault {stored.damage['fault_id']!r} had damaged ({stored.damage['_src']})")
        elif stored.prune is not None:
            evidence.add(f"{where}, which retention had pruned ({stored.prune['_src']})")
        elif newest is not None and stored.save["step"] < newest[0]:
            evidence.add(f"{where} at step {stored.save['step']} although the newer "
                         f"{_passed_over(history, attempt, newest[1], state[newest[1]])}")
    anchors = _anchors(history, attempt, restores)
    for name, stored in sorted(state.items()):
        if stored.save is None or stored.damage is None or stored.prune is not None:
            continue
        if stored.save["step"] <= point and chosen is not None:
            continue  # older than the restore point: the loader never looked at it
        counts["rejects_required"] += 1
        rejects = [ev for ev in history.of_kind("reject") if ev["attempt"] == attempt and ev["checkpoint"] == name]
        damaged = f"{_describe(name, stored)}, damaged by fault {stored.damage['fault_id']!r}"
        if not rejects:
            evidence.add(f"attempt {attempt} considered {damaged}, but never rejected it")
        elif not any(_first(r, anchors) for r in rejects):
            evidence.add(f"attempt {attempt} rejected {damaged} only after restoring or training ({rejects[0]['_src']})")


def _stored_for(history: History, state: dict[str, Stored], restore: dict[str, Any]) -> Stored:
    """What the restored checkpoint was at the attempt's start. Known by its bytes when the
    events carry `content` (lineage.save_of_restore): a save whose name was overwritten since,
    yet whose bytes were loaded (renamed aside as a backup), was committed and is judged as such."""
    save = save_of_restore(history, restore)
    if save is None:
        return Stored()
    stored = state.get(save["checkpoint"], Stored())
    return stored if stored.save is save else Stored(save=save)


def _why_uncommitted(history: History, restore: dict[str, Any]) -> str:
    content = content_of(restore)
    named = resolve_save(history, restore["checkpoint"], restore["attempt"])
    if content is not None and named is not None and content_of(named) is not None:
        return (f"its bytes (content {content}) match no save before the attempt; the last save of that name "
                f"committed content {content_of(named)} at step {named['step']} ({named['_src']})")
    return "no save before the attempt"


def _anchors(history: History, attempt: int, restores: list[dict[str, Any]]) -> list[Pos]:
    """Where the attempt first restored or trained, per rank."""
    anchors = [ev["_pos"] for ev in restores]
    anchors.extend(log.first_pos for log in history.ranks_of(attempt) if log.first_pos is not None)
    return anchors


def _first(reject: dict[str, Any], anchors: list[Pos]) -> bool:
    """True when no anchor is known to precede the reject. Within one file, line
    order is exact; across processes only time orders events, and equal times
    (clocks tie) count in the reject's favour."""
    t, src, line = reject["_pos"]
    for a_t, a_src, a_line in anchors:
        if (a_src == src and a_line < line) or (a_src != src and a_t < t):
            return False
    return True
