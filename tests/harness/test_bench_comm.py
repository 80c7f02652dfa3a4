"""benchmarks/comm.py: the all-reduce job's input checks (its measurements are read by the handbook's
tests, tests/report/test_handbook.py, on the handbook's own run of it)."""
from __future__ import annotations

import pytest

from trainwreck.benchmarks.comm import SIZES_BYTES, main


def test_a_world_of_one_is_refused_with_exit_2_and_a_line_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--world", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("--world: 1 ") and "--world 2" in err and "\n" not in err


def test_the_message_sizes_grow_and_are_whole_fp32_tensors() -> None:
    assert list(SIZES_BYTES) == sorted(set(SIZES_BYTES)) and all(s % 4 == 0 for s in SIZES_BYTES)
