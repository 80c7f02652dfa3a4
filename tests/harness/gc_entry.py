"""A test-only rank entry: records what the rank's garbage collector would walk, then trains.

Used by tests/harness/test_warm_ranks.py through JobSpec(entry="tests.harness.gc_entry:run_rank")."""
from __future__ import annotations

import gc
import json
from typing import Any

from trainwreck.trainer.entry import run_rank as train_rank


def run_rank(ctx: Any, cfg: Any, hooks: Any = None) -> None:
    counts = {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}
    (ctx.run_dir / f"gc-a{ctx.attempt}-r{ctx.rank}.json").write_text(json.dumps(counts))
    train_rank(ctx, cfg, hooks)
