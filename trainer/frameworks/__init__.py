"""Adapters that let trainwreck judge trainers built on a framework, the framework unchanged.

Each adapter module imports its framework (an optional extra), so import it only when the
framework is installed; this package itself imports torch only."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from trainwreck.trainer.state import state_digest


class _NoOptimizer:
    def state_dict(self) -> dict[str, dict[int, dict[str, object]]]:
        return {"state": {}}


def module_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str:
    """The reference trainer's digest rule (trainer/state.py), over a framework's model and
    optimizer: equal on every DDP replica, equal states give equal digests."""
    return state_digest(SimpleNamespace(model=model, optimizer=optimizer or _NoOptimizer()))  # type: ignore[arg-type]
