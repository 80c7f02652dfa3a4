"""Making a handbook of some chapters for a test module: one place for what the --full chapters'
test modules and the default handbook's each need (a private golden cache, the real command line, everything it wrote)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import pytest

from trainwreck.harness.cli import main as cli


def make_handbook(tmp_path_factory: pytest.TempPathFactory, name: str, slugs: Sequence[str] | None) -> dict[str, Any]:
    """`trainwreck handbook --chapters SLUGS` (None: the default chapters, as `trainwreck handbook`
    runs them) into a fresh directory, from an empty golden cache, as on a fresh machine.

    Returns the exit code, handbook.json, every run's report.json, the page and the chapters by slug."""
    root = tmp_path_factory.mktemp(name)
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINWRECK_GOLDEN_CACHE", str(root / "golden"))
    try:
        out = root / "hb"
        chapters = [] if slugs is None else ["--chapters", ",".join(slugs)]
        code = cli(["handbook", *chapters, "--out", str(out)])
    finally:
        mp.undo()
    record = json.loads((out / "handbook.json").read_text())
    reports = {key: json.loads(Path(run["report"]).read_text()) for key, run in record["runs"].items()}
    return {"out": out, "code": code, "json": record, "reports": reports,
            "html": (out / "index.html").read_text(encoding="utf-8"),
            "chapters": {c["slug"]: c for c in record["chapters"]}}
