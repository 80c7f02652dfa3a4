"""The lineage walk of DESIGN.md: which updates shaped the final model.

Walking back from the final step: the last attempt's updates after its restore
point; the restored checkpoint's `save` names the attempt that produced it,
whose updates after its own restore point come before; and so on to step 0.
Every other update is redo work - a cost, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from trainwreck.invariants.history import History
from trainwreck.invariants.spill import bisect_left, bisect_right


@dataclass(frozen=True)
class Segment:
    """Updates first..last (inclusive) of the lineage, made by one attempt."""

    attempt: int
    first: int
    last: int
    restored: str | None  # the checkpoint the attempt started from; None: fresh


@dataclass
class Lineage:
    segments: list[Segment] = field(default_factory=list)  # in step order
    final_step: int = 0
    complete: bool = False  # the walk reached step 0
    problems: list[str] = field(default_factory=list)  # why incomplete, or what was assumed
    redo: dict[int, int] = field(default_factory=dict)  # attempt -> updates outside the lineage

    def steps(self) -> list[tuple[int, int]]:
        """(step, attempt) for every lineage step, in step order."""
        return [(k, seg.attempt) for seg in self.segments for k in range(seg.first, seg.last + 1)]

    def first_step(self) -> int:
        return self.segments[0].first if self.segments else self.final_step + 1


def restore_point(history: History, attempt: int) -> dict[str, Any] | None:
    """The `restore` an attempt started from (rank 0's, else the lowest rank's);
    None when the attempt started fresh."""
    restores = [ev for ev in history.of_kind("restore") if ev["attempt"] == attempt]
    if not restores:
        return None
    return min(restores, key=lambda ev: (ev["rank"], ev["_pos"]))


def resolve_save(history: History, checkpoint: str, before_attempt: int) -> dict[str, Any] | None:
    """The save that committed `checkpoint` last before `before_attempt` began.

    Names are reused (redo work re-saves `step-00000020`), so it is the latest
    save of an earlier attempt that counts."""
    return _latest(ev for ev in history.of_kind("save")
                   if ev["checkpoint"] == checkpoint and ev["attempt"] < before_attempt)


def content_of(event: dict[str, Any]) -> str | None:
    """The optional `content` of a save or restore: equal iff the checkpoint's bytes are equal."""
    content = event.get("content")
    return content if isinstance(content, str) and content else None


def save_of_restore(history: History, restore: dict[str, Any]) -> dict[str, Any] | None:
    """The save whose bytes a `restore` loaded, or None when no earlier save committed them.

    By content when the restore carries it: the latest earlier save of equal content,
    whatever its name (one file overwritten in place, or renamed aside as a backup, is
    still known). When every rank wrote one path, each rank's save of it is a candidate
    and the bytes decide, not which event came last: of the latest saves of those bytes
    (same attempt, step and name), the one whose state the loaded state equals.
    A restore whose content no save committed resolves to the name's own save when a fault
    damaged that checkpoint since (`damage_of` names it; the restore loaded the damaged
    bytes), else to None when that save carries a (different) content: those bytes were
    never committed. Otherwise, when either side lacks `content` (older writers), by name."""
    before = restore["attempt"]
    content = content_of(restore)
    if content is not None:
        same = [ev for ev in history.of_kind("save") if content_of(ev) == content and ev["attempt"] < before]
        latest = _latest(same)
        if latest is not None:
            group = [ev for ev in same if _round(ev) == _round(latest)]
            return next((ev for ev in group if _state(ev) == _state(restore)), latest)
    by_name = resolve_save(history, restore["checkpoint"], before)
    if content is not None and by_name is not None and content_of(by_name) is not None:
        return by_name if damage_of(history, restore, by_name) is not None else None
    return by_name


def damage_of(history: History, restore: dict[str, Any], save: dict[str, Any]) -> dict[str, Any] | None:
    """The fault that damaged `save`'s checkpoint after it was saved and before `restore`'s
    attempt looked, when the restore loaded other bytes than the save committed (a fault
    event naming the checkpoint: a planned `corrupt`); None otherwise."""
    if content_of(restore) is None or content_of(restore) == content_of(save):
        return None
    return next((ev for ev in history.of_kind("fault") if ev.get("checkpoint") == save["checkpoint"]
                 and isinstance(ev.get("attempt"), int) and ev["attempt"] <= restore["attempt"]
                 and (ev["attempt"], ev["_pos"]) > (save["attempt"], save["_pos"])), None)


def _round(save: dict[str, Any]) -> tuple[Any, ...]:
    return save["attempt"], save["step"], save["checkpoint"]


def _state(event: dict[str, Any]) -> tuple[Any, Any]:
    return event.get("digest"), event.get("buffers")


def _latest(saves: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    return max(saves, key=lambda ev: (ev["attempt"], ev["_pos"]), default=None)


def walk_lineage(history: History) -> Lineage:
    """The lineage of a loaded (and so unchanging) history; computed once."""
    cached = history.__dict__.get("_lineage")
    if cached is None:
        cached = history.__dict__["_lineage"] = _walk(history)
    return cached


def _walk(history: History) -> Lineage:
    lineage = Lineage()
    attempts = history.attempts()
    if not attempts:
        lineage.problems.append("no rank events: there is no lineage to walk")
        return lineage
    attempt = attempts[-1]
    restore = restore_point(history, attempt)
    start = restore["step"] if restore else 0
    last = history.last_step(attempt)
    end = max(start, last) if last is not None else start
    lineage.final_step = end
    segments: list[Segment] = []
    while True:
        restore = restore_point(history, attempt)
        start = restore["step"] if restore else 0
        if start > end:
            lineage.problems.append(
                f"attempt {attempt} restored step {start}, after the step {end} its successor restored"
            )
            break
        if end > start:
            segments.append(Segment(attempt, start + 1, end, restore["checkpoint"] if restore else None))
        if restore is None:
            lineage.complete = True
            break
        producer = _producer(history, attempt, restore, lineage)
        if producer is None:
            break
        attempt, end = producer
    segments.reverse()
    lineage.segments = segments
    lineage.redo = _redo(history, segments)
    return lineage


def _producer(history: History, attempt: int, restore: dict[str, Any], lineage: Lineage) -> tuple[int, int] | None:
    """(the attempt whose updates led up to the checkpoint `attempt` restored, the last of its updates
    the checkpoint holds)."""
    checkpoint, step = restore["checkpoint"], restore["step"]
    save = save_of_restore(history, restore)
    if save is not None:
        return save["attempt"], _loaded_step(restore, save)
    # No save: atomicity will call the restore invalid. For the other checkers
    # assume the latest earlier attempt that reached that step made it, and say so.
    for earlier in range(attempt - 1, -1, -1):
        if any(step in log.step_index() for log in history.ranks_of(earlier)):
            lineage.problems.append(
                f"attempt {attempt} restored {checkpoint} (step {step}), which no save committed;"
                f" assumed attempt {earlier}'s updates led to it"
            )
            return earlier, step
    lineage.problems.append(
        f"attempt {attempt} restored {checkpoint} (step {step}), which no save committed"
        " and no earlier attempt reached: the lineage before it is unknown"
    )
    return None


def _loaded_step(restore: dict[str, Any], save: dict[str, Any]) -> int:
    """The update the loaded state holds: the save's step when the bytes say which save it was
    (equal content), so a script that loads step 8's checkpoint but calls itself at step 4 (and
    replays updates 5-8) has both runs of 5-8 in its lineage; else the restore's own word."""
    if content_of(restore) is not None and content_of(restore) == content_of(save):
        return int(save["step"])
    return int(restore["step"])


def _redo(history: History, segments: list[Segment]) -> dict[int, int]:
    in_lineage: dict[int, tuple[int, int]] = {}
    for seg in segments:
        in_lineage.setdefault(seg.attempt, (seg.first, seg.last))
        lo, hi = in_lineage[seg.attempt]
        in_lineage[seg.attempt] = (min(lo, seg.first), max(hi, seg.last))
    redo: dict[int, int] = {}
    for attempt in {a for a, _ in history.logs}:
        lo, hi = in_lineage.get(attempt, (1, 0))
        applied: set[int] = set()  # steps outside lo..hi: the ends of each ascending column
        for log in history.ranks_of(attempt):
            applied.update(log.steps[: bisect_left(log.steps, lo)], log.steps[bisect_right(log.steps, hi) :])
        outside = len(applied)
        if outside:
            redo[attempt] = outside
    return redo


def first_batches(history: History, attempt: int, count: int = 2) -> list[tuple[int, int]]:
    """(step, samples of that update over all ranks) for the attempt's first `count` updates."""
    cache = history.__dict__.setdefault("_first_batches", {})
    if attempt not in cache:
        steps = sorted({k for log in history.ranks_of(attempt) for k in log.batch_steps[:count]})[:count]
        cache[attempt] = [(k, len(history.global_batch(attempt, k) or [])) for k in steps]
    return cache[attempt]


def batch_changed(history: History, attempt: int, golden: History, golden_attempt: int) -> tuple[int, int] | None:
    """(golden's global batch, this attempt's) when the attempt's differs: a per-device batch on
    another world size, whose step k is then another update than golden's step k, so comparisons
    with the golden run end there. None when equal or unknown. Two first updates are compared with
    golden's updates of the same numbers, both must differ: an epoch's final partial batch is one."""
    ours, theirs = first_batches(history, attempt), first_batches(golden, golden_attempt)
    if not ours or not theirs:
        return None
    full = max(size for _, size in theirs)
    for step, size in ours:
        golden_ids = golden.global_batch(golden_attempt, step)
        if size == (len(golden_ids) if golden_ids is not None else full):
            return None
    return full, max(size for _, size in ours)
