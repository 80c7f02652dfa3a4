"""Whether this machine has the GPUs a job's ranks need, asked before any rank starts.

nccl gives every rank a GPU of its own (trainer/launch.py `pick_device` takes cuda:LOCAL_RANK),
so a world wider than the machine's GPUs can only fail, and it failed late: the golden run
exhausted its restarts and the command ended in a traceback. `check_gpus` says so in one
line instead (an InputError: exit 2). `cuda_device_count` is the one place the count is read,
so a test can replace it rather than fake CUDA.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainwreck.trainer.errors import InputError


def cuda_device_count() -> int:
    """The CUDA devices torch sees here (CUDA_VISIBLE_DEVICES applies); 0 without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpu_per_rank(config: Mapping[str, Any]) -> bool:
    """nccl, or ranks told to use CUDA: each rank then takes a GPU of its own."""
    return config.get("backend") == "nccl" or config.get("device") == "cuda"


def check_gpus(config: Mapping[str, Any], world_sizes: Sequence[int]) -> None:
    """InputError naming the GPU count and the alternatives when a rank would find no GPU."""
    if not needs_gpu_per_rank(config) or not world_sizes:
        return
    wanted, found = max(world_sizes), cuda_device_count()
    if wanted <= found:
        return
    what = "--backend nccl" if config.get("backend") == "nccl" else "device=cuda"
    have = f"this machine has {found} CUDA GPU(s)" if found else "this machine has no CUDA GPU"
    smaller = f"run --world-sizes {found} or less, or " if found else ""
    raise InputError(f"{what} gives every rank a GPU of its own (nccl cannot share one between ranks): world "
                     f"size {wanted} needs {wanted} GPUs and {have}; {smaller}use --backend gloo, which needs no "
                     "GPU per rank (today its ranks train on the CPU; ranks sharing a GPU through gloo with CUDA "
                     "tensors is planned)")
