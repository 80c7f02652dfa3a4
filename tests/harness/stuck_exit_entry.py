"""A test-only rank entry: trains to the end (the trainer publishes "done"), then never exits.

It imitates the teardown deadlock CI met (an accelerate rank, after `done`, stuck in gloo's
destructor joining a thread that waited for the GIL). Used by tests/harness/test_exit_overdue.py
through JobSpec(entry="tests.harness.stuck_exit_entry:run_rank")."""
from __future__ import annotations

import threading
from typing import Any

from trainwreck.trainer.entry import run_rank as train_rank


def run_rank(ctx: Any, cfg: Any, hooks: Any = None) -> None:
    train_rank(ctx, cfg, hooks)
    if ctx.rank == 0:
        threading.Event().wait()  # no timeout: only the harness's bound can end this rank
