"""The scenario benchmark's split of one scenario's wall: derived from the run's own events and the
runner's timed steps, its parts add up to the wall (the figures themselves are read, not asserted)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwreck.benchmarks import scenarios
from trainwreck.benchmarks.scenarios import job_split, run_scenarios


def _events(run: Path, name: str, events: list[dict]) -> None:
    (run / "events").mkdir(parents=True, exist_ok=True)
    (run / "events" / name).write_text("".join(json.dumps(e) + "\n" for e in events))


def _rank0(attempt: int, start: float, first_batch: float, steps: list[tuple[float, dict]]) -> list[dict]:
    head = {"attempt": attempt, "rank": 0, "world_size": 2}
    return [{"kind": "start", "t": start, "pid": 1, **head},
            {"kind": "batch", "t": first_batch, "step": 1, "epoch": 0, "samples": [0], **head},
            *({"kind": "step", "t": t, "step": i + 1, "loss": 1.0, "digest": "d", "phases": p, **head}
              for i, (t, p) in enumerate(steps))]


def test_a_jobs_wall_is_split_by_its_own_events_into_fork_setup_steps_teardown_and_the_gap_between_attempts(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    _events(run, "harness.jsonl", [
        {"kind": "attempt", "t": 100.0, "attempt": 0, "world_size": 2},
        {"kind": "exit", "t": 104.0, "attempt": 0, "rank": 1, "code": -9},
        {"kind": "exit", "t": 104.5, "attempt": 0, "rank": 0, "code": -9},
        {"kind": "attempt", "t": 105.0, "attempt": 1, "world_size": 2},
        {"kind": "exit", "t": 109.0, "attempt": 1, "rank": 0, "code": 0},
        {"kind": "end", "t": 109.1, "status": "completed", "final_step": 2}])
    _events(run, "a000-r000.jsonl", _rank0(0, 100.5, 101.0, [(102.0, {"forward": 0.4, "checkpoint": 0.2}),
                                                              (103.0, {"forward": 0.3, "checkpoint": 0.0})]))
    _events(run, "a001-r000.jsonl", _rank0(1, 105.25, 106.0, [(108.0, {"forward": 1.0, "checkpoint": 0.5})]))
    split = job_split(run)
    assert split == pytest.approx({"fork": 0.5 + 0.25, "setup": 0.5 + 0.75, "compute": 0.7 + 1.0, "saves": 0.2 + 0.5,
                                   "steps_other": (2.0 - 0.9) + (2.0 - 1.5), "teardown": 1.5 + 1.0, "between": 0.5})
    assert sum(split.values()) == pytest.approx(109.0 - 100.0)  # from the first attempt to the last exit


def test_an_attempt_without_its_events_is_refused_not_split(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _events(run, "harness.jsonl", [{"kind": "attempt", "t": 100.0, "attempt": 0, "world_size": 1}])
    with pytest.raises(RuntimeError, match="attempt 0 .* lacks a start, batch, step or exit event"):
        job_split(run)


@pytest.mark.slow  # nightly: a golden run, the warm-up's kill-and-resume scenarios and one measured
def test_a_measured_scenarios_parts_add_up_to_its_wall(tmp_path: Path) -> None:
    walls, _, splits = run_scenarios(tmp_path, runs=1)
    (split,) = splits
    assert set(split) == {"golden", "fork", "setup", "compute", "saves", "steps_other", "teardown", "between",
                          "job_other", "judge", "root_cause", "publish"}
    assert sum(split.values()) == pytest.approx(walls[0], abs=0.01)
    assert all(split[name] > 0 for name in ("fork", "setup", "compute", "saves", "teardown", "between", "publish"))


class _Server:
    huge_bytes: int | None = None


@pytest.mark.parametrize(("settles_after", "ran"), [(3, 3), (None, scenarios.WARM_UP_MAX)],
                         ids=["the server settles in the third", "it never does"])
def test_a_harness_warms_up_until_its_fork_server_has_settled_and_no_longer(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settles_after: int | None, ran: int) -> None:
    server, runs = _Server(), []

    def run_judged(spec: object, name: str) -> None:
        runs.append(name)
        if len(runs) == settles_after:
            server.huge_bytes = 194 << 20  # the "pages" message arrived during this scenario

    monkeypatch.setattr(scenarios, "run_judged", run_judged)
    monkeypatch.setattr(scenarios, "fork_server", lambda: server)
    assert scenarios.warm_up(scenarios.cpu_scenario("kill-resume"), tmp_path) == ran == len(runs)
