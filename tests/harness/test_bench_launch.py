"""The launch benchmark runs and reports its keys (its figures are checked by eye, not asserted)."""
from __future__ import annotations

from trainwreck.benchmarks.launch import bench_launch


def test_the_launch_benchmark_reports_warm_launch_time_per_world_size() -> None:
    result = bench_launch(ranks=(2,), launchers=("warm",))
    assert set(result) == {"warm_server_ready_s", "launch_warm_s_2"}
    assert result["launch_warm_s_2"] > 0
