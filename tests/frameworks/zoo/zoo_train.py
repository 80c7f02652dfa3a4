"""The model zoo: tiny versions of patterns real training scripts have, instrumented with the probe
as docs/FRAMEWORKS.md shows, each run by tests/frameworks/test_zoo.py under `trainwreck run --cmd`.

    python zoo_train.py --pattern resnet|syncbn|ema|clip|nonpersistent [--bug NAME]

Patterns (each a correct script; the judge must call its golden run and a kill-and-resume VALID):
    resnet         a ResNet basic block (conv-BN-ReLU-conv-BN plus the skip) under DDP: BatchNorm's
                   running statistics differ between ranks by design
    syncbn         the same block with SyncBatchNorm: statistics agree across ranks (CUDA only: torch's
                   SyncBatchNorm refuses CPU tensors; the ranks share the visible GPUs over gloo)
    ema            an exponential moving average of the weights, saved and restored with them
    clip           gradient clipping by global norm (after DDP's all-reduce, as DDP applies it)
    nonpersistent  a non-persistent buffer (a schedule the forward reads, rebuilt from the step)
Planted bugs (--bug; each must be caught by the invariant the test names):
    no-sync            gradients never all-reduced: replicas diverge
    ema-not-saved      the EMA is left out of the checkpoint and restarts from the initial weights
    stats-not-saved    the BatchNorm statistics are left out of the checkpoint
    optimizer-reset    the optimizer is built fresh on resume (its moments lost)
    buffer-not-rebuilt the non-persistent buffer is not rebuilt from the restored step
"""
import argparse
import gc
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainwreck.trainer.probe import Probe

p = argparse.ArgumentParser()
p.add_argument("--run-dir"), p.add_argument("--steps", type=int, default=12)
p.add_argument("--pattern", required=True, choices=("resnet", "syncbn", "ema", "clip", "nonpersistent"))
p.add_argument("--bug", default="", choices=("", "no-sync", "ema-not-saved", "stats-not-saved", "optimizer-reset",
                                              "buffer-not-rebuilt"))
args = p.parse_args()
N, B, T, SAVE_EVERY = 64, 8, args.steps, 3                   # dataset size, global batch, updates, save interval

probe = Probe.from_env(args.run_dir, seed=0)
probe.write_run_json(dataset_size=N, global_batch=B, drop_last=True, total_steps=T)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
DEVICE = torch.device("cuda", rank % max(torch.cuda.device_count(), 1)) if args.pattern == "syncbn" else torch.device("cpu")
X = torch.randn(N, 4, 6, 6, generator=torch.Generator().manual_seed(1)).to(DEVICE)
Y = (X.mean((1, 2, 3)) > 0).long()


class BasicBlock(nn.Module):
    """ResNet's basic block, as torchvision writes it, at 4 channels."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + x)


class Net(nn.Module):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.block = BasicBlock(4) if pattern in ("resnet", "syncbn") else nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4 * 6 * 6, 2)
        # A schedule the forward reads, derived from the step: not worth saving, so not persistent.
        self.register_buffer("temperature", torch.ones(()), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.block(x), 1)) / self.temperature


def temperature_at(step: int) -> torch.Tensor:
    return torch.tensor(1.0 + 0.05 * step, device=DEVICE)


torch.manual_seed(0)
model = Net(args.pattern)
if args.pattern == "syncbn":
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
model = model.to(DEVICE)
ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9)) \
    if args.pattern == "ema" else None
opt = torch.optim.AdamW(model.parameters(), lr=0.02)
ddp = DDP(model, device_ids=[DEVICE.index] if DEVICE.type == "cuda" else None)
# The state the digests cover: the model, and the EMA where there is one (it is part of what a resume restores).
tracked = nn.ModuleDict({"model": model, **({"ema": ema} if ema is not None else {})})
probe.track(tracked, opt)
path = Path(probe.path("ckpt.pt"))


def state(step: int) -> dict:
    saved = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
    if args.bug == "stats-not-saved":
        saved["model"] = {k: v for k, v in saved["model"].items() if "running_" not in k and "num_batches" not in k}
    if ema is not None and args.bug != "ema-not-saved":
        saved["ema"] = ema.state_dict()
    return saved


done = 0
if path.exists():
    try:
        loaded = torch.load(path, weights_only=True, map_location=DEVICE)
    except Exception as exc:  # a torn file: start fresh (its bytes were never committed)
        probe.reject(path.name, f"does not load: {type(exc).__name__}", path=path)
    else:
        model.load_state_dict(loaded["model"], strict=args.bug != "stats-not-saved")
        if args.bug != "optimizer-reset":
            opt.load_state_dict(loaded["opt"])
        if ema is not None and "ema" in loaded:
            ema.load_state_dict(loaded["ema"])
        done = loaded["step"]
        if args.bug != "buffer-not-rebuilt":
            model.temperature.copy_(temperature_at(done))
        probe.restored(path, done)

for step in range(done + 1, T + 1):
    epoch, offset = divmod((step - 1) * B, N)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(epoch))
    ids = order[offset:offset + B][rank * B // world:(rank + 1) * B // world]
    with probe.update(step, epoch=epoch, samples=ids.tolist()):
        with ddp.no_sync() if args.bug == "no-sync" else nullcontext():
            loss = F.cross_entropy(ddp(X[ids]), Y[ids])
            loss.backward()
        if args.pattern == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        opt.step(), opt.zero_grad()
        if ema is not None:
            ema.update_parameters(model)
        model.temperature.copy_(temperature_at(step))
        probe.loss(loss)
    if step % SAVE_EVERY == 0:
        if rank == 0:
            with probe.checkpoint(path):
                torch.save(state(step), path)
        dist.barrier()                                        # the file is whole before anyone goes on
dist.barrier()
del ddp; gc.collect()
dist.destroy_process_group()
