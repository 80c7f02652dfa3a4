"""Asynchronous updates, measured: the loss when every gradient is k updates stale, against synchronous.

"Why not make the training loop asynchronous?" is a question about the update, not the save. In an
asynchronous design (a parameter server, Hogwild, local updates) a worker's gradient is computed on
parameters that other workers have since moved: it arrives k updates late. Synchronous data
parallelism (DDP, FSDP) pays a collective per step to keep k = 0. This job trains the reference
model in one process on the same samples in the same order, once synchronously and once for each k,
applying at update t the gradient computed on the parameters of update t - k (the first k updates
use the gradients of the start, as a worker that has heard nothing yet would), and reports every
loss, the final gap and the worst gap. One process and no collective: the staleness is the only
difference, which is what the question asks about (how much the overlap would cost in loss).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import deque
from typing import Any

import torch
import torch.nn.functional as F

from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.data import SyntheticDataset
from trainwreck.trainer.model import MLP

SPEC = TrainConfig.tiny(dropout=0.0, dataset_size=1024, global_batch=32, warmup_steps=0, lr=0.1)
"""lr 0.1 (configured): synchronous SGD trains the tiny model well there (loss 1.38 -> 0.37 in 120 updates)."""
STALENESS = (1, 2, 4)
"""Updates of delay measured: a worker one, two and four updates behind its peers."""
STEPS = 120


def train(cfg: TrainConfig, steps: int, stale: int) -> list[float]:
    """The loss of each update when each applied gradient was computed `stale` updates earlier."""
    torch.manual_seed(cfg.seed)
    model = MLP(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    data = SyntheticDataset(cfg.seed, cfg.dataset_size, cfg.input_dim, cfg.num_classes)
    order = torch.randperm(cfg.dataset_size, generator=torch.Generator().manual_seed(cfg.seed))
    snapshots: deque[torch.nn.Module] = deque([copy.deepcopy(model)] * (stale + 1), maxlen=stale + 1)
    losses = []
    for step in range(steps):
        start = step * cfg.global_batch % cfg.dataset_size
        ids = order[start:start + cfg.global_batch]
        x, y = data.batch(ids)
        with torch.no_grad():  # the loss of the model as it is now, the one a synchronous run would report
            losses.append(float(F.cross_entropy(model(x, ids, 0), y)))
        worker = snapshots[0]  # the parameters of `stale` updates ago (the current ones when stale == 0)
        worker.zero_grad()
        F.cross_entropy(worker(x, ids, 0), y).backward()  # dropout is 0: no noise key is drawn
        for param, old in zip(model.parameters(), worker.parameters()):
            param.grad = old.grad.clone()
        optimizer.step()
        snapshots.append(copy.deepcopy(model))
    return losses


def measure(steps: int = STEPS, staleness: tuple[int, ...] = STALENESS) -> dict[str, Any]:
    torch.set_num_threads(1)
    sync = train(SPEC, steps, 0)
    result: dict[str, Any] = {"steps": steps, "optimizer": "SGD, momentum 0.9", "lr": SPEC.lr,
                              "global_batch": SPEC.global_batch, "staleness": list(staleness),
                              "loss_sync": sync, "final_loss_sync": sync[-1], "stale": {}}
    for k in staleness:
        losses = train(SPEC, steps, k)
        result["stale"][str(k)] = {"loss": losses, "final_loss": losses[-1],
                                   "final_gap": losses[-1] - sync[-1],
                                   "max_gap": max(a - b for a, b in zip(losses, sync))}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.staleness", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--staleness", default=",".join(map(str, STALENESS)), help="comma-separated delays, e.g. 1,2,4")
    args = parser.parse_args(argv)
    try:
        ks = tuple(int(k) for k in args.staleness.split(","))
    except ValueError:
        ks = ()
    if not ks or min(ks) < 1 or args.steps < 1:
        print(f"--staleness {args.staleness!r} / --steps {args.steps}: expected positive integers, e.g. "
              "--staleness 1,2,4 --steps 120", file=sys.stderr)
        return 2
    print(json.dumps(measure(args.steps, ks)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
