"""python -m trainer on its own and under torchrun: bad input, and a run `trainwreck check` judges valid."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


@pytest.mark.parametrize("flags, message", [
    (["--set", "keep_last=1"], "keep_last=1"),
    (["--set", "widht=3"], "expected FIELD=VALUE with FIELD one of"),
    (["--set", "width=wide"], "not a valid int"),
    (["--config", "{oops"], "--config is not valid JSON"),
    (["--total-steps", "0"], "total_steps=0 must be a positive integer"),
])
def test_invalid_configuration_exits_2_naming_the_value(tmp_path: Path, flags: list[str], message: str) -> None:
    result = run(sys.executable, "-m", "trainwreck.trainer", "--run-dir", str(tmp_path / "r"), *flags)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "r").exists(), "nothing may be created for a rejected config"


def test_an_unwritable_run_directory_exits_2_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run(sys.executable, "-m", "trainwreck.trainer", "--run-dir", str(blocker / "run"), "--tiny")
    assert result.returncode == 2 and "cannot create run directory" in result.stderr


def test_resuming_with_another_configuration_is_refused_and_keeps_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    first = run(sys.executable, "-m", "trainwreck.trainer", "--run-dir", str(run_dir), "--tiny", "--total-steps", "4")
    assert first.returncode == 0, first.stderr
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    second = run(sys.executable, "-m", "trainwreck.trainer", "--run-dir", str(run_dir), "--tiny", "--total-steps", "4",
                 "--set", "lr=0.5")
    assert second.returncode == 2 and "another configuration" in second.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before


def test_torchrun_with_two_cpu_ranks_writes_a_run_that_judges_valid(tmp_path: Path) -> None:
    run_dir = tmp_path / "torchrun"
    result = run(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "trainwreck.trainer",
                 "--run-dir", str(run_dir), "--total-steps", "20")
    assert result.returncode == 0, result.stderr[-2000:]
    check = run(sys.executable, "-m", "trainwreck.invariants", str(run_dir), "--json")
    verdict = json.loads(check.stdout)
    assert check.returncode == 0, check.stdout
    assert verdict["valid"] is True
    assert verdict["verdicts"]["progress"]["valid"] is True
    ranks = {json.loads(line)["rank"] for p in (run_dir / "events").glob("*.jsonl")
             for line in p.read_text().splitlines()[:1]}
    assert ranks == {0, 1}
