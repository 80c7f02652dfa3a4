"""The model zoo (tests/frameworks/zoo/zoo_train.py) under `trainwreck run --cmd`: patterns real
scripts have, each judged VALID on its golden run and after a kill and resume, and a planted bug
in each caught by the invariant that owns it, the root cause naming it. Read from the run's own
events and verdicts. Nightly (`-m slow`): about 15 cold two-rank jobs, a minute or more each on 2 cores."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.judge.runner import run_judged
from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.rundir.layout import iter_events

SCRIPT = Path(__file__).parent / "zoo" / "zoo_train.py"
KILL = {"id": "k1", "kind": "kill", "rank": 1, "step": 8}
"""Rank 1 killed at update 8's start: the run resumes from the save after update 6."""
GPU_ONLY = pytest.mark.gpu(devices=1)  # SyncBatchNorm refuses CPU tensors (torch's own check)
PATTERNS = ("resnet", pytest.param("syncbn", marks=GPU_ONLY), "ema", "clip", "nonpersistent")
BUGS = {  # pattern -> (planted bug, the invariant that must catch it, words of its root cause)
    "resnet": ("no-sync", "replicas", "parameters or optimizer state differ"),
    "syncbn": ("stats-not-saved", "continuity", "the resumed state is not the state that was saved"),
    "ema": ("ema-not-saved", "continuity", "the resumed state is not the state that was saved"),
    "clip": ("optimizer-reset", "continuity", "the resumed state is not the state that was saved"),
    "nonpersistent": ("buffer-not-rebuilt", "continuity", ""),
}


def judged(out: Path, golden_cache: Path, pattern: str, bug: str = "") -> tuple[Any, list[dict[str, Any]]]:
    command = " ".join([sys.executable, str(SCRIPT), "--pattern", pattern, *(["--bug", bug] if bug else [])])
    spec = JobSpec(target=Command(command), world_sizes=(2,), plan=[KILL], hang_timeout_s=60.0, run_dir=out,
                   keep=True)
    run = run_judged(spec, golden_cache=golden_cache)
    return run, list(iter_events(run.record.run_dir))


def of(events: list[dict[str, Any]], kind: str, **fields: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in fields.items())]


@pytest.mark.slow
@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_correct_script_is_valid_golden_and_after_a_kill_and_resume(tmp_path: Path, golden_cache: Path,
                                                                      pattern: str) -> None:
    run, events = judged(tmp_path / "run", golden_cache, pattern)
    assert [e["fault_id"] for e in of(events, "fault")] == ["k1"]  # the kill fired
    assert sorted((e["rank"], e["step"]) for e in of(events, "restore", attempt=1)) == [(0, 6), (1, 6)]
    golden = {n: v.valid for n, v in run_judged_golden(run).items()}
    assert set(golden.values()) == {True}, golden
    assert run.judgement.valid is True, run.judgement.to_json()
    assert run.judgement.verdicts["continuity"].counts["restores_checked"] == 2


def run_judged_golden(run: Any) -> dict[str, Any]:
    from trainwreck.invariants import judge, load_history

    return judge(load_history(run.golden_dir)).verdicts


@pytest.mark.slow
@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_planted_bug_in_each_pattern_is_caught_by_its_invariant(tmp_path: Path, golden_cache: Path,
                                                                  pattern: str) -> None:
    bug, invariant, cause = BUGS[pattern]
    run, events = judged(tmp_path / "run", golden_cache, pattern, bug)
    assert [e["fault_id"] for e in of(events, "fault")] == ["k1"]
    assert run.judgement.valid is False
    assert run.judgement.verdicts[invariant].valid is False, run.judgement.to_json()
    if cause:  # the report's one root-cause sentence, as a reader sees it first
        from trainwreck.report import render_report

        render_report(run.record.run_dir)
        report = (run.record.run_dir / "report" / "report.md").read_text()
        root = next(line for line in report.splitlines() if "Root cause:" in line)
        assert cause in root, root
