"""numpy passes over long integer columns.

A pure-Python pass over a column makes a Python int of every value: on the 1.6 M-event
benchmark run the coverage checker's sets, minima and maxima and the ascending checks took
most of the judgement. numpy does the same passes in C over the column's own buffer. The
report uses them too (report/plots.py: the coverage plot's counts and id bounds, the
checkpoint-age plot's distinct step times).

numpy is a dependency of the package already (torch's object collectives need it), but it
costs 0.1-0.3 s to import, so it is imported only for a range of at least VECTOR_MIN values:
small runs, and the thousands the tests judge, never pay for it, and a machine without it
judges through the pure-Python passes, which the tests hold to the same answers.
"""

from __future__ import annotations

from array import array
from typing import Any, Iterable, Sequence

VECTOR_MIN = 1 << 14
# The signed integer typecodes the columns use (history.py, _WIDTHS); numpy reads such an
# array through the buffer protocol, without a copy.
_INTEGER_CODES = frozenset("bhilq")


def numpy_or_none() -> Any:
    """numpy, imported on first use (a small run's check never loads it); None without it."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency; the callers fall back
        return None
    return numpy


def views(ranges: Iterable[tuple[Any, int, int]]) -> list[Any] | None:
    """numpy views of (column, start, stop) ranges whose columns are arrays of integers,
    when they hold VECTOR_MIN values or more together (a column on disk gives its range as
    such an array); None otherwise: a list column may hold ints beyond 64 bits.
    A view pins its array: no column may grow while one is held (loaded columns do not)."""
    ranges = list(ranges)
    if not _long(ranges) or numpy_or_none() is None:
        return None
    out = []
    for column, start, stop in ranges:
        view = _view(column, start, stop)
        if view is None:
            return None
        out.append(view)
    return out


def _long(ranges: list[tuple[Any, int, int]]) -> bool:
    """Worth numpy: VECTOR_MIN values or more, and no list column among them."""
    return sum(stop - start for _, start, stop in ranges) >= VECTOR_MIN and not any(
        isinstance(column, list) for column, _, _ in ranges)


def _view(column: Any, start: int, stop: int) -> Any | None:
    numpy = numpy_or_none()
    if isinstance(column, numpy.ndarray):  # one this module made: distinct ids so far
        return column[start:stop] if column.dtype.kind == "i" else None
    if type(column) is not array:  # a column on disk: its range read, as a pure-Python pass reads it
        column, start, stop = column[start:stop], 0, stop - start
    if type(column) is not array or column.typecode not in _INTEGER_CODES:
        return None
    return numpy.asarray(column)[start:stop]


def numbers(values: Any) -> Any | None:
    """A numpy view of an array of integers or of doubles holding VECTOR_MIN values or more; None
    otherwise (a list may hold ints beyond 64 bits or None), and for doubles with a NaN among them:
    Python's min() and max() answer by the NaN's place, numpy's by its presence."""
    if type(values) is not array or len(values) < VECTOR_MIN:
        return None  # before numpy's import: a small run's check never loads it
    numpy = numpy_or_none()
    if numpy is None or values.typecode not in _INTEGER_CODES and values.typecode != "d":
        return None
    view = numpy.asarray(values)
    if values.typecode == "d" and numpy.isnan(view).any():
        return None
    return view


def last_by_key(pairs: Sequence[tuple[Any, Any]]) -> tuple[list[int], list[float]] | None:
    """Each key of some (keys, values) pairs of columns with its value from the last pair to have it,
    keys ascending, as two lists: what a dict updated pair by pair and sorted would hold. None unless
    the keys are integers and the values doubles, in arrays or columns on disk (read whole, as the
    lists made of them are whole anyway), VECTOR_MIN of them or more together."""
    numpy = numpy_or_none()
    if sum(len(keys) for keys, _ in pairs) < VECTOR_MIN or numpy is None:
        return None
    keys_read, values_read = [], []
    for keys, values in pairs:
        keys, values = (c if type(c) is array else c[0 : len(c)] if hasattr(c, "typecode") else None
                        for c in (keys, values))
        if keys is None or values is None or keys.typecode not in _INTEGER_CODES or values.typecode != "d":
            return None
        keys_read.append(numpy.asarray(keys).astype(numpy.int64, copy=False))
        values_read.append(numpy.asarray(values))
    every_key, every_value = numpy.concatenate(keys_read), numpy.concatenate(values_read)
    order = every_key.argsort(kind="stable")  # a key's values stay in pair order: its last one is last
    every_key, every_value = every_key[order], every_value[order]
    last = numpy.ones(len(every_key), dtype=bool)
    numpy.not_equal(every_key[1:], every_key[:-1], out=last[:-1])
    return every_key[last].tolist(), every_value[last].tolist()


def distinct(ranges: Sequence[tuple[Any, int, int]]) -> Any | None:
    """The distinct values of the ranges, sorted, as one numpy array of int64; None when
    `views` declines them."""
    parts = views(ranges)
    if parts is None:
        return None
    numpy = numpy_or_none()
    return _sorted_distinct(numpy.concatenate([part.astype(numpy.int64, copy=False) for part in parts]))


def ascending(column: Any, strict: bool, lo: int, hi: int) -> bool | None:
    """Whether column[lo:hi] ascends (strictly: no repeat; a NaN anywhere: no, as Python's
    comparisons say); None when `views` declines it, an array of doubles aside (a lane's times)."""
    if type(column) is array and column.typecode == "d":
        if hi - lo < VECTOR_MIN or numpy_or_none() is None:
            return None
        values = numpy_or_none().asarray(column)[lo:hi]
    else:
        parts = views([(column, lo, hi)])
        if parts is None:
            return None
        (values,) = parts
    later, earlier = values[1:], values[:-1]
    return bool((later > earlier).all() if strict else (later >= earlier).all())


def bounds(ranges: Sequence[tuple[Any, int, int]]) -> tuple[int, int] | None:
    """(lowest, highest) value of the ranges, read one range at a time (a column on disk is never
    read whole); None when they are empty or not for numpy (see `views`)."""
    ranges = [r for r in ranges if r[2] > r[1]]
    if not ranges or not _long(ranges) or numpy_or_none() is None:
        return None
    lows, highs = [], []
    for column, start, stop in ranges:
        view = _view(column, start, stop)
        if view is None:
            return None
        lows.append(int(view.min()))
        highs.append(int(view.max()))
    return min(lows), max(highs)


def consecutive_runs(column: Any) -> list[list[int]] | None:
    """The column's distinct values as runs of consecutive integers, [[first, last], ...] ascending
    ([1, 2, 3, 7, 8] -> [[1, 3], [7, 8]]); None when `views` declines the column."""
    values = distinct([(column, 0, len(column))])
    if values is None:
        return None
    numpy = numpy_or_none()
    if not len(values):
        return []
    breaks = (numpy.flatnonzero(values[1:] != values[:-1] + 1) + 1).tolist()
    starts, ends = [0, *breaks], [*breaks, len(values)]
    return [[int(values[i]), int(values[j - 1])] for i, j in zip(starts, ends)]


def count_within(ordered: Any, lo: int, hi: int) -> int:
    """How many values of a sorted numpy array lie in lo..hi-1."""
    return int(ordered.searchsorted(hi, "left") - ordered.searchsorted(lo, "left"))


def distinct_floats(columns: Sequence[Any]) -> list[float] | None:
    """Each distinct value of some columns of doubles once, ascending, as Python floats; None when
    they hold fewer than VECTOR_MIN values together or one is not of doubles (a column on disk is
    read one column at a time: one copy of it and the distinct values so far are held at once)."""
    if sum(map(len, columns)) < VECTOR_MIN or numpy_or_none() is None:
        return None
    numpy = numpy_or_none()
    seen = numpy.empty(0)
    for column in columns:
        if type(column) is not array and getattr(column, "typecode", None) == "d":
            column = column[0 : len(column)]  # a column on disk, read into an array
        if type(column) is not array or column.typecode != "d":
            return None
        seen = _sorted_distinct(numpy.concatenate([seen, numpy.asarray(column)]))
    return seen.tolist()


def _sorted_distinct(values: Any) -> Any:
    """A new numpy array of the distinct values, ascending: sorted, then each value unlike the
    one before it (numpy 2's `unique` hashes instead, 10 times slower on 32 000-id epochs here)."""
    numpy = numpy_or_none()
    values = values.copy() if values.base is not None else values  # never sort a column's own buffer
    values.sort()
    first = numpy.empty(len(values), dtype=bool)
    first[:1] = True
    numpy.not_equal(values[1:], values[:-1], out=first[1:])
    return values[first]
