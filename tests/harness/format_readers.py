"""The two readers of the run format, compared: the checker's strict loader
(invariants.load_history, which the verdicts rest on) and the forgiving reader that the
report, the harness and the probes use (rundir/layout.py iter_events). Used by
tests/harness/test_reader_agreement.py and by every scenario run's checks
(tests/scenarios/checks.py), so each run the scenario suite makes is read alike by both."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from trainwreck.invariants import History, load_history
from trainwreck.rundir.layout import iter_events

DENSE = ("step", "batch")
DERIVED = {"end": "attempt"}
"""A field the strict loader adds by rule: the harness's `end` event names no attempt, and
the loader places it in the attempt running at its time (invariants/loader.py)."""


def _canonical(event: dict[str, Any]) -> str:
    # A field written as JSON null means the field is absent (docs/DESIGN.md): the strict
    # loader drops it, the forgiving reader keeps the None; both say the same thing.
    kept = {k: v for k, v in event.items()
            if k not in ("_src", "_pos", DERIVED.get(event["kind"])) and v is not None}
    kept["t"] = float(kept["t"])
    return json.dumps(kept, sort_keys=True)


def sparse_by_strict(history: History) -> Counter[str]:
    return Counter(_canonical(e) for e in history.events)


def forgiving_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every event as the forgiving reader yields it, read once for all the comparisons."""
    return list(iter_events(run_dir))


def sparse_by_forgiving(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(_canonical(e) for e in events if e["kind"] not in DENSE)


def dense_by_strict(history: History) -> dict[tuple[int, int], tuple[list[int], list[int], list[int]]]:
    return {key: (sorted(log.steps), sorted(log.batch_steps), sorted(log.ids)) for key, log in history.logs.items()
            if log.steps or log.batch_steps}


def dense_by_forgiving(events: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[list[int], list[int], list[int]]]:
    found: dict[tuple[int, int], tuple[list[int], list[int], list[int]]] = {}
    for e in events:
        if e["kind"] in DENSE:
            steps, batches, ids = found.setdefault((e["attempt"], e["rank"]), ([], [], []))
            (steps if e["kind"] == "step" else batches).append(e["step"])
            ids.extend(e.get("samples", []))
    return {key: (sorted(s), sorted(b), sorted(i)) for key, (s, b, i) in found.items()}


def assert_format_readers_agree(run_dir: Path) -> None:
    """Both readers see the same sparse events, the same dense columns and the same count."""
    history, events = load_history(run_dir), forgiving_events(run_dir)
    assert sparse_by_strict(history) == sparse_by_forgiving(events)
    assert dense_by_strict(history) == dense_by_forgiving(events)
    assert history.event_count == len(events)
