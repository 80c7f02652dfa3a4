"""An example torchft trainer, instrumented for trainwreck: one rank of one replica group.

    trainwreck frameworks --frameworks torchft          # the harness starts it, per group
    python -m trainwreck.trainer.frameworks.torchft_train --steps 30   # under harness/supervise/replicas.py

A tiny MLP on synthetic data, torchft's own pieces as its README shows them: `Manager`
(quorum, heal, commit), its `DistributedDataParallel` and `DistributedSampler` (a static
shard per replica group). It calls `manager.should_commit()` itself rather than through
`OptimizerWrapper.step()`, only to learn the commit decision for the `commit` event;
the optimizer is stepped exactly when the wrapper would step it.

Flags that break it on purpose (the invariants must catch each): `--min-replicas N` (no
group trains alone below N groups), `--heal-model-only` (a heal loads the weights but
not the optimizer state), `--claim-exactly-once` (claims in run.json a sampler it lacks).
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
from torchft.data import DistributedSampler

from trainwreck.trainer.frameworks.torchft_adapter import (LOOPBACK, Checkpoints, LoopbackHTTPTransport, ReplicaProbe,
                                                           ReplicaRank, allreduce_point, loopback_only,
                                                           record_quorums)
from trainwreck.trainer.hooks import STEP_START
from trainwreck.trainer.probe import state_digest

DATASET, FEATURES = 64, 8


class Synthetic(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i is a fixed random vector and its target; items carry their id."""

    def __init__(self, size: int) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, FEATURES, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="updates to commit")
    p.add_argument("--batch", type=int, default=4, help="samples per rank per update")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="compute time each update stands for (a tiny MLP takes ~2 ms; a restart takes seconds)")
    p.add_argument("--min-replicas", type=int, default=1, help="torchft's min_replica_size")
    p.add_argument("--timeout", type=float, default=10.0, help="torchft's operation timeout, seconds")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N committed updates (0: never)")
    p.add_argument("--resume", action="store_true", help="start from the newest intact checkpoint, if any")
    p.add_argument("--heal-model-only", action="store_true", help="defect: a heal skips the optimizer state")
    p.add_argument("--claim-exactly-once", action="store_true", help="claim exactly-once data in run.json")
    return p.parse_args(argv)


def resume(args: argparse.Namespace, store: Checkpoints, tw: ReplicaProbe, model: nn.Module,
           optimizer: torch.optim.Optimizer, manager: Manager) -> tuple[int, int]:
    """With --resume and an intact checkpoint: its state, step and data position (epoch, batches
    of it used); otherwise the start. A group that finds live peers heals past it anyway."""
    found = store.newest() if args.resume else None
    if found is None:
        return 0, 0
    name, state = found
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
    manager.load_state_dict(state["manager"])
    tw.emit("restore", step=manager.current_step(), checkpoint=name, digest=state_digest(model, optimizer))
    return int(state["epoch"]), int(state["position"])


def build_manager(args: argparse.Namespace, who: ReplicaRank, tw: ReplicaProbe, model: nn.Module,
                  optimizer: torch.optim.Optimizer) -> Manager:
    """torchft's Manager as its README builds it, on loopback, with the probe's hooks: heals are
    recorded (with the digest of what was loaded), served states too, and the all-reduce is a
    fault point."""
    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        if not args.heal_model_only:
            optimizer.load_state_dict(state["optim"])
        tw.healed(model, optimizer)

    timeout = timedelta(seconds=args.timeout)
    transport = LoopbackHTTPTransport(timeout, tw.on_send, tw.on_recv)
    record_quorums(tw)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=args.min_replicas,
                      load_state_dict=load_state_dict,
                      state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()},
                      replica_id=f"group_{who.group}", hostname=LOOPBACK, timeout=timeout,
                      quorum_timeout=timeout * 3, connect_timeout=timeout, checkpoint_transport=transport,
                      init_sync=False)  # every group seeds the same weights; a step-0 heal would drop a batch
    tw.digest = lambda: state_digest(model, optimizer)
    tw.current_step = manager.current_step
    allreduce_point(manager, tw)
    return manager


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    who = ReplicaRank.from_env()
    loopback_only()
    torch.manual_seed(0)  # every group starts from the same weights (hence init_sync=False)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tw = ReplicaProbe(who)
    data = Synthetic(DATASET)
    tw.start(dataset_size=DATASET, global_batch=args.batch * who.world_size, drop_last=True,
             total_steps=args.steps, exactly_once=args.claim_exactly_once)

    manager = build_manager(args, who, tw, model, optimizer)
    ddp = DistributedDataParallel(manager, model)
    sampler = DistributedSampler(data, replica_rank=who.group, num_replica_groups=who.groups,
                                 group_rank=who.group_rank, num_replicas=who.group_world_size,
                                 shuffle=True, seed=0, drop_last=True)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
    store = Checkpoints(tw)
    epoch, skip = resume(args, store, tw, model, optimizer, manager)
    tw.ready()  # groups the harness started together meet here: a fair first quorum
    while manager.current_step() < args.steps:
        sampler.set_epoch(epoch)
        for position, (ids, x, y) in enumerate(loader):
            if position < skip:
                continue  # a resumed epoch: these batches were used before the checkpoint
            if manager.current_step() >= args.steps:
                break
            tw.point(STEP_START, manager.current_step() + 1)
            manager.start_quorum()  # what OptimizerWrapper.zero_grad() does first
            optimizer.zero_grad()
            loss = F.mse_loss(ddp(x), y)
            loss.backward()
            if args.step_seconds:
                time.sleep(args.step_seconds)  # the compute a real model would spend here
            participating = manager.is_participating()
            committed = manager.should_commit()  # a heal is applied in here: the step number may jump
            step = manager.current_step() if committed else manager.current_step() + 1
            tw.batch(step, epoch, ids.tolist())
            if committed:
                optimizer.step()
            digest = state_digest(model, optimizer) if committed else None
            tw.outcome(step, committed, participating, manager.num_participants(), getattr(manager, "_quorum_id", -1),
                       float(loss.detach()), digest)
            if committed and args.save_every and step % args.save_every == 0:
                store.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict(),
                                  "manager": manager.state_dict(), "epoch": epoch, "position": position + 1}, digest)
        epoch, skip = epoch + 1, 0
    tw.close()
    manager.shutdown(wait=False)
    del ddp
    gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
