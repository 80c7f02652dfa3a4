"""invariants/vectors.py's numpy passes give the pure-Python passes' answers, on arrays and on
columns on disk read a chunk at a time (spill.ascending; chunks of 4 here, so every pass crosses
boundaries)."""
from __future__ import annotations

import math
from array import array
from itertools import islice
from operator import le
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwreck.invariants import spill, vectors
from trainwreck.report.model import ranges

FUNCTION_FIXTURE = [HealthCheck.function_scoped_fixture]


@pytest.fixture
def everywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """numpy for any length, and chunks of 4 values on disk."""
    monkeypatch.setattr(vectors, "VECTOR_MIN", 1)
    monkeypatch.setattr(spill, "CHUNK", 4)
    return tmp_path / "columns.bin"


def on_disk(path: Path, typecode: str, values: list) -> spill.DiskNumbers:
    column = spill.DiskNumbers(str(path), typecode)
    column.extend(values)
    column.seal()
    return column


def pairwise_never_decreases(values: list) -> bool:
    return all(map(le, values, islice(values, 1, None)))


@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(values=st.lists(st.one_of(st.floats(-5, 5), st.just(math.nan)), min_size=1, max_size=30),
       ascend=st.booleans())
def test_ascending_answers_as_the_pairwise_pass_on_doubles_nans_included(
        everywhere: Path, values: list[float], ascend: bool) -> None:
    values = sorted(values) if ascend and not any(map(math.isnan, values)) else values
    expected = pairwise_never_decreases(values)
    assert vectors.ascending(array("d", values), False, 0, len(values)) is expected
    assert spill.ascending(array("d", values), strict=False) is expected
    assert spill.ascending(on_disk(everywhere, "d", values), strict=False) is expected


@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(values=st.lists(st.integers(0, 12), min_size=1, max_size=30), ascend=st.booleans())
def test_ascending_answers_as_the_pairwise_pass_on_integers_across_chunk_boundaries(
        everywhere: Path, values: list[int], ascend: bool) -> None:
    values = sorted(values) if ascend else values
    expected = pairwise_never_decreases(values)
    assert spill.ascending(array("q", values), strict=False) is expected
    assert spill.ascending(on_disk(everywhere, "q", values), strict=False) is expected


@pytest.mark.parametrize("typecode", ["q", "d"])
def test_a_step_down_exactly_between_two_chunks_on_disk_is_seen(everywhere: Path, typecode: str) -> None:
    values = [0, 1, 2, 3, 2, 3, 4, 5]  # each chunk ascends; the second starts below the first's end
    assert spill.ascending(on_disk(everywhere, typecode, values), strict=False) is False
    assert spill.ascending(on_disk(everywhere, typecode, sorted(values)), strict=False) is True


def test_ascending_declines_what_it_cannot_read_in_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert vectors.ascending(array("d", range(10)), False, 0, 10) is None  # shorter than VECTOR_MIN
    monkeypatch.setattr(vectors, "VECTOR_MIN", 1)
    assert vectors.ascending([1.0, 2.0, 3.0], False, 0, 3) is None  # a list: the Python pass reads it


@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(values=st.lists(st.integers(-3, 40), min_size=1, max_size=40))
def test_consecutive_runs_are_the_runs_the_python_pass_finds(everywhere: Path, values: list[int]) -> None:
    expected = ranges(list(values))  # a list: the pure-Python pass
    assert vectors.consecutive_runs(array("q", values)) == expected
    assert vectors.consecutive_runs(on_disk(everywhere, "q", values)) == expected
    assert ranges(on_disk(everywhere, "q", values)) == expected


@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(values=st.lists(st.one_of(st.floats(-5, 5), st.just(math.nan), st.sampled_from([0.0, -0.0])), min_size=1,
                       max_size=30))
def test_extremes_are_min_and_max_nans_included_on_disk_and_in_memory(everywhere: Path, values: list[float]) -> None:
    expected = (min(values), max(values))
    for column in (array("d", values), on_disk(everywhere, "d", values), list(values)):
        found = spill.extremes(column)
        assert found is not None
        assert [repr(x) for x in found] == [repr(x) for x in expected]  # a NaN where min() puts one


@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(keys=st.lists(st.integers(0, 20), min_size=0, max_size=30), bound=st.integers(-1, 21),
       highest=st.booleans(), at_most=st.booleans())
def test_extreme_where_is_the_compress_pass_across_chunks(everywhere: Path, keys: list[int], bound: int,
                                                         highest: bool, at_most: bool) -> None:
    from itertools import compress, repeat
    from operator import ge

    values = [k * 0.5 - 3 if k % 7 else (-0.0 if k % 2 else 0.0) for k in reversed(keys)]  # signed zeros too
    keep = le if at_most else ge
    pick = max if highest else min
    expected = pick(compress(values, map(keep, keys, repeat(bound))), default=None)
    for column_values, column_keys in ((array("d", values), array("q", keys)),
                                       (on_disk(everywhere, "d", values), on_disk(everywhere.with_suffix(".k"), "q", keys)),
                                       (values, keys)):
        assert repr(spill.extreme_where(column_values, column_keys, keep, bound, highest)) == repr(expected)


@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(present=st.sets(st.integers(0, 60), max_size=30),
       asked=st.sets(st.integers(-3, 63) | st.sampled_from([-(10**30), 10**30]), max_size=20))
def test_positions_find_each_asked_update_as_a_bisect_would(everywhere: Path, present: set[int], asked: set[int]) -> None:
    column, wanted = sorted(present), sorted(asked)
    expected = [column.index(x) if x in present else -1 for x in wanted]
    assert spill.positions(on_disk(everywhere, "q", column), wanted) == expected
    assert spill.positions(array("q", column), wanted) == expected


@settings(max_examples=100, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(lanes=st.lists(st.lists(st.tuples(st.integers(0, 30), st.floats(allow_nan=False)), max_size=12),
                      min_size=1, max_size=4))
def test_the_loss_of_each_step_is_the_last_lanes_as_the_dict_pass_says(everywhere: Path, lanes: list) -> None:
    from trainwreck.report import plots

    rows = []
    for attempt, lane in enumerate(lanes):
        steps = sorted({s for s, _ in lane})
        losses = [float(i) / 7 for i in range(len(steps))]
        rows.append((attempt, steps, losses))
    expected = {}
    for _, steps, losses in rows:
        expected.update(zip(steps, losses))
    expected = dict(sorted(expected.items()))
    columns = [(a, on_disk(everywhere.with_suffix(f".s{a}"), "q", s), on_disk(everywhere.with_suffix(f".l{a}"), "d", l))
               for a, s, l in rows]
    fast = vectors.last_by_key([(s, l) for _, s, l in columns])
    assert fast == ((list(expected), list(expected.values())) if expected else None)  # nothing: below VECTOR_MIN
    assert list(plots.lanes_losses(reversed(columns)).items()) == list(expected.items())  # lanes in attempt order
    assert list(plots.lanes_losses(rows).items()) == list(expected.items())  # lists: the dict pass


@settings(max_examples=150, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(digests=st.lists(st.one_of(st.none(), st.sampled_from(["aa", "bb", "cc"])), max_size=25),
       picks=st.sets(st.integers(-1, 30), max_size=12))
def test_take_reads_what_indexing_reads_on_disk_in_chunks_of_strings_and_numbers(
        everywhere: Path, digests: list, picks: set[int]) -> None:
    digests = ["zz", *digests]  # a first chunk of None alone would fix the width at 0 (a list then)
    indices = sorted(i for i in picks if i < len(digests))
    expected = [digests[i] if i >= 0 else None for i in indices]
    strings = spill.DiskStrings(str(everywhere))
    strings.extend(digests[: len(digests) // 2])  # part written, part still in the tail
    strings.extend(digests[len(digests) // 2 :])
    assert spill.take(strings, indices) == expected
    numbers = list(range(100, 100 + len(digests)))
    assert spill.take(on_disk(everywhere.with_suffix(".n"), "q", numbers), indices) == [
        numbers[i] if i >= 0 else None for i in indices]
