"""Jobs in parallel pytest-xdist workers never collide on ports."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_parallel_jobs(basetemp: Path) -> None:
    """One `pytest -n 2` run of parallel_jobs.py: six 2-rank jobs, two at a time (~25 s on 2 cores)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider",
         f"--basetemp={basetemp}", "tests/harness/parallel_jobs.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "6 passed" in result.stdout


@pytest.mark.slow  # nightly: moved out of the default run to keep it near 8 minutes (README, Tests)
def test_pytest_n_2_runs_of_two_rank_jobs_never_collide_on_ports(tmp_path: Path) -> None:
    run_parallel_jobs(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("repeat", range(3))
def test_repeated_pytest_n_2_runs_of_two_rank_jobs_never_collide_on_ports(tmp_path: Path, repeat: int) -> None:
    run_parallel_jobs(tmp_path)
