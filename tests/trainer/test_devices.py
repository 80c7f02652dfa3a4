"""Which device and backend a rank takes: ranks share GPUs over gloo, nccl gets one GPU per rank.

The GPU count is monkeypatched (no CUDA here); what runs on a real GPU is tests/*/test_*_gpu.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from trainwreck.trainer.config import ConfigError, TrainConfig
from trainwreck.trainer.launch import check_nccl_devices, pick_device
from trainwreck.trainer.loop import resolve_backend


@dataclass
class FakeGpus:
    count: int = 0
    chosen: list[int] = field(default_factory=list)
    """Every set_device call."""


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> FakeGpus:
    """Pretend this host has `gpus.count` GPUs."""
    fake = FakeGpus()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: fake.count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: fake.count)
    monkeypatch.setattr(torch.cuda, "set_device", fake.chosen.append)
    return fake


@pytest.mark.parametrize("n_gpus, local_rank, index", [(1, 0, 0), (1, 3, 0), (2, 3, 1), (4, 2, 2)])
def test_cuda_ranks_share_the_visible_gpus_rank_r_on_device_r_mod_n(gpus: FakeGpus, n_gpus: int, local_rank: int,
                                                                    index: int) -> None:
    gpus.count = n_gpus
    assert pick_device("cuda", local_rank, local_world_size=4) == torch.device("cuda", index)
    assert gpus.chosen == [index]


def test_auto_stays_on_the_cpu_unless_every_rank_has_a_gpu(gpus: FakeGpus) -> None:
    gpus.count = 1
    assert pick_device("auto", 1, local_world_size=2) == torch.device("cpu")
    gpus.count = 2
    assert pick_device("auto", 1, local_world_size=2) == torch.device("cuda", 1)


def test_cuda_without_a_gpu_names_the_fix(gpus: FakeGpus) -> None:
    with pytest.raises(ConfigError, match="CUDA is not available; use device='cpu'"):
        pick_device("cuda", 0)


def test_backend_auto_picks_nccl_only_with_a_gpu_per_rank_and_gloo_when_ranks_share() -> None:
    cfg, cuda = TrainConfig.tiny(), torch.device("cuda", 0)
    assert resolve_backend(cfg, cuda, local_world_size=2, gpus=2) == "nccl"
    assert resolve_backend(cfg, cuda, local_world_size=2, gpus=1) == "gloo"
    assert resolve_backend(cfg, torch.device("cpu"), local_world_size=1, gpus=0) == "gloo"


def test_nccl_with_more_ranks_than_gpus_names_both_counts_and_the_gloo_alternative() -> None:
    check_nccl_devices(2, 2)
    with pytest.raises(ConfigError, match=r"4 rank\(s\) and 1 GPU\(s\); use backend='gloo' with device='cuda'"):
        check_nccl_devices(4, 1)
