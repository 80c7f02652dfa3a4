"""Every test of the default selection is bounded: pytest-timeout stops one that runs longer than
DEFAULT_TIMEOUT_S (fixture set-up included) with its stacks and a failure, so a hang costs one test
instead of the whole CI run. CI once sat 14 minutes in a test whose rank never exited (the harness
bounds that itself now: docs/HARNESS.md, "A rank that never exits").

The signal method: the test's own `finally` blocks then kill the ranks it started. Nightly tests
(slow, chaos, gpu) run whole tables and keep no bound. A test may set its own
`@pytest.mark.timeout`. Without pytest-timeout installed nothing is bounded."""
from __future__ import annotations

import os

import pytest

DEFAULT_TIMEOUT_S = float(os.environ.get("TRAINWRECK_TEST_TIMEOUT_S", "900"))
"""The longest default test takes about 160 s on a loaded 2-core machine (the handbook's fixture)."""
UNBOUNDED = ("slow", "chaos", "gpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        if item.get_closest_marker("timeout") is None and not any(map(item.get_closest_marker, UNBOUNDED)):
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_S, method="signal"))
