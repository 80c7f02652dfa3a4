"""FSDP with bf16 mixed precision on CUDA: on nccl, one rank per GPU; over gloo, two ranks sharing one GPU
(skipped without CUDA devices; never a CI dependency)."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.scenarios.checks import assert_every_fault_fired, assert_ranks_shared_one_gpu, assert_valid

NCCL = pytest.mark.trainwreck(backend="nccl")
SHARED_GPU = pytest.mark.trainwreck(backend="gloo", device="cuda")
FSDP_BF16 = {"parallelism": "fsdp", "amp_dtype": "bf16"}


@NCCL
@pytest.mark.gpu(devices=1)
def test_on_one_gpu_an_fsdp_bf16_resume_matches_the_uninterrupted_run(run_scenario: Callable[..., Any]) -> None:
    judged = run_scenario("crash-exception", world_sizes=(1,),
                          plan=({"id": "raise-r0", "kind": "kill", "rank": 0, "step": 7, "how": "exception"},),
                          config=FSDP_BF16)
    assert_every_fault_fired(judged)
    assert_valid(judged, ("continuity", "coverage"))
    assert judged.judgement.verdicts["continuity"].counts["restores_checked"] >= 1


@NCCL
@pytest.mark.gpu(devices=2)
def test_on_two_gpus_an_fsdp_bf16_kill_and_resume_stays_valid(run_scenario: Callable[..., Any]) -> None:
    judged = run_scenario("kill-resume", config=FSDP_BF16)
    assert_every_fault_fired(judged)
    assert_valid(judged, ("coverage", "continuity", "atomicity", "replicas"))


@SHARED_GPU
@pytest.mark.gpu(devices=1)
def test_two_ranks_sharing_one_gpu_keep_an_fsdp_bf16_kill_and_resume_valid(run_scenario: Callable[..., Any]) -> None:
    # The two-GPU test above on a one-GPU machine: the shards, the bf16 parameters and the DCP
    # checkpoint are CUDA tensors, the collectives gloo's.
    judged = run_scenario("kill-resume", config=FSDP_BF16)
    assert_every_fault_fired(judged)
    assert_valid(judged, ("coverage", "continuity", "atomicity", "replicas"))
    assert judged.judgement.verdicts["continuity"].counts["restores_checked"] >= 1
    assert_ranks_shared_one_gpu(judged)
