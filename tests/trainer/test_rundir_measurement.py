"""The measurement directory, the run directory's other kind (rundir/layout.py).

The handbook's benchmark jobs leave one measurement.json (format trainwreck-measurement/1);
it is written and read through the bounded file layer like run.json, and a command handed
such a directory says what it is."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainwreck.rundir.layout import (MEASUREMENT_FORMAT, RunDir, RunDirError, read_measurement, read_run_json,
                                       write_measurement)

MEASURED = {"command": "python -m trainwreck.benchmarks.comm --world 2", "measure": "comm", "world_size": 2}


def test_a_measurement_written_is_read_back_with_its_format(tmp_path: Path) -> None:
    write_measurement(tmp_path / "m", MEASURED)
    assert read_measurement(tmp_path / "m") == {"format": MEASUREMENT_FORMAT, **MEASURED}
    assert json.loads(RunDir(tmp_path / "m").measurement_json.read_text())["format"] == MEASUREMENT_FORMAT


def test_a_measurement_without_its_command_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="lacks command"):
        write_measurement(tmp_path / "m", {"measure": "comm"})
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("content, why", [('{"format": "trainwreck-run/1"}', "is not 'trainwreck-measurement/1'"),
                                          ("[1, 2]", "format 'list'"), ("{", "unreadable")])
def test_a_damaged_measurement_json_is_a_run_dir_error_saying_why(tmp_path: Path, content: str, why: str) -> None:
    RunDir(tmp_path).measurement_json.write_text(content)
    with pytest.raises(RunDirError, match=why):
        read_measurement(tmp_path)


def test_a_fifo_planted_as_measurement_json_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(RunDir(tmp_path).measurement_json)
    with pytest.raises(RunDirError, match="not a regular file"):
        read_measurement(tmp_path)


def test_reading_a_measurement_directory_as_a_run_names_what_it_is(tmp_path: Path) -> None:
    write_measurement(tmp_path, MEASURED)
    with pytest.raises(RunDirError, match="is a measurement directory"):
        read_run_json(tmp_path)
    with pytest.raises(RunDirError, match="has no measurement.json"):
        read_measurement(tmp_path / "elsewhere")
