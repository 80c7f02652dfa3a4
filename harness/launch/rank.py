"""The in-rank bootstrap every launcher ends in: tie the rank to its parent, arm the
stack dump, read the job from run.json, build the hooks, run the trainer.

    python -m trainwreck.harness.launch.rank --ctx '<RankContext as JSON>'      (spawn launcher)
    python -m trainwreck.harness.launch.rank --run-dir DIR [--standalone]       (under torchrun)
"""
from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import importlib
import importlib.util
import json
import os
import signal
from pathlib import Path
from typing import IO, Any, Callable

from trainwreck.harness.launch.procs import set_parent_death_signal
from trainwreck.trainer.launch import RankContext
from trainwreck.rundir.arguments import end_without_collecting
from trainwreck.rundir.layout import RunDir, read_run_json

_keep_alive: list[IO[str]] = []  # faulthandler writes to this file until the process dies


SHARDING_MODULES = (
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
)
"""FSDP's and DCP's modules (1.5 s of DTensor imports here): the trainer imports them when it first
shards or writes shards (trainer/parallel.py fsdp2, trainer/sharded.py), so the server holds them."""

# Imported by the fork server before any fork, so forked ranks start with them in
# memory, and by a fresh rank before it publishes progress, so imports never count
# against the hang budget. The DDP constructor
# and the first step import more lazily; those found by measuring are listed too.
WARM_MODULES = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.distributed.distributed_c10d",
    "torch.distributed.algorithms.join",
    "torch.distributed.utils",
    "torch.nn.functional",
    "torch.optim",
    "torch.optim.lr_scheduler",
    # Optimizer.__init__ is wrapped by torch._disable_dynamo, which imports torch._dynamo
    # on first use: about 3 s per rank on a 2-core box, measured. Importing it starts no
    # threads, so it is safe to hold in the fork server.
    "torch._dynamo",
    "torch.utils.serialization",  # torch.save in the first checkpoint
    "torch.profiler._cupti_monitor",  # record_function (DDP's forward) imports it on first use
    *SHARDING_MODULES,
    "trainwreck.trainer.config",
    "trainwreck.rundir.events",
    "trainwreck.trainer.progress",
    "trainwreck.trainer.launch",
    "trainwreck.trainer.hooks",
    "trainwreck.trainer.loop",
    "trainwreck.trainer.entry",
    "trainwreck.harness.launch.rank",
    "trainwreck.faults.inrank",
)


def warm_imports() -> None:
    for name in WARM_MODULES:
        # A module that is not written yet (or a trainer without it) is simply not warmed.
        try:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a broken optional module must not take the server down
            pass
    # Every rank's build_hooks imports the injector of each in-rank kind its plan holds, as
    # faults/plan.py KINDS declares it (loaded once per name): about 3 ms per rank per attempt.
    try:
        from trainwreck.faults.inrank import load_injectors

        load_injectors()
    except Exception:  # noqa: BLE001 - as above: the rank then imports them itself
        pass


def accelerator_built() -> bool:
    """Whether this torch was built with an accelerator (CUDA, ROCm, XPU, MPS): read from how it
    was compiled, never by asking a device, which would start its driver in this process."""
    import torch

    return bool(torch.version.cuda or torch.version.hip or getattr(torch._C, "_has_xpu", False)
                or torch.backends.mps.is_built())


def warm_kernels() -> None:
    """The reference trainer's forward pass and optimizer step, once, in the fork server: a rank
    forked after it finds torch's first-call work done (a child's first update of the tiny model
    took 12.4-13.5 ms forked cold, 6.1-7.7 ms forked after this; 2026-11-28). Only where torch has
    no accelerator built in: an optimizer's step asks torch for the accelerator's current stream,
    which starts CUDA, and no child forked after that can use CUDA. On the CPU, one thread, and no
    backward either (autograd's first backward starts a thread per device). The RNG streams and
    the thread count are put back, so what the ranks inherit is only warmer."""
    if accelerator_built():
        return
    import random

    import torch
    import torch.nn.functional as F

    from trainwreck.trainer.config import TrainConfig
    from trainwreck.trainer.data import SyntheticDataset
    from trainwreck.trainer.state import fresh_state

    threads, streams = torch.get_num_threads(), (random.getstate(), torch.get_rng_state())
    torch.set_num_threads(1)
    try:
        cfg = TrainConfig.tiny()
        state = fresh_state(cfg, torch.device("cpu"))
        ids = torch.arange(cfg.global_batch)
        x, y = SyntheticDataset(cfg.seed, cfg.dataset_size, cfg.input_dim, cfg.num_classes).batch(ids)
        with torch.no_grad():
            F.cross_entropy(state.model(x, ids, 0), y, reduction="sum")
        for param in state.model.parameters():
            param.grad = torch.zeros_like(param)
        state.optimizer.step()
        state.scheduler.step()
        state.optimizer.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
        random.setstate(streams[0])
        torch.set_rng_state(streams[1])


def arm_stack_dump(ctx: RankContext) -> Path:
    """SIGUSR1 makes faulthandler write every thread's Python stack, even inside a C call."""
    path = RunDir(ctx.run_dir).rank_stacks(ctx.attempt, ctx.rank, os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "w")
    _keep_alive.append(handle)
    faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True)
    return path


def resolve(dotted: str) -> Callable[..., Any]:
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def build_hooks(plan: list[dict[str, Any]], factory: str | None) -> Any:
    """The plan's in-rank injector; NoHooks when nothing in the plan acts inside a rank."""
    from trainwreck.trainer.hooks import NoHooks

    if factory:
        return resolve(factory)(plan)
    if not plan:
        return NoHooks()  # even a plan of harness faults only has in-rank work: waiting for them
    if importlib.util.find_spec("trainwreck.faults.inrank") is None:
        raise RuntimeError("the plan has in-rank faults but faults.inrank is not installed")
    from trainwreck.faults.inrank import build_hooks as build  # written in faults/; imported only when needed

    return build(plan)


def run(ctx: RankContext) -> None:
    """Run one rank of the job described by ctx.run_dir/run.json (raises on failure)."""
    import torch

    torch.set_num_threads(1)  # every rank shares the same few cores
    arm_stack_dump(ctx)
    warm_imports()  # a no-op in a forked rank; a fresh one pays here, before its first publish
    job = read_run_json(ctx.run_dir)
    from trainwreck.trainer.config import TrainConfig

    cfg = TrainConfig.from_dict(job["config"])
    hooks = build_hooks(job.get("faults", []), job.get("hooks_factory"))
    resolve(job.get("entry") or "trainwreck.trainer.entry:run_rank")(ctx, cfg, hooks)


def ctx_to_json(ctx: RankContext) -> str:
    data = dataclasses.asdict(ctx)
    data["run_dir"] = str(ctx.run_dir)
    return json.dumps(data)


def ctx_from_json(text: str) -> RankContext:
    data = json.loads(text)
    data["run_dir"] = Path(data["run_dir"])
    return RankContext(**data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.harness.launch.rank", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", help="RankContext as JSON (the spawn launcher passes it)")
    parser.add_argument("--run-dir", type=Path, help="run directory with run.json (under torchrun)")
    parser.add_argument("--standalone", action="store_true",
                        help="no harness supervises: rank 0 writes `end` itself (multi-host torchrun)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit at once if this is no longer our parent (set by the harness)")
    args = parser.parse_args(argv)
    end_without_collecting()
    set_parent_death_signal(args.parent_pid)
    if args.ctx:
        ctx = ctx_from_json(args.ctx)
    elif args.run_dir:
        ctx = RankContext.from_torchrun_env(args.run_dir)
        ctx = dataclasses.replace(ctx, standalone=args.standalone)
    else:
        parser.error("give --ctx JSON or --run-dir DIR")
    run(ctx)


if __name__ == "__main__":
    main()
