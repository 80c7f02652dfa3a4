from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from histories import HistoryBuilder


@pytest.fixture
def builder(tmp_path: Path) -> Callable[..., HistoryBuilder]:
    """make(name="run", **spec) -> a HistoryBuilder writing into tmp_path/name."""

    def make(name: str = "run", **spec: Any) -> HistoryBuilder:
        return HistoryBuilder(tmp_path / name, **spec)

    return make


@pytest.fixture(autouse=True)
def _readers_agree_on_every_history(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """After each test, every run directory it wrote is judged by the streaming reader
    and by the reference reader; they must agree (tests/invariants/readers.py)."""
    yield
    if request.node.get_closest_marker("readers_may_differ"):
        return
    from readers import assert_readers_agree, run_dirs_under
    for run_dir in run_dirs_under(tmp_path):
        assert_readers_agree(run_dir)
