"""A tiny Lightning job, resumable, for trainwreck: 2 ranks on CPU gloo, started per rank by the
harness (torchrun's environment contract), offline, a model built from config.

    python lightning_train.py [--ckpt-dir DIR] [--steps 12] [--save-every 4] [--global-batch 8] [--resume]
"""
from __future__ import annotations

import argparse
import gc
from pathlib import Path

import torch

from trainwreck.trainer.probe import Probe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", help="default: $TRAINWRECK_RUN_DIR/checkpoints")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=8, help="per-device batch = this / world size")
    parser.add_argument("--top-k", type=int, default=2, help="ModelCheckpoint save_top_k (0: last.ckpt only)")
    parser.add_argument("--resume", action="store_true", help="resume from last.ckpt if there is one")
    args = parser.parse_args(argv)
    probe = Probe.from_env()
    ckpt_dir = args.ckpt_dir or str(Path(probe.run_dir or ".") / "checkpoints")
    probe.write_run_json(dataset_size=64, global_batch=args.global_batch, drop_last=False, total_steps=args.steps)
    torch.set_num_threads(1)

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from trainwreck.trainer.frameworks.lightning import adapters, track_samples

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = torch.utils.data.DataLoader(track_samples(data), batch_size=args.global_batch // probe.world_size,
                                         shuffle=True, num_workers=0)
    callback, io = adapters(probe)
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.save_every, save_top_k=args.top_k,
                           monitor="step", mode="max", save_last=True)
    trainer = L.Trainer(accelerator="cpu", devices=int(probe.world_size), strategy="ddp", max_steps=args.steps,
                        callbacks=[callback, ckpt], plugins=[io], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, deterministic=True)
    last = Path(ckpt_dir) / "last.ckpt"
    trainer.fit(Tiny(), loader, ckpt_path=str(last) if args.resume and last.exists() else None)
    probe.phase(args.steps, "done")
    # Lightning leaves the process group to the interpreter's teardown, where gloo's threads
    # were destroyed still running and a rank aborted at exit (-6) after the last update: free
    # the trainer (its DDP model holds the group through reference cycles), then destroy it.
    del trainer
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    probe.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
