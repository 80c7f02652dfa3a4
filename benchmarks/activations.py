"""What activations cost and what activation checkpointing buys, measured on CPU.

The reference MLP (trainer/model.py), made deep enough for activations to matter, runs one
forward and backward three ways: plain, every hidden layer under torch.utils.checkpoint, and the
hidden stack cut into √depth checkpointed segments. For each it reports the bytes the process
holds between the end of forward and the start of backward (what autograd keeps for backward),
the most it held during backward, and the median seconds of a forward+backward.

Why glibc's malloc counters and not tracemalloc or RSS: CPU PyTorch has no allocator statistics
like torch.cuda.max_memory_allocated; tracemalloc sees only Python's own allocations, not the
tensors' storage (PyTorch's CPU allocator calls malloc directly); RSS never shrinks and counts the
interpreter and the allocator's slack. mallinfo2() counts the bytes malloc has handed out and not
yet taken back (uordblks for the heap, hblkhd for the mmap'd blocks large tensors get), so the
difference between two moments is the tensors alive between them. A saved-tensors hook counts the
plain run's saved bytes a second way, as a cross-check.

    python -m trainwreck.benchmarks.activations   # one JSON object on stdout
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import math
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.model import MLP

SPEC = {"input_dim": 32, "num_classes": 8, "width": 256, "depth": 16, "dropout": 0.0}
"""The reference MLP, 16 hidden layers of 256 (about 1 M parameters): at this batch one layer's
activation (2 MiB) is half the parameters' bytes, so activations dominate."""
BATCH, REPEATS = 2048, 3


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_LIBC.mallinfo2.restype = _MallInfo2


def in_use() -> int:
    """Bytes malloc has handed out and not taken back: heap (uordblks) plus mmap'd blocks (hblkhd)."""
    info = _LIBC.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def _layer(layer: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: F.relu(layer(x))


def _stack(layers: list[torch.nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            x = F.relu(layer(x))
        return x
    return run


def forward(model: MLP, x: torch.Tensor, mode: str) -> torch.Tensor:
    """The reference MLP's forward (dropout 0), with its hidden layers checkpointed per `mode`."""
    layers = list(model.hidden)
    if mode == "per_layer":
        for layer in layers:
            x = checkpoint(_layer(layer), x, use_reentrant=False)
    elif mode == "segments":
        size = math.isqrt(len(layers))
        for start in range(0, len(layers), size):
            x = checkpoint(_stack(layers[start:start + size]), x, use_reentrant=False)
    else:
        x = _stack(layers)(x)
    return model.head(x)


def measure(model: MLP, x: torch.Tensor, y: torch.Tensor, mode: str) -> dict[str, Any]:
    F.cross_entropy(forward(model, x, mode), y).backward()  # warm-up: first calls allocate once-only state
    model.zero_grad(set_to_none=True)
    before = in_use()
    loss = F.cross_entropy(forward(model, x, mode), y)
    held = in_use() - before
    peak = [held]
    hooks = [p.register_post_accumulate_grad_hook(lambda _p: peak.append(in_use() - before))
             for p in model.parameters()]
    loss.backward()
    for hook in hooks:
        hook.remove()
    seconds = []
    for _ in range(REPEATS):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        F.cross_entropy(forward(model, x, mode), y).backward()
        seconds.append(time.perf_counter() - started)
    return {"held_after_forward_bytes": held, "peak_in_backward_bytes": max(peak),
            "fwd_bwd_s": statistics.median(seconds)}


def saved_tensor_bytes(model: MLP, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd saves for backward in the plain forward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(forward(model, x, "none"), y)
    del loss
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.activations", description=__doc__)
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = TrainConfig.tiny(**SPEC)
    model = MLP(cfg)
    x, y = torch.randn(args.batch, cfg.input_dim), torch.randint(0, cfg.num_classes, (args.batch,))
    modes = {m: measure(model, x, y, m) for m in ("none", "per_layer", "segments")}
    result = {"method": "glibc mallinfo2 (uordblks + hblkhd)", "batch": args.batch, "depth": cfg.depth,
              "width": cfg.width, "segment_layers": math.isqrt(cfg.depth),
              "parameters": sum(p.numel() for p in model.parameters()),
              "layer_activation_bytes": args.batch * cfg.width * 4,
              "saved_tensor_bytes": saved_tensor_bytes(model, x, y), "threads": 1, **modes}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
