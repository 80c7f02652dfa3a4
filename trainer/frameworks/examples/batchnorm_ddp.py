"""A small DDP model with BatchNorm, instrumented with the probe's helpers (docs/FRAMEWORKS.md).

    trainwreck run --cmd "python batchnorm_ddp.py" --world-sizes 2

What people write, and what the judge must not call wrong: BatchNorm's running statistics
differ between DDP ranks at every step's end by design (rank 0's are broadcast at the next
forward, then each rank updates its own from its batch), so the probe digests them apart
from the parameters (`buffers`). The checkpoint is one file, `torch.save`d in place:

    --eval-every-save     evaluate between the update and the save (under DDP the evaluation's
                          forward broadcasts rank 0's buffers: the saved bytes are not the
                          update's state)
    --every-rank-saves    every rank writes the same path (rank 0 alone otherwise)
    --no-sync             a planted bug: gradients are never all-reduced, so replicas diverge

A resume loads the file on every rank; bytes that do not load (torn) are rejected and the
run starts fresh."""
import argparse, gc
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainwreck.trainer.probe import Probe

p = argparse.ArgumentParser()
p.add_argument("--run-dir"), p.add_argument("--steps", "--total-steps", type=int, default=12)
p.add_argument("--global-batch", type=int, default=8), p.add_argument("--save-every", type=int, default=3)
p.add_argument("--eval-every-save", action="store_true"), p.add_argument("--every-rank-saves", action="store_true")
p.add_argument("--no-sync", action="store_true")
args = p.parse_args()
N, B, T = 64, args.global_batch, args.steps                   # dataset size, global batch, updates

probe = Probe.from_env(args.run_dir, seed=0)
probe.write_run_json(dataset_size=N, global_batch=B, drop_last=True, total_steps=T)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
X = torch.randn(N, 1, 4, 4, generator=torch.Generator().manual_seed(1))
Y = (X.mean((1, 2, 3)) > 0).long()
model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                      nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters(), lr=0.02)
ddp = DDP(model)
probe.track(model, opt)
path = Path(probe.path("ckpt.pt"))

done = 0
if path.exists():
    try:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"]), opt.load_state_dict(state["opt"])
        done = state["step"]
        probe.restored(path, done)
    except Exception as exc:  # a torn or damaged file that does not load: rejected, the run starts fresh
        probe.reject(path.name, f"does not load: {type(exc).__name__}", path=path)


def evaluate() -> None:
    ddp.eval()
    with torch.no_grad():
        ddp(X[:16])
    ddp.train()


for step in range(done + 1, T + 1):
    epoch, offset = divmod((step - 1) * B, N)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(epoch))
    ids = order[offset:offset + B][rank * B // world:(rank + 1) * B // world]
    with probe.update(step, epoch=epoch, samples=ids.tolist()):
        with ddp.no_sync() if args.no_sync else nullcontext():  # the planted bug: no all-reduce
            loss = F.cross_entropy(ddp(X[ids]), Y[ids])
            loss.backward()
        opt.step(), opt.zero_grad()
        probe.loss(loss)
    if step % args.save_every == 0:
        if args.eval_every_save:
            evaluate()
        if rank == 0 or args.every_rank_saves:
            with probe.checkpoint(path):
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
        dist.barrier()                                        # the file is whole before anyone goes on
dist.barrier()
del ddp; gc.collect()
dist.destroy_process_group()
