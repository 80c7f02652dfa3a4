"""A tiny Ray Train job for trainwreck: `TorchTrainer`, 2 CPU workers on gloo, Ray's own restarts.

    python ray_train.py [--data loader|dataset] [--steps 12] [--save-every 3] [--max-failures 1]
                        [--min-workers 1] [--run-dir DIR]

The driver starts two simulated Ray nodes on 127.0.0.1 (trainer/frameworks/ray_train.py
`simulated_cluster`: a head and a worker node, one worker each), runs the trainer and shuts Ray
down. With --min-workers below --workers the group is elastic (ScalingConfig(num_workers=(min,
max))): a node lost is not replaced and Ray restarts the group on what is left; else a lost
node is replaced, as a cluster's autoscaler would, and the group restarts at full size. Each worker resumes from
`ray.train.get_checkpoint()` (model, optimizer, RNG, update), skips the batches of the epoch it
already trained, and reports a checkpoint through `ray.train.report` every --save-every updates.

Two data paths, the ids every batch carries being the samples' own:
- ``loader``: a DataLoader made distributed by `ray.train.torch.prepare_data_loader`
  (a DistributedSampler, shuffled, `set_epoch` per epoch);
- ``dataset``: a Ray Dataset of 64 ids, `get_dataset_shard("train").iter_torch_batches`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

N, FEATURES = 64, 4


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, FEATURES, generator=g)
    return x, (x.sum(1) > 0).long()


class Ids(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def batches(data: str, epoch: int, per_rank: int):  # type: ignore[no-untyped-def]
    """This worker's batches of ids for `epoch`."""
    import ray.train
    import ray.train.torch

    if data == "dataset":
        for batch in ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=per_rank, drop_last=True):
            yield batch["id"].long()
        return
    loader = torch.utils.data.DataLoader(Ids(), batch_size=per_rank, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(epoch))
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    yield from loader


def train_loop(config: dict) -> None:  # type: ignore[type-arg]
    import ray.train.torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from trainwreck.trainer.frameworks.ray_train import report, restore, worker_probe
    from trainwreck.trainer.probe import state_digest

    torch.set_num_threads(1)
    probe = worker_probe()
    steps, global_batch = config["steps"], config["global_batch"]
    probe.write_run_json(dataset_size=N, global_batch=global_batch, drop_last=True, total_steps=steps)
    probe.start(data=config["data"])
    world = probe.world_size
    per_rank = global_batch // world
    per_epoch = N // global_batch
    x, y = make_data()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    state = restore(probe, model, optimizer)
    ddp = ray.train.torch.prepare_model(model, move_to_device=False)
    step = state.get("step", 0)
    scratch = Path(probe.run_dir or tempfile.mkdtemp()) / "ray_scratch" / f"rank{probe.rank}"  # what report copies from
    while step < steps:
        epoch, done_in_epoch = divmod(step, per_epoch)
        for index, ids in enumerate(batches(config["data"], epoch, per_rank)):
            if index < done_in_epoch:
                continue  # trained before the checkpoint: skipped, as a mid-epoch resume must
            if step >= steps or index >= per_epoch:
                break
            step += 1
            probe.point("step_start", step)
            probe.batch(step, epoch, ids)
            loss = F.cross_entropy(ddp(x[ids]), y[ids], reduction="sum")
            (loss * world / global_batch).backward()
            optimizer.step(), optimizer.zero_grad()
            total = loss.detach().clone()
            dist.all_reduce(total)
            digest = state_digest(model, optimizer)
            probe.step(step, total.item() / global_batch, digest)
            if step % config["save_every"] == 0 or step == steps:
                snapshot = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "rng": torch.get_rng_state(), "digest": digest}
                report(probe, step, snapshot, {"step": step, "loss": total.item() / global_batch}, scratch)
    probe.phase(step, "done")
    dist.barrier()
    probe.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", choices=("loader", "dataset"), default="loader")
    p.add_argument("--steps", "--total-steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-failures", type=int, default=int(os.environ.get("TRAINWRECK_MAX_RESTARTS", "0")))
    p.add_argument("--min-workers", type=int, default=int(os.environ.get("TRAINWRECK_MIN_WORKERS", "0")),
                   help="the fewest workers an elastic group may restart with (0: --workers, a fixed size)")
    p.add_argument("--run-dir", help="where the run directory goes without the harness")
    args = p.parse_args(argv)
    if args.run_dir and not os.environ.get("TRAINWRECK_RUN_DIR"):
        os.environ["TRAINWRECK_RUN_DIR"] = str(Path(args.run_dir).absolute())
    run_dir = Path(os.environ.get("TRAINWRECK_RUN_DIR") or tempfile.mkdtemp(prefix="ray-train-"))

    import ray.data
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from trainwreck.trainer.frameworks.ray_train import SLOT, loopback_torch_config, simulated_cluster

    elastic = 0 < args.min_workers < args.workers
    with simulated_cluster(run_dir, replace=not elastic):
        datasets = {}
        if args.data == "dataset":
            ray.data.DataContext.get_current().execution_options.preserve_order = True
            datasets = {"train": ray.data.range(N)}
        trainer = TorchTrainer(
            train_loop, train_loop_config={"steps": args.steps, "global_batch": args.global_batch,
                                           "save_every": args.save_every, "data": args.data},
            torch_config=loopback_torch_config(),
            scaling_config=ScalingConfig(num_workers=(args.min_workers, args.workers) if elastic else args.workers,
                                         use_gpu=False, resources_per_worker={"CPU": 1, SLOT: 1}),
            run_config=RunConfig(name="trainwreck", storage_path=str(run_dir / "ray_storage"),
                                 failure_config=FailureConfig(max_failures=args.max_failures)),
            datasets=datasets)
        result = trainer.fit()
        print(f"ray train finished: error={result.error!r} checkpoint={result.checkpoint}", flush=True)
        return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
