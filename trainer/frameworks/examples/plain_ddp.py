"""A plain torchrun DDP script instrumented with the trainwreck probe (docs/FRAMEWORKS.md).

    torchrun --nproc-per-node 2 plain_ddp.py --run-dir RUN      # on its own
    trainwreck run --cmd "python plain_ddp.py" --world-sizes 2   # under the harness

Checkpoints: rank 0 writes one file, atomically (tmp, fsync, rename), named by its sha256;
a resume verifies that checksum, loads weights-only, and falls back to the previous file."""
import argparse, gc, hashlib, io, os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from trainwreck.trainer.probe import Probe, state_digest

p = argparse.ArgumentParser()
p.add_argument("--run-dir"), p.add_argument("--ckpt-dir", default="checkpoints")
p.add_argument("--steps", "--total-steps", type=int, default=12), p.add_argument("--save-every", type=int, default=3)
p.add_argument("--global-batch", type=int, default=8)
p.add_argument("--per-device-batch", type=int, help="samples per rank per update, as most scripts size it: the "
               "global batch then follows the world size, and the job is --epochs epochs instead of --steps updates")
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()
W = int(os.environ.get("WORLD_SIZE", "1"))
N = 64                                                                  # dataset size
B = args.per_device_batch * W if args.per_device_batch else args.global_batch   # global batch
T = args.epochs * N // B if args.per_device_batch else args.steps       # updates (at this world size)

probe = Probe.from_env(args.run_dir)                           # 1. the probe (a no-op without a run dir)
probe.write_run_json(dataset_size=N, global_batch=B, drop_last=True, total_steps=T)   # 2.
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
probe.start()                                                  # 3.
torch.manual_seed(0)
X = torch.randn(N, 4)
Y = (X.sum(1) > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
ddp = DDP(model)
ckpts = Path(probe.run_dir or ".") / args.ckpt_dir
ckpts.mkdir(parents=True, exist_ok=True)

done = seen = 0                                                # updates applied, samples consumed
for path in sorted(ckpts.glob("ckpt-*.pt"), reverse=True):    # newest first; a bad one is skipped
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest()[:16] != path.stem.split("-")[2]:
        probe.reject(path.name, "checksum mismatch")           # 4.
        continue
    state = torch.load(io.BytesIO(data), weights_only=True)
    model.load_state_dict(state["model"]), opt.load_state_dict(state["opt"])
    done = state["step"]
    seen = state.get("seen", done * B)                         # a per-device batch resumes by samples, not updates
    probe.recover(done, path.name, state["digest"], state["attempt"], path=path)   # its writer may have died before 8.
    probe.restore(done, path.name, state_digest(model, opt), path=path)   # 5.
    break


def write_checkpoint(step: int, digest: str) -> str:
    """tmp + fsync + rename + fsync of the folder; the name carries the bytes' sha256, so a file
    under that name is whole and committed (what lets a resume `recover` an unreported save)."""
    buf = io.BytesIO()
    torch.save({"step": step, "seen": seen, "model": model.state_dict(), "opt": opt.state_dict(), "digest": digest,
                "attempt": probe.attempt}, buf)
    name = f"ckpt-{step:06d}-{hashlib.sha256(buf.getvalue()).hexdigest()[:16]}.pt"
    tmp = ckpts / f".{name}.tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getvalue()), f.flush(), os.fsync(f.fileno())
    os.replace(tmp, ckpts / name)
    fd = os.open(ckpts, os.O_RDONLY); os.fsync(fd); os.close(fd)   # the rename is durable
    return name


def more(step: int) -> bool:
    return seen + B <= args.epochs * N if args.per_device_batch else step < T


step = done
while more(step):
    step += 1
    epoch, offset = divmod(seen, N)
    if offset + B > N:                                         # drop_last: the epoch's short tail is skipped
        epoch, offset = epoch + 1, 0
    order = torch.randperm(N, generator=torch.Generator().manual_seed(epoch))
    ids = order[offset:offset + B][rank * B // world:(rank + 1) * B // world]
    seen = epoch * N + offset + B
    probe.point("step_start", step)                            # (a fault point: kill/hang faults fire here)
    probe.batch(step, epoch, ids)                              # 6.
    loss = F.cross_entropy(ddp(X[ids]), Y[ids], reduction="sum")
    (loss * world / B).backward()                              # DDP's mean over ranks: the global-batch mean
    opt.step(), opt.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total)
    digest = state_digest(model, opt)
    probe.step(step, total.item() / B, digest)                 # 7.
    if step % args.save_every == 0:
        dist.barrier()  # every rank's events of this update are on disk (probe.step flushed) before its commit
        if rank == 0:                                          # rank 0 writes all of it
            with probe.saving(step, ckpts):                    # its file operations are crash points
                name = write_checkpoint(step, digest)
            probe.commit(step, name, digest, path=ckpts / name)  # 8. only now, durable: `save`
probe.phase(step, "done"), probe.end(step)                     # 9.
dist.barrier()                                                 # nobody tears gloo down under a peer
# DDP holds the process group through reference cycles: freed only at interpreter teardown,
# gloo's threads died still running and a rank aborted at exit (-6) now and then.
del ddp; gc.collect()
dist.destroy_process_group()
probe.close()                                                  # 10.
