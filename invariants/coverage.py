"""`coverage`: along the lineage, every sample exactly once per epoch.

Work is done per (lineage segment, rank) with set operations on id slices, so
a 100 000-step run costs a few C-level passes rather than a Python loop per
sample; the slow, exact bookkeeping runs only to describe a violation.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from trainwreck.invariants import vectors
from trainwreck.invariants.history import History, RankLog
from trainwreck.invariants.lineage import Lineage, Segment, batch_changed, walk_lineage
from trainwreck.invariants.spill import ascending, bisect_right, same_range
from trainwreck.invariants.verdict import UNKNOWN, Evidence, Verdict, absent_intervals, intervals

NAME = "coverage"

# epoch -> (where its ids are, [ids used in all]). An epoch's
# ids are kept as (column, start, stop) references into the rank logs, not copied
# into a set: the set of one epoch is built only when that epoch is judged, so the
# checker holds one epoch's ids at a time, not every epoch's (2 GB at 16 M events).
Part = tuple[Sequence[int], int, int]
EpochIds = dict[int, tuple[list[Part], list[int]]]


class Distinct:
    """The distinct ids of one epoch's parts: a set, or for a long epoch a sorted numpy
    array (invariants/vectors.py) - the same answers either way."""

    def __init__(self, parts: list[Part]) -> None:
        ordered = vectors.distinct(parts)
        if ordered is not None:
            self.values: Any = ordered
            self.count, self.lowest, self.highest = len(ordered), int(ordered[0]), int(ordered[-1])
            return
        seen: set[int] = set()
        for column, start, stop in parts:
            seen.update(column[start:stop])
        self.values, self.count = seen, len(seen)
        self.lowest, self.highest = min(seen), max(seen)  # over the distinct ids: cheaper than over every use

    def outside(self, size: int) -> list[int]:
        """The ids outside 0..size-1, ascending."""
        if self.lowest >= 0 and self.highest < size:
            return []
        if isinstance(self.values, set):
            return sorted(x for x in self.values if x < 0 or x >= size)
        values = self.values
        return [int(x) for x in values[(values < 0) | (values >= size)]]

    def ids(self) -> Iterable[int]:
        return self.values if isinstance(self.values, set) else self.values.tolist()


def check_coverage(history: History, golden: History | None = None) -> Verdict:
    """No id twice in an epoch of the lineage; completed epochs cover every id
    (all but fewer than `global_batch` with `drop_last`); no id outside the
    dataset; with a golden run, each step's global batch equals the golden one.
    Drawn with replacement (run.json `sampling`), an id may repeat: exactly-once is
    not checked, and what still holds is: ids inside the dataset, no resumed attempt
    replaying draws already in the lineage, and the golden run's batches."""
    if not any(log.batch_steps for log in history.logs.values()):
        return Verdict(NAME, UNKNOWN, "no batch events: nothing says which samples were used")
    lineage = walk_lineage(history)
    evidence = Evidence()
    missing: list[str] = []
    epochs: EpochIds = {}
    last_epoch: int | None = None
    for seg in lineage.segments:
        last_epoch = _add_segment(history, seg, epochs, last_epoch, evidence, missing)
    size = history.spec["dataset_size"]
    replacement = history.spec.get("sampling") == "with_replacement"
    counts = {"lineage_steps": sum(s.last - s.first + 1 for s in lineage.segments), "epochs": len(epochs)}
    duplicated = outside_total = uncovered = 0
    twice_by_epoch: dict[int, int] = {}
    ordered = sorted(epochs)
    for n, epoch in enumerate(ordered):
        parts, (used,) = epochs.pop(epoch)
        seen = Distinct(parts)
        if used != seen.count and not replacement:  # drawn with replacement, an id may come again
            twice, line = _where_twice(history, lineage, epoch)
            duplicated += twice
            twice_by_epoch[epoch] = twice
            evidence.add(line)
        outside = seen.outside(size)
        if outside:
            outside_total += len(outside)
            evidence.add(f"epoch {epoch}: ids outside the dataset 0..{size - 1}: {intervals(outside)}")
        if n + 1 < len(ordered) and not replacement:  # a later epoch is in the lineage: this one completed
            lost = size - (seen.count - len(outside))
            allowed = history.spec["global_batch"] - 1 if history.spec["drop_last"] else 0
            if lost > allowed:
                uncovered += lost
                rule = f"drop_last allows fewer than {history.spec['global_batch']}" if history.spec["drop_last"] else "drop_last is false"
                evidence.add(f"epoch {epoch} completed without {lost} id(s) ({rule}): {absent_intervals(seen.ids(), size)}")
    stops: list[str] = []
    mismatched = _compare_golden(history, lineage, golden, evidence, missing, stops) if golden is not None else 0
    counts.update(duplicated_ids=duplicated, ids_outside_dataset=outside_total, ids_not_covered=uncovered, golden_mismatched_steps=mismatched)
    if replacement:
        counts["replayed_steps"] = _replayed(history, lineage, evidence)
    redo = sum(lineage.redo.values())
    if redo:
        counts["redo_steps"] = redo
    if evidence:
        summary = _violation_summary(twice_by_epoch, outside_total, uncovered, mismatched, counts.get("replayed_steps", 0), evidence)
        return Verdict(NAME, False, summary, counts, evidence.listing())
    reasons = ([] if lineage.complete else lineage.problems) + missing
    if reasons:
        return Verdict(NAME, UNKNOWN, f"coverage cannot be shown: {reasons[0]}", counts, reasons[:10])
    golden_note = ", each step's batch equals the golden run's" if golden is not None else ""
    golden_note += f" ({stops[0]})" if stops else ""
    redo_note = f"; {redo} redo step(s) outside it ignored" if redo else ""
    if replacement:
        return Verdict(NAME, True, f"{counts['lineage_steps']} lineage steps drawn with replacement: every id inside "
                       f"the dataset, no resumed attempt replayed draws already in the lineage{golden_note}{redo_note};"
                       " sampling with replacement: exactly-once not checked (an id may be drawn again)", counts)
    return Verdict(
        NAME,
        True,
        f"{counts['lineage_steps']} lineage steps over {counts['epochs']} epoch(s): no id twice,"
        f" completed epochs covered{golden_note}{redo_note}",
        counts,
    )


def _add_segment(
    history: History, seg: Segment, epochs: EpochIds, last_epoch: int | None, evidence: Evidence, missing: list[str]
) -> int | None:
    """Add one segment's ids to their epochs; returns the last epoch seen."""
    expected = seg.last - seg.first + 1
    logs = history.ranks_of(seg.attempt)
    reported: set[int] = set()
    end_epoch = last_epoch
    # The first complete rank and its range: ranges are compared, never copied (columns may be on disk).
    reference: tuple[RankLog, int] | None = None
    for log in logs:
        i, j = log.batch_range(seg.first, seg.last)
        if i == j:
            continue
        reported.add(log.rank)
        if j - i != expected or log.batch_steps[i] != seg.first or log.batch_steps[j - 1] != seg.last:
            absent = sorted(set(range(seg.first, seg.last + 1)) - set(log.batch_steps[i:j]))
            if absent:
                _note(missing, f"attempt {seg.attempt} rank {log.rank}: no batch event for lineage step(s) {intervals(absent)}")
        elif reference is None:
            reference = (log, i)
        elif same_range(log.batch_steps, i, reference[0].batch_steps, reference[1], j - i) and not same_range(
                log.epochs, i, reference[0].epochs, reference[1], j - i):
            ref, at = reference
            k = next(s for s, a, b in zip(log.batch_steps[i:j], log.epochs[i:j], ref.epochs[at:at + j - i]) if a != b)
            evidence.add(f"attempt {seg.attempt} step {k}: ranks disagree on the epoch (rank {log.rank} differs from rank {ref.rank})")
        reached = _add_events(log, i, j, epochs, last_epoch, evidence)
        end_epoch = reached if end_epoch is None else max(end_epoch, reached)
    size = history.world_sizes.get(seg.attempt)
    if not reported:
        _note(missing, f"no batch events for lineage steps {seg.first}-{seg.last} (attempt {seg.attempt})")
    elif size is not None and len(reported) < size:
        absent_ranks = sorted(set(range(size)) - reported)
        _note(missing, f"attempt {seg.attempt}: no batch events from rank(s) {absent_ranks} for lineage steps {seg.first}-{seg.last}")
    return end_epoch


def _add_events(log: RankLog, i: int, j: int, epochs: EpochIds, last_epoch: int | None, evidence: Evidence) -> int:
    """Add batch events i..j-1 of one rank; returns the highest epoch among them."""
    column, offsets = log.epochs, log.offsets
    if last_epoch is not None and column[i] < last_epoch:
        evidence.add(f"attempt {log.attempt} rank {log.rank} step {log.batch_steps[i]}: epoch went back from {last_epoch} to {column[i]}")
    if not ascending(column, False, i, j):
        eps = column[i:j]
        k = next(log.batch_steps[i + n + 1] for n in range(len(eps) - 1) if eps[n + 1] < eps[n])
        evidence.add(f"attempt {log.attempt} rank {log.rank} step {k}: epoch went back")
        for epoch in sorted(set(eps)):
            listed = [x for n, e in enumerate(eps) if e == epoch for x in log.samples(i + n)]
            _add_part(epochs, epoch, (listed, 0, len(listed)))
        return max(eps)
    at = i
    while at < j:  # each epoch is one contiguous run of events: one bisect finds its end
        epoch = column[at]
        end = bisect_right(column, epoch, at, j)
        _add_part(epochs, epoch, (log.ids, offsets[at], offsets[end]))
        at = end
    return column[j - 1]


def _add_part(epochs: EpochIds, epoch: int, part: Part) -> None:
    if part[1] == part[2]:
        return
    entry = epochs.get(epoch)
    if entry is None:
        entry = epochs[epoch] = ([], [0])
    entry[0].append(part)
    entry[1][0] += part[2] - part[1]


def _where_twice(history: History, lineage: Lineage, epoch: int) -> tuple[int, str]:
    """Evidence for duplicates in one epoch: the ids, and every use of the first."""
    uses: dict[int, list[str]] = {}
    for seg in lineage.segments:
        for log in history.ranks_of(seg.attempt):
            i, j = log.batch_range(seg.first, seg.last)
            for n in range(i, j):
                if log.epochs[n] == epoch:
                    place = f"attempt {seg.attempt} rank {log.rank} step {log.batch_steps[n]}"
                    for x in log.samples(n):
                        uses.setdefault(x, []).append(place)
    twice = sorted(x for x, places in uses.items() if len(places) > 1)
    first = twice[0]
    return len(twice), f"epoch {epoch}: ids used twice: {intervals(twice)}; id {first} at " + " and ".join(uses[first][:3])


def _note(lines: list[str], line: str) -> None:
    if len(lines) < 10:
        lines.append(line)


def _by_step(history: History, attempt: int, first: int, last: int) -> dict[int, list[int]]:
    """step -> sorted global batch for updates first..last of one attempt."""
    out: dict[int, list[int]] = {}
    for log in history.ranks_of(attempt):
        i, j = log.batch_range(first, last)
        for n in range(i, j):
            out.setdefault(log.batch_steps[n], []).extend(log.samples(n))
    for ids in out.values():
        ids.sort()
    return out


def _same_partition(history: History, seg: Segment, golden: History, g_seg: Segment) -> bool:
    """True when every rank used exactly the ids its golden counterpart used,
    update by update: then every global batch matches, no per-step work needed."""
    ours, theirs = history.ranks_of(seg.attempt), golden.ranks_of(g_seg.attempt)
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs):
        i, j = a.batch_range(seg.first, seg.last)
        gi, gj = b.batch_range(seg.first, seg.last)
        if a.rank != b.rank or a.batch_steps[i:j] != b.batch_steps[gi:gj]:
            return False
        if a.ids[a.offsets[i] : a.offsets[j]] != b.ids[b.offsets[gi] : b.offsets[gj]]:
            return False
    return True


def _compare_golden(history: History, lineage: Lineage, golden: History, evidence: Evidence, missing: list[str],
                    stops: list[str]) -> int:
    """Steps whose global batch differs from the golden run's; `stops` gets where, and why, the
    comparison ended (a changed global batch)."""
    g_segments = walk_lineage(golden).segments
    mismatched = 0
    for seg in lineage.segments:
        changed = next((c for g in g_segments[:1] if (c := batch_changed(history, seg.attempt, golden, g.attempt))), None)
        if changed is not None:  # a per-device batch on another world size: its steps are other updates than golden's
            if not stops:
                stops.append(f"from step {seg.first} (attempt {seg.attempt}) on, batches are not compared with the "
                             f"golden run's: the global batch changed ({changed[0]} -> {changed[1]})")
            continue
        covering = [g for g in g_segments if g.first <= seg.first and seg.last <= g.last]
        if covering and _same_partition(history, seg, golden, covering[0]):
            continue
        ours = _by_step(history, seg.attempt, seg.first, seg.last)
        theirs: dict[int, list[int]] = {}
        for g in g_segments:
            if g.last >= seg.first and g.first <= seg.last:
                theirs.update(_by_step(golden, g.attempt, max(g.first, seg.first), min(g.last, seg.last)))
        for k in range(seg.first, seg.last + 1):
            if k not in ours:
                continue  # already reported as missing
            if k not in theirs:
                _note(missing, f"the golden run has no batch for step {k}")
                continue
            if ours[k] != theirs[k]:
                mismatched += 1
                evidence.add(f"step {k} (attempt {seg.attempt}): global batch differs from the golden run: {_diff(ours[k], theirs[k])}")
    return mismatched


REPLAY_RUN = 2
"""Consecutive resumed steps whose batches must all equal earlier lineage steps' to call it a
replay: one equal batch of a few ids drawn from a small dataset can be chance, two in a row are not."""


def _replayed(history: History, lineage: Lineage, evidence: Evidence) -> int:
    """Drawn with replacement, a resumed attempt must continue the data RNG where the lineage left
    it: each restored segment's first draws are compared with every earlier lineage step's global
    batch. A restart that re-seeded the RNG (or rewound it to an older position) draws the same
    batches again; returns the replayed steps found (evidence says where)."""
    drawn: dict[int, tuple[int, ...]] = {}  # earlier lineage step -> its global batch
    first_of: dict[tuple[int, ...], int] = {}  # a global batch -> the first earlier step that drew it
    replayed = 0
    for seg in lineage.segments:
        batches = {k: tuple(ids) for k, ids in _by_step(history, seg.attempt, seg.first, seg.last).items()}
        length = seg.last - seg.first + 1
        first = first_of.get(batches.get(seg.first, ())) if seg.restored is not None else None
        if first is not None:
            same = next((n for n in range(length) if batches.get(seg.first + n) != drawn.get(first + n)), length)
            if same >= min(REPLAY_RUN, length):
                replayed += same
                evidence.add(f"attempt {seg.attempt} resumed at step {seg.first} from {seg.restored} and replayed the "
                             f"draws of lineage steps {first}-{first + same - 1}: steps {seg.first}-{seg.first + same - 1}"
                             " used the same global batches (its data RNG restarted instead of resuming where the "
                             "checkpoint left it)")
        for k in sorted(batches):
            drawn[k] = batches[k]
            first_of.setdefault(batches[k], k)
    return replayed


def _diff(ours: list[int], theirs: list[int]) -> str:
    extra, lacking = set(ours) - set(theirs), set(theirs) - set(ours)
    detail = []
    if extra:
        detail.append(f"used {intervals(extra)} which golden did not")
    if lacking:
        detail.append(f"lacks golden's {intervals(lacking)}")
    return "; ".join(detail) or "same ids, different multiplicity"


def _violation_summary(twice: dict[int, int], out: int, unc: int, mism: int, replayed: int, evidence: Evidence) -> str:
    """The count of repeats is of (epoch, id) pairs: an id repeated in two epochs counts twice, so
    it can exceed the dataset's size; the summary says so, with each epoch's share."""
    parts = []
    if twice:
        dup = sum(twice.values())
        split = ", ".join(f"epoch {e}: {n}" for e, n in sorted(twice.items()))
        parts.append(f"{dup} (epoch, id) pair(s) used twice within an epoch ({split})")
    if out:
        parts.append(f"{out} id(s) outside the dataset")
    if unc:
        parts.append(f"{unc} id(s) never used in a completed epoch")
    if mism:
        parts.append(f"{mism} step(s) whose batch differs from the golden run")
    if replayed:
        parts.append(f"{replayed} resumed step(s) replayed draws already in the lineage (sampling with replacement)")
    return "; ".join(parts) or evidence.lines[0]
