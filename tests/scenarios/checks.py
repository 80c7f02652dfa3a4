"""Assertions shared by the scenario tests: every planned fault fired, every verdict valid."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainwreck.rundir.layout import iter_events
from tests.harness.format_readers import assert_format_readers_agree
from tests.invariants.readers import assert_readers_agree


def fired_fault_ids(run_dir: Path) -> set[str]:
    """Fault ids with a `fault` event anywhere in the run (a torn last line is skipped)."""
    fired = set()
    for path in (Path(run_dir) / "events").glob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("kind") == "fault":
                fired.add(event.get("fault_id"))
    return fired


def assert_every_fault_fired(judged: Any) -> None:
    planned = {f["id"] for f in json.loads((judged.record.run_dir / "run.json").read_text())["faults"]}
    assert planned, "a scenario without faults tests nothing"
    missing = planned - fired_fault_ids(judged.record.run_dir)
    assert not missing, f"planned faults never fired: {sorted(missing)}"
    assert judged.judgement.unfired_faults == []


def assert_valid(judged: Any, threatened: tuple[str, ...] = ()) -> None:
    for name in threatened:
        verdict = judged.judgement.verdicts[name]
        assert verdict.valid is True, f"{name}: {verdict.summary}"
    assert judged.judgement.valid is True, "; ".join(
        f"{n}: {v.summary}" for n, v in judged.judgement.verdicts.items() if v.valid is not True)
    assert judged.record.outcome == "completed"
    assert_readers_agree(judged.record.run_dir)  # the streaming checker judges the suite's runs as the reference does
    assert_format_readers_agree(judged.record.run_dir)  # and the report's forgiving reader sees what the checker saw


def assert_ranks_shared_one_gpu(judged: Any) -> None:
    """Every rank's `start` event says it ran on cuda:0 over gloo, and more than one rank did."""
    starts = [e for e in iter_events(judged.record.run_dir, batches=False) if e["kind"] == "start"]
    assert {(e.get("device"), e.get("backend")) for e in starts} == {("cuda:0", "gloo")}, starts
    assert len({e["rank"] for e in starts}) >= 2
