"""FSDP on nccl with bf16 mixed precision (skipped without CUDA devices; never a CI dependency)."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.scenarios.checks import assert_every_fault_fired, assert_valid

NCCL = pytest.mark.trainwreck(backend="nccl")
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
