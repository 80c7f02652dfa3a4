"""The two readers of the run format agree: the checker's strict loader
(invariants.load_history, which the verdicts rest on) and the forgiving reader that the
report, the harness and the probes use (trainer/rundir.py iter_events) see the same
events in every run directory a quick selection of the suite makes: a clean run, a
restart after a kill (its torn last lines included), a torn checkpoint write, a corrupted
checkpoint (also with a restart after it), a node loss and a detected hang."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import CFG
from trainwreck.faults.plan import Plan
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.invariants import History, load_history
from trainwreck.trainer.rundir import iter_events

PLANS: dict[str, Plan] = {
    "clean": Plan(),
    "kill": Plan().kill(rank=1, step=6),
    "torn_write": Plan().torn_write(step=8),
    "corrupt": Plan().kill(rank=0, step=10).corrupt("flip"),
    # In-rank damage in attempt 1's bind with an attempt 2 after it: the strict loader
    # once moved the fault to attempt 2 by its time, and the readers disagreed.
    "corrupt_then_kill": Plan().kill(rank=0, step=6).corrupt("flip").kill(rank=1, step=10, attempt=1),
    "node_loss": Plan().node_loss(ranks=[0, 1], step=7),
    "hang": Plan().hang(rank=1, step=5),
}
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


def sparse_by_forgiving(run_dir: Path) -> Counter[str]:
    return Counter(_canonical(e) for e in iter_events(run_dir) if e["kind"] not in DENSE)


def dense_by_strict(history: History) -> dict[tuple[int, int], tuple[list[int], list[int], list[int]]]:
    return {key: (sorted(log.steps), sorted(log.batch_steps), sorted(log.ids)) for key, log in history.logs.items()
            if log.steps or log.batch_steps}


def dense_by_forgiving(run_dir: Path) -> dict[tuple[int, int], tuple[list[int], list[int], list[int]]]:
    found: dict[tuple[int, int], tuple[list[int], list[int], list[int]]] = {}
    for e in iter_events(run_dir):
        if e["kind"] in DENSE:
            steps, batches, ids = found.setdefault((e["attempt"], e["rank"]), ([], [], []))
            (steps if e["kind"] == "step" else batches).append(e["step"])
            ids.extend(e.get("samples", []))
    return {key: (sorted(s), sorted(b), sorted(i)) for key, (s, b, i) in found.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each plan's run directory, made once on first use."""
    return {}


def run_of(runs: dict[str, Path], name: str, root: Path) -> Path:
    if name not in runs:
        record = run_job(JobSpec(config=CFG, world_sizes=(2,), plan=PLANS[name].to_list(), hang_timeout_s=2.0,
                                 run_dir=root / name, keep=True))
        assert record.outcome == "completed", record.outcome
        runs[name] = root / name
    return runs[name]


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_strict_and_the_forgiving_reader_see_the_same_events(name: str, runs: dict[str, Path],
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    run_dir = run_of(runs, name, tmp_path_factory.mktemp("agree"))
    history = load_history(run_dir)
    fired = {e["fault_id"] for e in iter_events(run_dir) if e["kind"] == "fault"}
    assert fired == {f["id"] for f in PLANS[name]}  # each fault did what the case is here for
    assert sparse_by_strict(history) == sparse_by_forgiving(run_dir)
    assert dense_by_strict(history) == dense_by_forgiving(run_dir)
    assert history.event_count == sum(1 for _ in iter_events(run_dir))


def test_the_comparison_notices_an_event_only_one_reader_sees(runs: dict[str, Path],
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    run_dir = run_of(runs, "clean", tmp_path_factory.mktemp("agree"))
    history = load_history(run_dir)
    history.events.pop()
    assert sparse_by_strict(history) != sparse_by_forgiving(run_dir)
