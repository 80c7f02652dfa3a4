"""Hugging Face Trainer (tiny GPT-2 from config, offline, 2 gloo ranks) under `--cmd`:
its golden run and its kill-and-resume are judged valid, from the run's own events."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from trainwreck.harness.cmd import run_cmd_judged
from trainwreck.harness.spec import JobSpec
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.rundir import iter_events

pytestmark = [
    pytest.mark.slow,  # about 45 s each: importing transformers' Trainer costs ~6 s per process
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
                       reason="needs the hf extra: pip install -e '.[hf]'"),
]
SCRIPT = Path(__file__).parent / "scripts" / "hf_trainer.py"


def hf_spec(out: Path, plan: list[dict] | None = None) -> JobSpec:
    return JobSpec(config=TrainConfig(), world_sizes=(2,), plan=plan or [], hang_timeout_s=60.0, launcher="cmd",
                   command=f"{sys.executable} {SCRIPT}", run_dir=out, keep=True)


def test_hf_trainers_uninterrupted_run_is_judged_valid(tmp_path: Path, golden_cache: Path) -> None:
    judged = run_cmd_judged(hf_spec(tmp_path / "run"), golden_cache=golden_cache)
    assert judged.judgement.valid is True, judged.judgement.to_json()
    events = list(iter_events(judged.record.run_dir))
    batches = [e for e in events if e["kind"] == "batch"]
    assert len(batches) == 24 and all(len(e["samples"]) == 4 for e in batches)  # 12 updates x 2 ranks x 4 ids
    assert sorted(e["step"] for e in events if e["kind"] == "save") == [3, 6, 9, 12]


def test_hf_trainer_killed_mid_epoch_resumes_bit_identical_and_is_judged_valid(
        tmp_path: Path, golden_cache: Path) -> None:
    plan = [{"id": "k1", "kind": "signal", "signal": "SIGKILL", "rank": 1, "step": 7}]
    judged = run_cmd_judged(hf_spec(tmp_path / "run", plan), golden_cache=golden_cache)
    events = list(iter_events(judged.record.run_dir))
    assert [e["fault_id"] for e in events if e["kind"] == "fault"] == ["k1"]
    assert any(e["kind"] == "exit" and e["attempt"] == 0 and e["rank"] == 1 and e["code"] == -9 for e in events)
    newest = max(e["step"] for e in events if e["kind"] == "save" and e["attempt"] == 0)
    restores = sorted((e["attempt"], e["rank"], e["step"]) for e in events if e["kind"] == "restore")
    assert restores == [(1, 0, newest), (1, 1, newest)] and newest % 8 != 0  # mid-epoch (8 updates per epoch)
    assert judged.judgement.valid is True, judged.judgement.to_json()
