"""The launch benchmark runs and reports its keys (its figures are checked by eye, not asserted)."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainwreck.benchmarks.launch import bench_cmd, bench_launch, bench_watchdog_cpu
from trainwreck.benchmarks.scenarios import hang_latencies
from trainwreck.rundir.layout import iter_events


def test_the_launch_benchmark_reports_warm_launch_time_per_world_size() -> None:
    result = bench_launch(ranks=(2,), launchers=("warm",))
    assert set(result) == {"warm_server_ready_s", "launch_warm_s_2"}
    assert result["launch_warm_s_2"] > 0


@pytest.mark.slow  # nightly: the cold kill-and-resume alone is 15-40 s on 2 cores
def test_the_cmd_benchmark_times_cold_and_forked_kill_and_resume_jobs_and_their_ratio() -> None:
    result = bench_cmd(repeats=1)  # raises unless each job completed in 2 attempts, the warm ones forked
    assert set(result) == {"cmd_server_ready_s", "cmd_kill_resume_first_warm_s", "cmd_kill_resume_cmd_warm_s",
                           "cmd_kill_resume_cmd_s", "cmd_warm_speedup"}
    assert result["cmd_warm_speedup"] == round(result["cmd_kill_resume_cmd_s"] / result["cmd_kill_resume_cmd_warm_s"], 1)


def test_the_launch_benchmark_leaves_out_the_pairs_it_is_told_to_skip() -> None:
    result = bench_launch(ranks=(2, 3), launchers=("warm",), skip=frozenset({("warm", 3)}))
    assert "launch_warm_s_2" in result and "launch_warm_s_3" not in result


def test_the_watchdog_cpu_benchmark_times_the_watchdog_the_supervisor_actually_ran() -> None:
    result = bench_watchdog_cpu(world_size=2, total_steps=6)
    assert set(result) == {"watchdog_cpu_pct_per_rank", "watchdog_cpu_s_2"}
    # Zero would mean the supervisor never called the timed watchdog: the figure would measure nothing.
    assert result["watchdog_cpu_s_2"] > 0 and result["watchdog_cpu_pct_per_rank"] > 0


def test_the_hang_benchmark_measures_from_the_fault_to_a_hang_event_after_the_timeout(tmp_path: Path) -> None:
    latencies, invalid = hang_latencies(hangs=1, timeout_s=0.5, world_size=2, out=tmp_path)
    hang = next(e for e in iter_events(tmp_path / "hang0") if e["kind"] == "hang")
    # The watchdog's clock starts at the rank's last progress, which comes just before the
    # harness stamps the SIGSTOP fault (once 0.49976 s from fault to hang in CI): so the
    # timeout bounds the silence the watchdog saw, and the latency only has to follow the fault.
    assert hang["detected_after_s"] >= 0.5, hang
    assert len(latencies) == 1 and latencies[0] > 0
    assert invalid == []
