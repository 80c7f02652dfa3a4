"""The handbook's hang chapter, made alone (`trainwreck handbook --chapters hang`): what it says about
monitored_barrier is what the barrier's own run named, what it says about the GIL-holding rank's
stack is what that stack's dump shows, and what it says of NCCL is what the installed torch declares."""
from __future__ import annotations

import json
import re
import shutil
from html import unescape
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.report.handbooks import make_handbook
from trainwreck.report.chapters import (FLIGHT_RECORDER_ENTRIES, NCCL_ASYNC_ERROR_HANDLING, NCCL_TIMEOUT_MIN,
                                                on_gpus)
from trainwreck.report.handbook import Evidence
from trainwreck.report.truth import check_handbook

C10D = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" / "c10d"


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_handbook(tmp_path_factory, "hang", ["hang"])


def plain(hang: dict[str, Any]) -> str:
    """The chapter's rendered sentences without their markup (a quoted number sits in a <b> with its source)."""
    return unescape(re.sub(r"<[^>]+>", "", " ".join(s["text"] for s in hang["chapters"]["hang"]["sentences"]
                                                    if s["rendered"])))


def test_every_sentence_of_the_hang_chapter_is_true_to_its_runs(hang: dict[str, Any]) -> None:
    assert hang["code"] == 0
    assert check_handbook(hang["out"]) == []


def test_the_chapter_says_which_rank_monitored_barrier_named_in_its_own_run(hang: dict[str, Any]) -> None:
    barrier = hang["reports"]["monitored-barrier"]
    first, second = barrier["ranks"]
    assert first["names"] == [barrier["stalled_rank"]]  # torch's error named the rank held back
    text = plain(hang)
    assert f"with rank {barrier['stalled_rank']} of {barrier['world_size']} gloo ranks held back" in text
    assert f"its error named rank(s) {barrier['stalled_rank']}, the one held back" in text
    assert f"Rank {second['rank']}, which did arrive, raised too, naming rank(s) 0" in text


def test_the_gil_hang_credits_faulthandler_with_the_stack_its_dump_holds(hang: dict[str, Any], tmp_path: Path) -> None:
    (stack,) = [s for s in hang["reports"]["hang-holding-gil"]["hangs"][0]["stacks"] if s["rank"] == 0]
    assert stack["faulthandler"] and stack["frame"] == "faults/blocking.py:31 holding_gil", stack
    text = plain(hang)
    assert "an in-process watchdog thread cannot help" not in text and "no stack of a suspect" not in text
    assert "faulthandler's handler for the watchdog's SIGUSR1 is C code run from the signal, which needs no GIL" \
        in text
    # The sentence presumes the dump is faulthandler's: a report saying otherwise fails the page's check.
    out = tmp_path / "hb"
    shutil.copytree(hang["out"], out, symlinks=True)
    record = json.loads((out / "handbook.json").read_text())
    report_path = Path(record["runs"]["hang-holding-gil"]["report"])
    report = json.loads(report_path.read_text())
    for s in report["hangs"][0]["stacks"]:
        s["faulthandler"] = False
    tampered = tmp_path / "report.json"
    tampered.write_text(json.dumps(report))
    record["runs"]["hang-holding-gil"]["report"] = str(tampered)
    (out / "handbook.json").write_text(json.dumps(record))
    assert any("faulthandler" in p and "does not hold" in p for p in check_handbook(out))


def test_what_the_chapter_says_of_nccl_is_what_the_installed_torch_declares() -> None:
    if not (C10D / "ProcessGroupNCCL.hpp").is_file():
        pytest.skip(f"this torch ships no c10d headers ({C10D})")
    headers = (C10D / "ProcessGroupNCCL.hpp").read_text() + (C10D / "FlightRecorder.hpp").read_text()
    text = " ".join(c.template for c in on_gpus(Evidence(reports={})))
    for name in set(re.findall(r"TORCH_NCCL_[A-Z_]+", text)):
        assert f'"{name}"' in headers, f"{name} is not a variable torch {torch.__version__} reads"
    assert re.search(r"kProcessGroupNCCLDefaultTimeout =\s*std::chrono::milliseconds\((\d+) \* 60 \* 1000\)",
                     headers).group(1) == str(NCCL_TIMEOUT_MIN)
    assert f'"TORCH_NCCL_TRACE_BUFFER_SIZE"}}, {FLIGHT_RECORDER_ENTRIES})' in headers
    assert f"the default value ({NCCL_ASYNC_ERROR_HANDLING} - SkipCleanUp)" in headers
