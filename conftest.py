"""Root conftest: kept thin. Settings and fixtures live in the harness's pytest plugin;
the suite's own session-wide check (no files left in $TMPDIR or the repository) lives in tests/tmpcheck.py, which tests share a worker in tests/scheduling.py,
how long a default test may run in tests/timeouts.py."""

pytest_plugins = ["tests.tmpcheck", "tests.scheduling", "tests.timeouts"]
