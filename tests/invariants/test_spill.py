"""Columns on disk (invariants/spill.py) answer as the lists they stand for, and clean up after themselves."""
from __future__ import annotations

import bisect
import errno
import gc
import os
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwreck.invariants import InputError, load_history, spill
from trainwreck.invariants.history import extend_digests, extend_ints, extend_losses, floats, ints


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Chunks of 4 values and a cache of two: every test crosses chunk boundaries and evicts. One file
    serves every example hypothesis draws: each column appends its own chunks and reads only those."""
    monkeypatch.setattr(spill, "CHUNK", 4)
    monkeypatch.setattr(spill, "CACHE_BYTES", 64)
    return tmp_path / "columns.bin"


def _filled(path: Path, values: list[int], cuts: list[int]) -> spill.DiskNumbers:
    """A column of `values`, appended in pieces of the sizes in `cuts` (sealed after each odd one)."""
    column, at = spill.DiskNumbers(str(path), "q"), 0
    for n, size in enumerate(cuts):
        column.extend(values[at : at + size])
        at += size
        if n % 2:
            column.seal()
    column.extend(values[at:])
    return column


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=40),
       cuts=st.lists(st.integers(0, 9), max_size=8), data=st.data())
def test_a_column_on_disk_answers_as_the_list_of_its_values(
        small_chunks: Path, values: list[int], cuts: list[int], data: st.DataObject) -> None:
    column = _filled(small_chunks, values, cuts)
    assert len(column) == len(values) and list(column) == values
    start, stop = data.draw(st.integers(-45, 45)), data.draw(st.integers(-45, 45))
    assert list(column[start:stop]) == values[start:stop] and list(column[::3]) == values[::3]
    if values:
        i = data.draw(st.integers(-len(values), len(values) - 1))
        assert column[i] == values[i]
        assert column.count(values[i]) == values.count(values[i])
    with pytest.raises(IndexError):
        column[len(values)]
    assert column == array("q", values) and column == values and column == _filled(small_chunks, values, cuts[::-1])
    assert (column == values + [1]) is False and (column != values) is False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(0, 20), max_size=40), cuts=st.lists(st.integers(0, 9), max_size=8),
       data=st.data())
def test_bisect_on_disk_reads_one_chunk_and_agrees_with_the_standard_library_inside_a_sorted_range(
        small_chunks: Path, values: list[int], cuts: list[int], data: st.DataObject) -> None:
    lo = data.draw(st.integers(0, len(values)))
    hi = data.draw(st.integers(lo, len(values)))
    values[lo:hi] = sorted(values[lo:hi])  # only the range need ascend
    column = _filled(small_chunks, values, cuts)
    for x in range(-1, 22):
        assert spill.bisect_left(column, x, lo, hi) == bisect.bisect_left(values, x, lo, hi)
        assert spill.bisect_right(column, x, lo, hi) == bisect.bisect_right(values, x, lo, hi)
    assert spill.ascending(column, False, lo, hi)
    assert spill.ascending(column, True, lo, hi) == all(a < b for a, b in zip(values[lo:hi], values[lo + 1:hi]))


def test_digests_on_disk_keep_none_and_compare_as_bytes_and_a_misfit_turns_the_column_into_a_list(
        small_chunks: Path) -> None:
    digests: list[Any] = ["aa01", None, "bb02", "cc03", None, "dd04", "ee05", "ff06", "0a07"]
    column: Any = spill.DiskStrings(str(small_chunks))
    column = extend_digests(column, digests[:5])
    column.seal()
    column = extend_digests(column, digests[5:])
    assert isinstance(column, spill.DiskStrings) and list(column) == digests and column[-1] == "0a07"
    assert column.count(None) == 2 and column[1] is None and list(column[2:7]) == digests[2:7]
    twin = extend_digests(spill.DiskStrings(str(small_chunks)), digests[:5])
    twin.seal()
    assert column == extend_digests(twin, digests[5:]) and column == digests
    widened = extend_digests(column, ["a digest of another width"])
    assert type(widened) is list and widened == digests + ["a digest of another width"]


def test_digests_that_start_none_for_a_whole_chunk_keep_every_value_when_strings_follow(small_chunks: Path) -> None:
    """A chunk of None alone is written at width 0; a later string must not change how it reads."""
    column: Any = extend_digests(spill.DiskStrings(str(small_chunks)), [None] * 4)
    column = extend_digests(column, ["ab12", None, "cd34"])
    assert len(column) == 7 and list(column) == [None] * 4 + ["ab12", None, "cd34"]


def test_a_value_a_disk_column_cannot_hold_turns_it_into_a_list_with_nothing_lost(small_chunks: Path) -> None:
    ints = extend_ints(spill.DiskNumbers(str(small_chunks), "q"), list(range(10)))
    huge = extend_ints(ints, [1, 1 << 70])
    assert type(huge) is list and huge == list(range(10)) + [1, 1 << 70]
    losses = extend_losses(spill.DiskNumbers(str(small_chunks), "d"), [0.5] * 6)
    assert isinstance(losses, spill.DiskNumbers)
    mixed = extend_losses(losses, [None, 1])
    assert type(mixed) is list and mixed == [0.5] * 6 + [None, 1]


def test_an_in_memory_column_widens_to_the_narrowest_type_that_holds_a_block_and_keeps_every_value() -> None:
    column = extend_ints(ints(), [1, 2, 3])
    assert column.typecode == "b"
    column = extend_ints(column, [4, 300, 5])  # 300 is past int8: the block is appended once, at int16
    assert column.typecode == "h" and list(column) == [1, 2, 3, 4, 300, 5]
    column = extend_ints(column, array("q", [6, 1 << 40]))
    assert column.typecode == "q" and list(column)[-3:] == [5, 6, 1 << 40]
    column = extend_ints(column, [7, 1 << 70])
    assert type(column) is list and column == [1, 2, 3, 4, 300, 5, 6, 1 << 40, 7, 1 << 70]
    losses = extend_losses(floats(), [0.5, 1.5])
    assert losses.typecode == "d" and list(extend_losses(losses, [2.5])) == [0.5, 1.5, 2.5]


def test_the_scratch_folder_goes_with_its_history_and_a_forked_child_leaves_it_alone() -> None:
    scratch = spill.Scratch()
    folder = Path(scratch.dir)
    assert folder.is_dir() and oct(folder.stat().st_mode & 0o777) == "0o700"
    del scratch
    gc.collect()
    assert not folder.exists()
    script = ("import os, sys\nfrom trainwreck.invariants import spill\ns = spill.Scratch()\n"
              "pid = os.fork()\nif pid == 0:\n    sys.exit(0)\nos.waitpid(pid, 0)\nprint(os.path.isdir(s.dir), s.dir)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    kept, path = out.stdout.split()
    assert kept == "True", "the child's exit removed its parent's scratch folder"
    assert not os.path.exists(path), "the parent's exit should have removed it"


@pytest.mark.readers_may_differ  # the run is fine; only this test's scratch disk is full
def test_a_full_scratch_disk_is_an_input_error_that_names_tmpdir(
        monkeypatch: pytest.MonkeyPatch, builder: Any, tmp_path: Path) -> None:
    run = builder(total_steps=4)
    run.attempt(2).train(4)
    run.end()
    run.write()
    def full(*_: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(spill, "SPILL_MIN_BYTES", 0)
    monkeypatch.setattr(spill.os, "pwrite", full)
    with pytest.raises(InputError, match="set TMPDIR to a folder on a disk with room"):
        load_history(tmp_path / "run")
