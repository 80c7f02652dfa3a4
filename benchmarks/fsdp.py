"""DDP against FSDP, measured: per-rank bytes of parameters, gradients and AdamW state, step
time, and the loss trajectory of the same spec.

The "12 bytes per parameter for Adam" rule counts fp32 parameters plus AdamW's two fp32
moments (4 + 4 + 4); gradients add 4 more while they exist. DDP keeps all of it on every rank
(its gradient buckets hold another copy of the gradients, not counted here); FSDP keeps
1/world of each. The figures are the tensors a rank actually holds after a real backward and
optimizer step, so the arithmetic is checked, not assumed.

That is the steady state. Inside a step FSDP also holds the parameters it has all-gathered for
the layer it is computing (and any it has prefetched): `peak_gathered_bytes` is the most
unsharded parameter bytes alive at once, read in a hook at every layer's forward and backward
of the last step (a parameter FSDP has gathered is a plain tensor on its module; a sharded one
is a DTensor); DDP holds every parameter whole all the time, so its figure is all of them.

For the question "what tells you the move to FSDP was wrong?" each job also reports rank 0's peak
resident memory (`peak_rss_bytes`, getrusage: the process, the interpreter and torch included) beside
the machine's physical memory and cores: the headroom the model left under DDP is measured, not assumed.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from contextlib import nullcontext
from pathlib import Path
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainwreck.benchmarks.ranks import gloo_rank, run_ranks
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.data import SyntheticDataset
from trainwreck.trainer.parallel import build_state, wrap
from trainwreck.trainer.sampler import rank_slice

SPEC = TrainConfig(width=1024, depth=3, dropout=0.0, dataset_size=4096, global_batch=256, warmup_steps=0)
LOSS_RTOL = 1e-3
"""The tolerance docs/TRAINER.md states for another reduction order."""


def _local_bytes(tensors: list[torch.Tensor]) -> int:
    # A DTensor's local shard is what this rank stores; a plain tensor is all of it.
    return sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in tensors)


def _whole_param_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters held whole right now (DTensor shards are FSDP's resting state)."""
    return sum(p.nbytes for p in model.parameters() if not hasattr(p, "to_local"))


def _watch_gathered(model: torch.nn.Module, samples: list[int]) -> Any:
    """A context sampling _whole_param_bytes whenever autograd saves a tensor (each layer's forward)
    or unpacks one (its backward): the moments FSDP's gathered parameters are in use. Saved-tensor
    hooks, not module hooks: a full backward hook re-wraps each module's output as a view, which
    FSDP warns can drop its own pre-backward all-gather."""
    def sample(tensor: torch.Tensor) -> torch.Tensor:
        samples.append(_whole_param_bytes(model))
        return tensor

    return torch.autograd.graph.saved_tensors_hooks(sample, sample)


def _train(rank: int, world: int, cfg: TrainConfig, steps: int) -> dict[str, Any]:
    device = torch.device("cpu")
    state = build_state(cfg, device, False, None)
    model = wrap(cfg, state, device)
    data = SyntheticDataset(cfg.seed, cfg.dataset_size, cfg.input_dim, cfg.num_classes)
    losses, seconds, grads = [], [], 0
    gathered: list[int] = []
    for step in range(steps):
        # The last step is watched (after the first steps' one-off allocations); the hooks' cost
        # reaches one step time of the median's several.
        watch = _watch_gathered(state.model, gathered) if step == steps - 1 else nullcontext()
        ids = rank_slice(torch.arange(step * cfg.global_batch, (step + 1) * cfg.global_batch), rank, world)
        x, y = data.batch(ids)
        started = time.perf_counter()
        with watch:
            loss = F.cross_entropy(model(x, ids, 0), y, reduction="sum")
            (loss * world / cfg.global_batch).backward()
        grads = _local_bytes([p.grad for p in state.model.parameters() if p.grad is not None])
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / cfg.global_batch)
    moments = [v for s in state.optimizer.state.values() for k, v in s.items() if k != "step"]
    layers = [m for m in state.model.modules() if isinstance(m, torch.nn.Linear)]
    return {"peak_gathered_bytes": max(gathered),
            "largest_layer_bytes": max(sum(p.numel() * 4 for p in m.parameters()) for m in layers),
            "params": _local_bytes(list(state.model.parameters())), "grads": grads,
            "optimizer": _local_bytes(moments), "losses": losses,
            "numel": sum(p.numel() for p in state.model.parameters()),
            "step_s": sorted(seconds[1:])[len(seconds[1:]) // 2],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux reports KiB
            "memory_total_bytes": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "cores": os.cpu_count()}


def _rank(rank: int, world: int, port: int, parallelism: str, steps: int, out: Path) -> None:
    """One rank of a measuring job (run as `python -m trainwreck.benchmarks.fsdp --rank ...`)."""
    gloo_rank(rank, world, port, out, lambda w: _train(rank, w, replace(SPEC, parallelism=parallelism), steps))


def measure(parallelism: str, world: int, steps: int) -> dict[str, Any]:
    """One FSDP or DDP job (run_ranks); rank 0's figures."""
    return run_ranks("trainwreck.benchmarks.fsdp", world, ["--parallelism", parallelism, "--steps", str(steps)],
                     parallelism)


def bench_fsdp(steps: int = 6) -> dict[str, Any]:
    """Per-rank bytes per parameter (params + AdamW moments; gradients apart), median step
    milliseconds, at world sizes 2 and 4, and FSDP's loss gap to DDP on the same spec."""
    runs = {(p, w): measure(p, w, steps) for p in ("ddp", "fsdp") for w in (2, 4)}
    numel = runs["ddp", 2]["numel"]
    results: dict[str, Any] = {"fsdp_bench_params": numel}
    for (p, w), run in runs.items():
        results[f"{p}_bytes_per_param_w{w}"] = round((run["params"] + run["optimizer"]) / numel, 3)
        results[f"{p}_grad_bytes_per_param_w{w}"] = round(run["grads"] / numel, 3)
        results[f"{p}_step_ms_w{w}"] = round(run["step_s"] * 1000, 2)
    gaps = [abs(a - b) / max(1.0, abs(b)) for a, b in zip(runs["fsdp", 2]["losses"], runs["ddp", 2]["losses"])]
    results["fsdp_vs_ddp_loss_gap_w2"] = max(gaps)
    results["fsdp_vs_ddp_loss_within_tolerance"] = max(gaps) <= LOSS_RTOL
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.fsdp", description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, help="internal: run one rank of a measuring job")
    parser.add_argument("--world", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--parallelism", choices=("ddp", "fsdp"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rank is None and args.parallelism and args.world:  # one job: what `trainwreck handbook` runs
        print(json.dumps(measure(args.parallelism, args.world, args.steps), indent=1))
    elif args.rank is None:
        print(json.dumps(bench_fsdp(args.steps), indent=1))
    else:
        _rank(args.rank, args.world, args.port, args.parallelism, args.steps, args.out)


if __name__ == "__main__":
    main()
