"""The checker benchmark runs and reports its figures (tiny size: this is not the measurement)."""

from trainwreck.benchmarks.checker import bench_checker


def test_bench_checker_reports_events_and_rate():
    result = bench_checker(steps=200, ranks=2, batch_per_rank=2)
    assert set(result) == {"checker_events", "checker_seconds", "checker_events_per_s"}
    assert result["checker_events"] > 800
