"""Shared pieces of the fault scenario tests: run a plan, judge it against a golden run."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import RunRecord
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.invariants import History, Judgement, judge, load_history
from tests.harness.conftest import assert_no_leftover_processes, read_events
from trainwreck.trainer.config import TrainConfig

CFG = TrainConfig.tiny(total_steps=12)
"""Saves after updates 4, 8 and 12; keep_last=3."""
HANG_TIMEOUT_S = 2.0


@dataclass
class Outcome:
    record: RunRecord
    run_dir: Path
    judgement: Judgement

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in read_events(self.run_dir) if e["kind"] == kind]

    def fired(self, fault_id: str) -> list[dict[str, Any]]:
        """The fault's events; the test fails unless it fired."""
        events = [e for e in self.events("fault") if e["fault_id"] == fault_id]
        assert events, f"fault {fault_id!r} never fired"
        return events

    def verdict(self, name: str) -> Any:
        return self.judgement.verdicts[name].valid

    def explain(self) -> str:
        lines = [f"{name}: {v.valid} {v.summary}" for name, v in self.judgement.verdicts.items()]
        return "\n".join(lines + self.judgement.notes + [f"outcome {self.record.outcome}"])

    def restores(self, attempt: int) -> set[int]:
        return {e["step"] for e in self.events("restore") if e["attempt"] == attempt}

    def exit_codes(self, attempt: int) -> dict[int, int | None]:
        return {e["rank"]: e["code"] for e in self.events("exit") if e["attempt"] == attempt}


def run_plan(plan: list[dict[str, Any]], run_dir: Path, golden: History | None, cfg: TrainConfig = CFG,
             world_sizes: tuple[int, ...] = (2,), hang_timeout_s: float = HANG_TIMEOUT_S,
             poll_interval_s: float = 0.02) -> Outcome:
    record = run_job(JobSpec(config=cfg, world_sizes=world_sizes, plan=plan, hang_timeout_s=hang_timeout_s,
                             run_dir=run_dir, poll_interval_s=poll_interval_s))
    assert_no_leftover_processes()
    return Outcome(record, run_dir, judge(load_history(run_dir), golden=golden))


def golden_history(run_dir: Path, cfg: TrainConfig = CFG, world_sizes: tuple[int, ...] = (2,)) -> History:
    record = run_job(JobSpec(config=cfg, world_sizes=world_sizes, run_dir=run_dir))
    assert record.outcome == "completed", record
    return load_history(run_dir)


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> History:
    """The uninterrupted run of CFG on 2 ranks, once per module."""
    return golden_history(tmp_path_factory.mktemp("golden") / "run")
