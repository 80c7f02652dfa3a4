"""The History of a run: what its run directory says happened.

Speed and memory matter: a 100 000-step x 8-rank run has ~1.6M events, a long
real run a hundred million. The two bulk kinds, `batch` and `step`, are stored
as columns per (attempt, rank) in a `RankLog` (a step's time too, and its phases
when asked, so that the report never reads them again): integers in `array`s of the
narrowest item type that holds them (widened as larger values arrive; a plain
list past 64 bits), losses in an `array('d')` while they are all floats, digests
in a list of strings - no object per event. A column equal to the one of the
attempt's first rank log is that very object (the loader shares it: replicas
report the same steps, digests and batch shapes), so only sample ids cost
memory per rank. A run too big for that keeps its columns on disk instead
(invariants/spill.py: they answer as arrays do, a chunk at a time). Every other
kind is kept as its dict, in order, in `History.events`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from trainwreck.invariants.spill import (DiskNumbers, DiskStrings, bisect_left, bisect_right, extend_column, positions,
                                         take)

FORMAT = "trainwreck-run/1"
SAMPLINGS = ("without_replacement", "with_replacement")
"""run.json's optional `sampling` (the first when absent): whether each id is drawn once per epoch
(a sampler's permutation) or independently at every draw (random windows); coverage checks each."""
# The checker may import nothing of ours, so it names the format itself; rundir/events.py
# FORMAT is the writer's, and tests/trainer/test_vocabulary.py holds the two equal.

Pos = tuple[float, str, int]  # (t, file, line): where an event was written


class InputError(Exception):
    """The run directory cannot be judged; the message names file, line, field."""


# A column of integers: an array of the narrowest type that holds them, or a list
# once a value needs more than 64 bits. Index, slice, iterate and bisect it like a
# list; compare a slice with `list(...)` (an array never equals a list).
Ints = Union["array[int]", list[int], DiskNumbers]
_WIDTHS = (("b", 7), ("h", 15), ("i", 31), ("q", 63))


def ints() -> Ints:
    return array("b")


def extend_ints(column: Ints, values: Sequence[int]) -> Ints:
    """`column` with `values` appended, widened first when one does not fit;
    returns the column to keep (the same object unless it was widened)."""
    if not values:
        return column
    if isinstance(column, DiskNumbers):
        try:
            column.extend(values)
            return column
        except OverflowError:  # beyond 64 bits: this column goes back to memory, as a list
            column = list(column)
    if isinstance(column, array):
        # Most values fit the column as it is: try that first (one C-level pass, no
        # min/max); a value that does not fit raises OverflowError, nothing appended.
        try:
            extend_column(column, values)
            return column
        except OverflowError:
            pass
        lo, hi = min(values), max(values)
        bits = column.itemsize * 8 - 1
        if lo < -(1 << bits) or hi >= 1 << bits:
            code = next((c for c, b in _WIDTHS if b > bits and -(1 << b) <= lo and hi < 1 << b), None)
            column = array(code, column) if code else list(column)
    extend_column(column, values)
    return column


def floats() -> "array[float] | list[Any]":
    return array("d")


def extend_losses(column: "array[float] | list[Any] | DiskNumbers", values: Sequence[Any]
                  ) -> "array[float] | list[Any] | DiskNumbers":
    """Losses stay an array of doubles while every one is a float; anything else
    (None, an int, a string) turns the column into a list, values unchanged."""
    if isinstance(column, (array, DiskNumbers)) and not set(map(type, values)) <= {float}:
        column = list(column)
    extend_column(column, values)
    return column


def extend_digests(column: "list[Any] | DiskStrings", values: list[Any]) -> "list[Any] | DiskStrings":
    """Digests stay on disk while each is None or an ASCII string of the column's width;
    anything else turns the column into a list, values unchanged."""
    if isinstance(column, DiskStrings):
        try:
            column.extend(values)
            return column
        except ValueError:
            column = list(column)
    column.extend(values)
    return column


@dataclass
class RankLog:
    """The `step` and `batch` events of one rank in one attempt, as columns."""

    attempt: int
    rank: int
    world_size: int
    # `step` events, ascending by update number, one per update (repeats are
    # moved to History.duplicate_steps).
    steps: Ints = field(default_factory=ints)
    losses: "array[float] | list[Any] | DiskNumbers" = field(default_factory=floats)  # float, int or None
    digests: "list[Any] | DiskStrings" = field(default_factory=list)
    # Each `step` event's time `t` (seconds, as a float): the report draws progress with it.
    times: "array[float] | DiskNumbers" = field(default_factory=floats)
    # Each `step` event's `phases` (None where absent), kept only when load_history was asked
    # for them (report=True: the report); None, not a column, otherwise.
    phases: list[Any] | None = None
    # `batch` events, ascending by update number (a repeat stays: if a rank
    # really used samples twice for one update, coverage must see it).
    batch_steps: Ints = field(default_factory=ints)
    epochs: Ints = field(default_factory=ints)
    # The ids of batch event i are ids[offsets[i]:offsets[i + 1]].
    offsets: Ints = field(default_factory=lambda: array("b", [0]))
    ids: Ints = field(default_factory=ints)
    first_pos: Pos | None = None  # where this rank first trained in this attempt
    batch_t0: float | None = None  # the earliest `t` of its batch events (the report's clock starts there or before)

    def batch_range(self, first: int, last: int) -> tuple[int, int]:
        """Indices [i, j) of the batch events for updates first..last."""
        return bisect_left(self.batch_steps, first), bisect_right(self.batch_steps, last)

    def samples(self, index: int) -> list[int]:
        return list(self.ids[self.offsets[index] : self.offsets[index + 1]])

    def digest_at(self, step: int) -> Any:
        """The digest reported for update `step` (None if none), without building
        a dict of every step: `steps` is ascending and unique."""
        i = bisect_left(self.steps, step)
        return self.digests[i] if i < len(self.steps) and self.steps[i] == step else None

    def digests_at(self, steps: Sequence[int]) -> list[Any]:
        """digest_at of each of some updates, ascending: on disk, the steps read once (spill.positions)."""
        return take(self.digests, positions(self.steps, steps))

    def step_index(self) -> dict[int, int]:
        cache = self.__dict__.get("_step_index")
        if cache is None:
            cache = self.__dict__["_step_index"] = dict(zip(self.steps, range(len(self.steps))))
        return cache

    def digest_by_step(self) -> dict[int, Any]:
        cache = self.__dict__.get("_digests")
        if cache is None:
            cache = self.__dict__["_digests"] = dict(zip(self.steps, self.digests))
        return cache


@dataclass
class History:
    """Everything a run directory says happened, ready for the checkers."""

    run_dir: str
    spec: dict[str, Any]
    # Every event except batch/step, ordered by (t, file, line). Each carries
    # "_src" ("events/<file>:<line>") and "_pos" ((t, file, line)); `t` is a float.
    events: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[tuple[int, int], RankLog] = field(default_factory=dict)  # (attempt, rank) ->
    # attempt -> world size, from the `world_size` of its batch/step events.
    world_sizes: dict[int, int] = field(default_factory=dict)
    # A repeated `step` event: (attempt, step, rank, loss, digest, src).
    duplicate_steps: list[tuple[int, int, int, Any, Any, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    event_count: int = 0
    # load_history(report=True) only: "events/<file>" -> line number -> the bytes of each line that
    # is not a batch or step event, and of each file's last line - what the report's forgiving
    # reader needs besides the columns, so that it never reads the files again. None otherwise.
    lines: dict[str, dict[int, bytes]] | None = None

    @property
    def has_events(self) -> bool:
        return self.event_count > 0

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """Sparse events of one kind, in order (batch/step live in `logs`)."""
        cache = self.__dict__.get("_by_kind")
        if cache is None:
            cache = {}
            for ev in self.events:
                cache.setdefault(ev["kind"], []).append(ev)
            self.__dict__["_by_kind"] = cache
        return cache.get(kind, [])

    def ranks_of(self, attempt: int) -> list[RankLog]:
        """The rank logs of one attempt, by rank."""
        cache = self.__dict__.setdefault("_ranks_of", {})
        logs = cache.get(attempt)
        if logs is None or sum(len(x) for x in cache.values()) != len(self.logs):
            cache.clear()
            for (a, _), log in sorted(self.logs.items()):
                cache.setdefault(a, []).append(log)
            logs = cache.get(attempt)
        return list(logs or [])

    def attempts(self) -> list[int]:
        """Attempts that left rank events (work, restores, saves or starts)."""
        seen = {a for a, _ in self.logs}
        for kind in ("start", "restore", "reject", "save"):
            seen.update(ev["attempt"] for ev in self.of_kind(kind))
        return sorted(seen)

    def attempts_run(self) -> list[int]:
        """Attempts the job ran: those that left rank events, and those the harness saw exit
        (an attempt whose ranks died before their probe wrote anything, in `torch.load` say)."""
        seen = set(self.attempts())
        seen.update(ev["attempt"] for ev in self.of_kind("exit") if type(ev.get("attempt")) is int)
        return sorted(seen)

    def attempt_count(self) -> int:
        """Attempts the job made: one more than the highest attempt mentioned."""
        highest = max((a for a, _ in self.logs), default=-1)
        for ev in self.events:
            a = ev.get("attempt")
            if type(a) is int and a > highest:
                highest = a
        return highest + 1

    def last_step(self, attempt: int) -> int | None:
        """The last update any rank of the attempt reported applied."""
        lasts = [log.steps[-1] for log in self.ranks_of(attempt) if log.steps]
        return max(lasts) if lasts else None

    def reference_steps(self, attempt: int) -> dict[int, tuple[Any, Any]]:
        """step -> (loss, digest) of the attempt's lowest rank that
        reported each update (rank 0 normally; replicas judges agreement)."""
        cache = self.__dict__.setdefault("_reference", {})
        table = cache.get(attempt)
        if table is None:
            table = {}
            for log in self.ranks_of(attempt):
                if not table:
                    table = dict(zip(log.steps, zip(log.losses, log.digests)))
                    continue
                extra = set(log.steps) - table.keys()
                index = log.step_index()
                for k in extra:
                    table[k] = (log.losses[index[k]], log.digests[index[k]])
            cache[attempt] = table
        return table

    def step_record(self, attempt: int, step: int) -> tuple[Any, Any] | None:
        """(loss, digest) of one update, from `reference_steps`."""
        record = self.reference_steps(attempt).get(step)
        return record

    def step_table(self, attempt: int) -> dict[int, dict[int, tuple[Any, Any]]]:
        """step -> rank -> (loss, digest); convenient, not fast."""
        table: dict[int, dict[int, tuple[Any, Any]]] = {}
        for log in self.ranks_of(attempt):
            for k, loss, digest in zip(log.steps, log.losses, log.digests):
                table.setdefault(k, {})[log.rank] = (loss, digest)
        return table

    def batch_table(self, attempt: int) -> dict[int, dict[int, tuple[int, list[int]]]]:
        """step -> rank -> (epoch, samples); convenient, not fast."""
        table: dict[int, dict[int, tuple[int, list[int]]]] = {}
        for log in self.ranks_of(attempt):
            for i, k in enumerate(log.batch_steps):
                entry = table.setdefault(k, {})
                samples = log.samples(i)
                if log.rank in entry:
                    samples = entry[log.rank][1] + samples
                entry[log.rank] = (log.epochs[i], samples)
        return table

    def global_batch(self, attempt: int, step: int) -> list[int] | None:
        """The sorted ids of one update over all ranks of the attempt; None if
        no rank reported a batch for it."""
        ids: list[int] = []
        found = False
        for log in self.ranks_of(attempt):
            i, j = log.batch_range(step, step)
            if i < j:
                found = True
                ids.extend(log.ids[log.offsets[i] : log.offsets[j]])
        return sorted(ids) if found else None
