"""A tiny accelerate job, resumable the way accelerate's docs show (load_state, then
skip_first_batches for the rest of the epoch), for trainwreck: 2 ranks on CPU gloo, started per
rank by the harness (torchrun's environment contract), offline, a model built from config.

    python accelerate_train.py [--steps 12] [--save-every 3] [--global-batch 8] [--resume] [--no-skip]
"""
from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import torch

from trainwreck.trainer.probe import Probe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=8, help="per-device batch = this / world size")
    parser.add_argument("--resume", action="store_true", help="resume from the newest checkpoint if any")
    parser.add_argument("--no-skip", action="store_true", help="resume without skip_first_batches")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    from trainwreck.trainer.frameworks.accelerate import TrainwreckLoop
    from trainwreck.trainer.frameworks import track_samples

    probe = Probe.from_env()
    run_dir = Path(probe.run_dir or ".")
    probe.write_run_json(dataset_size=64, global_batch=args.global_batch, drop_last=False, total_steps=args.steps)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(run_dir), automatic_checkpoint_naming=True, total_limit=2))
    set_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = torch.utils.data.DataLoader(track_samples(data), shuffle=True, num_workers=0,
                                         batch_size=args.global_batch // accelerator.num_processes)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    loop = TrainwreckLoop(accelerator, probe)
    step, epoch = 0, 0
    checkpoints = run_dir / "checkpoints"
    if args.resume and checkpoints.is_dir() and os.listdir(checkpoints):
        step, epoch = loop.resume(model, optimizer)
        # automatic naming would otherwise number the next save from 0 again
        accelerator.project_configuration.iteration = 1 + max(int(f.rsplit("_", 1)[-1]) for f in os.listdir(checkpoints))
    per_epoch = len(loader)
    epoch, done_in_epoch = divmod(step, per_epoch)
    while step < args.steps:
        epoch_loader = loader
        if done_in_epoch and not args.no_skip:
            epoch_loader = accelerator.skip_first_batches(loader, done_in_epoch)
        for xb, yb in epoch_loader:
            step += 1
            loop.batch(step, epoch, (xb, yb))
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            loop.step(step, epoch, loss, model, optimizer)
            if step % args.save_every == 0:
                loop.save(step, model, optimizer)
            if step == args.steps:
                break
        epoch, done_in_epoch = epoch + 1, 0
    accelerator.wait_for_everyone()
    probe.phase(args.steps, "done")
    probe.close()
    accelerator.end_training()
    # The prepared (DDP) model holds the process group through reference cycles: freed only at
    # the interpreter's teardown, gloo's threads died still running and a rank aborted (-6).
    del model, optimizer, loop, accelerator
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
