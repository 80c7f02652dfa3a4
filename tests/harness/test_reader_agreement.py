"""The two readers of the run format agree: the checker's strict loader
(invariants.load_history, which the verdicts rest on) and the forgiving reader that the
report, the harness and the probes use (rundir/layout.py iter_events) see the same
events in every run directory a quick selection of the suite makes: a clean run, a
restart after a kill (its torn last lines included), a torn checkpoint write, a corrupted
checkpoint (also with a restart after it), a node loss and a detected hang. Every scenario run of
tests/scenarios is compared the same way (tests/scenarios/checks.py), so the agreement holds on every
run that suite makes."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.conftest import CFG
from tests.harness.format_readers import (assert_format_readers_agree, forgiving_events, sparse_by_forgiving,
                                          sparse_by_strict)
from trainwreck.faults.plan import Plan
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.invariants import load_history
from trainwreck.rundir.layout import iter_events

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
    fired = {e["fault_id"] for e in iter_events(run_dir) if e["kind"] == "fault"}
    assert fired == {f["id"] for f in PLANS[name]}  # each fault did what the case is here for
    assert_format_readers_agree(run_dir)


def test_the_comparison_notices_an_event_only_one_reader_sees(runs: dict[str, Path],
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    run_dir = run_of(runs, "clean", tmp_path_factory.mktemp("agree"))
    history = load_history(run_dir)
    history.events.pop()
    assert sparse_by_strict(history) != sparse_by_forgiving(forgiving_events(run_dir))
