"""Whether this machine has the GPUs a job's ranks need, asked before any rank starts.

nccl gives every rank a GPU of its own, so a world wider than the machine's GPUs can only fail,
and it failed late: the golden run exhausted its restarts and the command ended in a traceback.
gloo with device=cuda shares the GPUs (trainer/launch.py `pick_device`: rank r on GPU r mod n)
and needs one. `check_gpus` says so in one
line instead (an InputError: exit 2). `cuda_device_count` is the one place the count is read,
so a test can replace it rather than fake CUDA.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainwreck.rundir.errors import InputError


def cuda_device_count() -> int:
    """The CUDA devices torch sees here (CUDA_VISIBLE_DEVICES applies); 0 without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(config: Mapping[str, Any], world_sizes: Sequence[int]) -> None:
    """InputError naming the GPU count and the alternatives when a rank would find no GPU: nccl needs
    one per rank; gloo with device=cuda shares the visible GPUs (rank r on GPU r mod n), so it needs one."""
    if not world_sizes:
        return
    wanted, found = max(world_sizes), cuda_device_count()
    have = f"this machine has {found} CUDA GPU(s)" if found else "this machine has no CUDA GPU"
    if config.get("backend") == "nccl" and wanted > found:
        smaller = f"run --world-sizes {found} or less, or " if found else ""
        share = ("--backend gloo --set device=cuda, whose ranks share the GPUs (rank r on GPU r mod "
                 f"{found}), or " if found else "")
        raise InputError(f"--backend nccl gives every rank a GPU of its own (nccl cannot share one between ranks): "
                         f"world size {wanted} needs {wanted} GPUs and {have}; {smaller}use {share}--backend gloo "
                         "on the CPU")
    if config.get("device") == "cuda" and not found:
        raise InputError(f"device=cuda puts the ranks on CUDA GPUs and {have}; use --set device=cpu (or leave the "
                         "device to the backend)")
