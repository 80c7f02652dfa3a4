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
