"""Columns on disk: a long run's history judged in bounded memory.

A real run of a hundred million events reports tens of millions of sample ids and millions
of updates; as arrays in memory (invariants/history.py) they take gigabytes. When a run's
event files hold SPILL_MIN_BYTES or more, the loader gives every rank log columns that live
in a scratch file instead: values are appended to a short in-memory tail, written out a
chunk (CHUNK values) at a time, and read back a chunk at a time through one cache of
CACHE_CHUNKS chunks shared by every column. What the checkers keep in memory is then the
tails of the rank logs being read, the cache, and what they build themselves (one epoch's
set of ids for coverage; the sparse events), not the columns.

A column on disk answers what an array answers - len, indexing, slices (as arrays), iteration,
equality, count, bisect - so every checker reads it unchanged, and the reader tests judge every
history of the suite both ways and compare (tests/invariants/readers.py). A value a column
cannot hold (an integer beyond 64 bits, a loss that is not a float, a digest that is not an
ASCII string of the column's width) turns that one column back into a list in memory.

The scratch folder is made with mkdtemp (mode 0700) under $TMPDIR, named
trainwreck-spill-*, and removed with its history (or at exit).
"""
from __future__ import annotations

import bisect as _bisect
import operator
import os
import re
import shutil
import tempfile
import weakref
from array import array
from collections import OrderedDict
from itertools import chain, compress, repeat
from typing import Any, Iterable, Iterator, Sequence

from trainwreck.invariants import vectors

SPILL_MIN_BYTES = 256 << 20
"""Event files of at least this many bytes in all are read into columns on disk (about 3 M
events of the benchmark's shape; below it, the arrays take some tens of MB)."""
CHUNK = 1 << 16
"""Values per chunk written: 512 KB of integers."""
CACHE_BYTES = 16 << 20
"""Chunks read back are kept up to about this many bytes over all columns (32 chunks of integers;
a chunk of digests decoded into strings counts at what the strings take)."""

_FDS: dict[str, int] = {}
_SIZES: dict[str, int] = {}
_CACHE: OrderedDict[tuple[str, int, bool], tuple[Any, int]] = OrderedDict()
_CACHED = [0]  # bytes held by _CACHE


class SpillError(Exception):
    """The scratch file could not be written (a full or read-only $TMPDIR); the loader makes it an
    InputError, so `trainwreck check` exits 2 with this message."""


class Scratch:
    """One history's scratch folder; each process that writes columns has its own file in it."""

    def __init__(self) -> None:
        try:
            self.dir = tempfile.mkdtemp(prefix="trainwreck-spill-")
        except OSError as exc:
            raise SpillError(f"cannot make the checker's scratch folder in {tempfile.gettempdir()}: {exc.strerror}; "
                             "set TMPDIR to a writable folder") from None
        weakref.finalize(self, _remove, self.dir, os.getpid())

    def path(self) -> str:
        """This process's file (a worker parsing in parallel writes its own)."""
        return os.path.join(self.dir, f"columns-{os.getpid()}.bin")


def _remove(folder: str, owner: int) -> None:
    if os.getpid() != owner:
        return  # a forked child exiting: the folder is its parent's
    for path in [p for p in _FDS if os.path.dirname(p) == folder]:
        os.close(_FDS.pop(path))
        _SIZES.pop(path, None)
    for key in [k for k in _CACHE if os.path.dirname(k[0]) == folder]:
        _CACHED[0] -= _CACHE.pop(key)[1]
    shutil.rmtree(folder, ignore_errors=True)


def _fd(path: str) -> int:
    fd = _FDS.get(path)
    if fd is None:
        fd = _FDS[path] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    return fd


def _append(path: str, data: bytes) -> int:
    """Write `data` at the end of this process's file; its offset."""
    offset = _SIZES.get(path, 0)
    try:
        written = os.pwrite(_fd(path), data, offset)
    except OSError as exc:
        raise SpillError(f"cannot write the checker's scratch file {path}: {exc.strerror}; set TMPDIR to a "
                         "folder on a disk with room (about 45 bytes per event: 8 per integer)") from None
    if written != len(data):
        raise SpillError(f"short write to the checker's scratch file {path}: the disk is full; set TMPDIR to a "
                         "folder on a disk with room (about 45 bytes per event: 8 per integer)")
    _SIZES[path] = offset + len(data)
    return offset


def _read(path: str, offset: int, size: int, decode: Any, raw: bool = False, cost: int = 0) -> Any:
    """A chunk's value, `decode`d from its bytes, through the cache (`cost`: its bytes in memory)."""
    key = (path, offset, raw)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit[0]
    value = decode(os.pread(_fd(path), size, offset))
    cost = cost or size
    _CACHE[key] = (value, cost)
    _CACHED[0] += cost
    while _CACHED[0] > CACHE_BYTES and len(_CACHE) > 1:
        _CACHED[0] -= _CACHE.popitem(last=False)[1][1]
    return value


class _Chunked:
    """What both column kinds share: chunks written (offset, first index) and an in-memory tail."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offsets = array("q")  # the file offset of each written chunk
        self.starts = array("q", [0])  # the index of each written chunk's first value; the last: values written
        self.tail: Any = self._empty()

    def _empty(self) -> Any:
        raise NotImplementedError

    def _encode(self, values: Any) -> bytes:
        raise NotImplementedError

    def _decoder(self, count: int) -> Any:
        raise NotImplementedError

    def _size(self, count: int) -> int:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.starts[-1] + len(self.tail)

    def _flush(self, everything: bool) -> None:
        while len(self.tail) >= CHUNK or (everything and self.tail):
            part = self.tail[:CHUNK]
            self.offsets.append(_append(self.path, self._encode(part)))
            self.starts.append(self.starts[-1] + len(part))
            self._written(part)
            del self.tail[:CHUNK]

    def _written(self, part: Any) -> None:
        """Note what an index of the column needs of a chunk just written."""

    def seal(self) -> None:
        """Write the tail out: nothing of this column stays in memory but its chunk table."""
        self._flush(True)

    def chunk(self, k: int) -> Any:
        """The values of written chunk k (len(self.offsets): the tail)."""
        if k == len(self.offsets):
            return self.tail
        count = self.starts[k + 1] - self.starts[k]
        return _read(self.path, self.offsets[k], self._size(count), self._decoder(count), cost=self._cost(count))

    def _cost(self, count: int) -> int:
        """Bytes a decoded chunk of `count` values takes in memory (0: its size on disk)."""
        return 0

    def chunks(self) -> Iterator[Any]:
        for k in range(len(self.offsets) + 1):
            yield self.chunk(k)

    def __iter__(self) -> Iterator[Any]:
        for part in self.chunks():
            yield from part

    def _pieces(self, start: int, stop: int) -> Iterator[Any]:
        """The values start..stop-1, a chunk's worth at a time."""
        k = _bisect.bisect_right(self.starts, start) - 1
        while start < stop:
            base = self.starts[k]  # for the tail (k == len(self.offsets)) the values written
            part = self.chunk(k)
            yield part[start - base : stop - base]
            start = base + len(part)
            k += 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            out = self._empty()
            if stop > start:
                for piece in self._pieces(start, stop):
                    out.extend(piece)
            return out[::step] if step != 1 else out
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("column index out of range")
        k = _bisect.bisect_right(self.starts, i) - 1
        if k >= len(self.offsets):
            return self.tail[i - self.starts[-1]]
        return self._item(k, i - self.starts[k])

    def _item(self, k: int, j: int) -> Any:
        return self.cut(self.piece(k), k, j)

    def piece(self, k: int) -> Any:
        """What `cut` takes value j of written chunk k from: the chunk."""
        return self.chunk(k)

    def cut(self, piece: Any, k: int, j: int) -> Any:
        return piece[j]

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if not isinstance(other, (_Chunked, array, list)) or len(self) != len(other):
            return False
        return same_range(self, 0, other, 0, len(self))

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def count(self, value: Any) -> int:
        return sum(part.count(value) for part in self.chunks())


def extend_column(column: Any, values: Iterable[Any]) -> None:
    """Append `values` to a column. To an array in C, whole or not at all: OverflowError or
    TypeError, nothing appended, for a value its type cannot hold. An array built from a list and
    then appended (a copy) is faster than `array.extend` of the list, which appends value by value:
    400 000 ids took 9 ms against 24 (2026-11-28), and the ids are the largest column a block adds.
    Any other column (a list, a column on disk) appends by its own `extend`."""
    if not isinstance(column, array):
        column.extend(values)
        return
    if not (isinstance(values, array) and values.typecode == column.typecode):
        values = array(column.typecode, values)
    column.extend(values)


class DiskNumbers(_Chunked):
    """Integers ('q': 64-bit) or floats ('d') on disk."""

    def __init__(self, path: str, typecode: str) -> None:
        self.typecode = typecode
        self.firsts = array(typecode)  # the first value of each written chunk: bisect reads one chunk
        super().__init__(path)

    def _written(self, part: Any) -> None:
        self.firsts.append(part[0])

    def bisect(self, x: Any, lo: int = 0, hi: int | None = None, right: bool = False) -> int:
        """bisect_left (bisect_right when `right`) of the values lo..hi-1, which must ascend (the rest
        of the column need not), reading one chunk: the chunks' first values say which."""
        hi = len(self) if hi is None else hi
        if lo >= hi:
            return lo
        find = _bisect.bisect_right if right else _bisect.bisect_left
        written = len(self.offsets)
        k_lo = _bisect.bisect_right(self.starts, lo) - 1
        k_hi = _bisect.bisect_right(self.starts, hi - 1) - 1
        chosen = k_lo  # the last chunk of the range whose first value (in the range) is before x
        last_written = min(k_hi, written - 1)
        if last_written > k_lo:
            c = find(self.firsts, x, k_lo + 1, last_written + 1) - 1
            chosen = max(chosen, c)
        if k_hi == written and k_hi > k_lo and chosen == last_written and (
                self.tail[0] <= x if right else self.tail[0] < x):
            chosen = written
        base = self.starts[chosen]
        part = self.chunk(chosen)
        return base + find(part, x, max(lo - base, 0), min(hi - base, len(part)))

    def _empty(self) -> Any:
        return array(self.typecode)

    def _encode(self, values: Any) -> bytes:
        return values.tobytes()

    def _size(self, count: int) -> int:
        return count * self.tail.itemsize

    def _decoder(self, count: int) -> Any:
        typecode = self.typecode

        def decode(data: bytes) -> Any:
            values = array(typecode)
            values.frombytes(data)
            return values
        return decode

    def extend(self, values: Iterable[Any]) -> None:
        """Append; OverflowError or TypeError (nothing appended) for a value the type cannot hold."""
        extend_column(self.tail, values)
        self._flush(False)


class DiskStrings(_Chunked):
    """Digests on disk: None, or ASCII strings all of one width (the first string's)."""

    def __init__(self, path: str) -> None:
        self.width: int | None = None
        super().__init__(path)

    def _empty(self) -> Any:
        return []

    def _written(self, part: Any) -> None:
        # Chunks on disk are read at the width they were written with: a chunk of None alone
        # fixes it at 0, and a string that comes later does not fit (the column becomes a list).
        if self.width is None:
            self.width = 0

    def _size(self, count: int) -> int:
        return count * (1 + (self.width or 0))

    def _encode(self, values: Any) -> bytes:
        """The chunk as its flags (1: a string, 0: None), then its strings, each `width` bytes."""
        blank = " " * (self.width or 0)
        flags = bytes(v is not None for v in values)
        return flags + "".join(blank if v is None else v for v in values).encode("ascii")

    def _decoder(self, count: int) -> Any:
        width = self.width or 0

        def decode(data: bytes) -> list[Any]:
            flags, text = data[:count], data[count:].decode("ascii")
            values: list[Any] = re.findall(f"(?s).{{{width}}}", text) if width else [""] * count
            if flags.count(0):
                values = [v if f else None for v, f in zip(values, flags)]
            return values
        return decode

    def _cost(self, count: int) -> int:
        return count * (57 + (self.width or 0))  # a str object and its slot in the list

    def _raw(self, k: int) -> bytes:
        count = self.starts[k + 1] - self.starts[k]
        return _read(self.path, self.offsets[k], self._size(count), bytes, raw=True)

    def __eq__(self, other: object) -> bool:
        if (isinstance(other, DiskStrings) and other.width == self.width and other.starts == self.starts
                and other is not self):  # chunk for chunk, as bytes: no string decoded
            return other.tail == self.tail and all(self._raw(k) == other._raw(k) for k in range(len(self.offsets)))
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def piece(self, k: int) -> Any:
        """The chunk's bytes: a digest is cut from them, no list of the whole chunk decoded."""
        return self._raw(k)

    def cut(self, piece: Any, k: int, j: int) -> Any:
        count = self.starts[k + 1] - self.starts[k]
        width = self.width or 0
        return piece[count + j * width : count + (j + 1) * width].decode("ascii") if piece[j] else None

    def fits(self, values: list[Any]) -> bool:
        """Whether every value is None or an ASCII string of this column's width (fixing it if unset)."""
        for v in values:
            if v is None:
                continue
            if type(v) is not str or not v.isascii():
                return False
            if self.width is None:
                self.width = len(v)
            elif len(v) != self.width:
                return False
        return True

    def extend(self, values: list[Any]) -> None:
        """Append; ValueError (nothing appended) when a value does not fit."""
        if not self.fits(values):
            raise ValueError("a digest that does not fit the column")
        self.tail.extend(values)
        self._flush(False)

    def append(self, value: Any) -> None:
        self.extend([value])

    def count(self, value: Any) -> int:
        if value is None:  # the flag bytes alone, no string decoded
            return self.tail.count(None) + sum(self._raw(k)[: self.starts[k + 1] - self.starts[k]].count(0)
                                               for k in range(len(self.offsets)))
        return super().count(value)



def seal(columns: Iterable[Any]) -> None:
    """Write out the tails of the columns on disk among `columns`."""
    for column in columns:
        if isinstance(column, _Chunked):
            column.seal()


def ascending(column: Any, strict: bool, lo: int = 0, hi: int | None = None) -> bool:
    """Whether the values lo..hi-1 of a column of numbers ascend (strictly: no repeat), a chunk at a
    time on disk."""
    step = operator.lt if strict else operator.le
    hi = len(column) if hi is None else hi

    def within(values: Any, lo: int, hi: int) -> bool:
        fast = vectors.ascending(values, strict, lo, hi)
        if fast is not None:
            return fast
        values = values[lo:hi] if lo or hi != len(values) else values
        return all(map(step, values, values[1:]))

    if not isinstance(column, _Chunked):
        return within(column, lo, hi)
    last = None
    for part in column._pieces(lo, hi):
        if not part:
            continue
        if last is not None and not step(last, part[0]):
            return False
        if not within(part, 0, len(part)):
            return False
        last = part[-1]
    return True


def positions(column: Any, wanted: Sequence[int]) -> list[int]:
    """The index of each value of `wanted` (ascending) in a column that ascends without a repeat, -1
    where it is absent: a bisect each in memory; on disk the column read once, a chunk at a time, each
    chunk searched for all the values it can hold at once (a bisect each read a chunk, 17 us apiece)."""
    numpy = vectors.numpy_or_none() if isinstance(column, _Chunked) and len(wanted) >= 2 else None
    if numpy is None:
        found = [bisect_left(column, x) for x in wanted]
        return [i if i < len(column) and column[i] == x else -1 for i, x in zip(found, wanted)]
    out: list[int] = []
    for k, part in enumerate(column.chunks()):
        if not len(part):
            continue
        j = _bisect.bisect_right(wanted, part[-1], len(out))
        if j == len(out):
            continue
        # Values below the chunk are absent (numpy could not even hold one beyond 64 bits).
        out.extend([-1] * (_bisect.bisect_left(wanted, part[0], len(out)) - len(out)))
        values, asked = numpy.asarray(part), numpy.asarray(wanted[len(out) : j], dtype=numpy.int64)
        at = values.searchsorted(asked)  # part[0] <= asked <= part[-1]
        out.extend(numpy.where(values[at] == asked, at + column.starts[k], -1).tolist())
    return out + [-1] * (len(wanted) - len(out))


def take(column: Any, indices: Sequence[int]) -> list[Any]:
    """[column[i] for i in indices], None for an index of -1, the others ascending: on disk each chunk
    is looked up once for all of its own values (an index at a time, 11 us apiece)."""
    if not isinstance(column, _Chunked):
        return [column[i] if i >= 0 else None for i in indices]
    out: list[Any] = []
    k, written, part = 0, len(column.offsets), None
    for i in indices:
        if i < 0:
            out.append(None)
            continue
        while k < written and i >= column.starts[k + 1]:
            k, part = k + 1, None
        if k == written:
            out.append(column.tail[i - column.starts[k]])
            continue
        part = column.piece(k) if part is None else part
        out.append(column.cut(part, k, i - column.starts[k]))
    return out


def aligned(a: Any, b: Any) -> Iterator[tuple[Any, Any]]:
    """The values of two columns of one length side by side, a chunk's worth of each at a time
    (slices: arrays for arrays and columns on disk, lists for lists)."""
    for start in range(0, len(a), CHUNK):
        yield a[start : start + CHUNK], b[start : start + CHUNK]


def extremes(column: Any) -> tuple[Any, Any] | None:
    """(min(column), max(column)) of a column of numbers, a chunk at a time on disk and through numpy
    where `vectors.numbers` takes a chunk; None when the column is empty."""
    low: list[Any] = []  # empty until a value is seen
    high: list[Any] = []
    for part in column.chunks() if isinstance(column, _Chunked) else [column]:
        if not len(part):
            continue
        fast = vectors.numbers(part)
        low = _fold(min, low, _as_python(part, None if fast is None else fast.min().item()))
        high = _fold(max, high, _as_python(part, None if fast is None else fast.max().item()))
    return (low[0], high[0]) if low else None


def _as_python(values: Any, found: Any) -> Any:
    """[numpy's `found`], or the values themselves for pick() to read where numpy declined them
    (None) or found a zero of doubles: numpy's min of 0.0 and -0.0 is the one it met last, min()'s the
    first, and a report prints the sign."""
    return values if found is None or (found == 0 and type(found) is float) else [found]


def _fold(pick: Any, best: list[Any], values: Iterable[Any]) -> list[Any]:
    """[pick(the values so far, then these)]: min() and max() go left to right, so chunk after chunk
    they answer as over the whole column, a NaN included (kept only where it came first)."""
    found = pick(chain(best, values), default=_EMPTY)
    return [] if found is _EMPTY else [found]


_EMPTY = object()


def extreme_where(values: Any, keys: Any, keep: Any, bound: Any, highest: bool) -> Any:
    """max (`highest`) or min of values[i] over each i where keep(keys[i], bound) holds (`keep`: a
    comparison of the operator module, which numpy applies to a whole chunk), as the pure-Python
    max(compress(values, map(keep, keys, repeat(bound))), default=None) says; None where no key does."""
    pick = max if highest else min
    best: list[Any] = []
    for some, their_keys in aligned(values, keys):
        fast, fast_keys = vectors.numbers(some), vectors.numbers(their_keys)
        found = None
        if fast is not None and fast_keys is not None:
            chosen = fast[keep(fast_keys, bound)]
            if not len(chosen):
                continue
            found = (chosen.max() if highest else chosen.min()).item()
        best = _fold(pick, best, _as_python(compress(some, map(keep, their_keys, repeat(bound))), found))
    return best[0] if best else None


def same_range(a: Any, i: int, b: Any, k: int, n: int) -> bool:
    """a[i:i+n] == b[k:k+n], compared a chunk at a time when either is on disk."""
    if not isinstance(a, _Chunked) and not isinstance(b, _Chunked):
        return bool(a[i : i + n] == b[k : k + n])
    for at in range(0, n, CHUNK):
        size = min(CHUNK, n - at)
        mine, theirs = a[i + at : i + at + size], b[k + at : k + at + size]
        if type(mine) is not type(theirs):
            mine, theirs = list(mine), list(theirs)
        if mine != theirs:
            return False
    return True


def bisect_left(column: Any, x: Any, lo: int = 0, hi: int | None = None) -> int:
    """bisect.bisect_left for any column: one chunk read when it is on disk."""
    if isinstance(column, DiskNumbers):
        return column.bisect(x, lo, hi)
    return _bisect.bisect_left(column, x, lo, len(column) if hi is None else hi)


def bisect_right(column: Any, x: Any, lo: int = 0, hi: int | None = None) -> int:
    """bisect.bisect_right for any column: one chunk read when it is on disk."""
    if isinstance(column, DiskNumbers):
        return column.bisect(x, lo, hi, right=True)
    return _bisect.bisect_right(column, x, lo, len(column) if hi is None else hi)
