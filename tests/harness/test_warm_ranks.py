"""What a rank forked by the warm launcher inherits from the fork server."""
from __future__ import annotations

import json
from pathlib import Path

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from tests.harness.conftest import assert_no_leftover_processes
from trainwreck.trainer.config import TrainConfig


def test_a_warm_rank_starts_with_the_servers_imports_frozen_out_of_its_garbage_collector(tmp_path: Path) -> None:
    # Each rank runs a full collection before it tears its process group down; walking the
    # ~300k objects of torch's imports cost 0.2 s of CPU per rank (and copied every page they sit on).
    run = tmp_path / "run"
    record = run_job(JobSpec(config=TrainConfig.tiny(total_steps=2), world_sizes=(2,), run_dir=run,
                             launcher="warm", entry="tests.harness.gc_entry:run_rank"))
    assert record.outcome == "completed"
    for rank in (0, 1):
        counts = json.loads((run / f"gc-a0-r{rank}.json").read_text())
        assert counts["frozen"] > 10 * counts["tracked"], counts
    assert_no_leftover_processes()
