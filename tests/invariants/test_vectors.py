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
