"""The scenario table on CUDA (skipped without CUDA devices).

On nccl, one rank per GPU: with one GPU every scenario runs at world size 1 (its faults
moved to rank 0). Over gloo, ranks share the GPUs (rank r on GPU r mod n), so one GPU runs
every scenario at its own world sizes, 2 and 4 ranks, world-size changes and FSDP's DCP
resharding included, with CUDA-resident state. The CUDA RNG and the AMP GradScaler state
must survive a checkpoint round trip.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Callable

import pytest

from trainwreck.harness.supervise.scenarios import SCENARIOS, Scenario, get_scenario
from tests.scenarios.checks import assert_every_fault_fired, assert_ranks_shared_one_gpu, assert_valid

NCCL = pytest.mark.trainwreck(backend="nccl")
SHARED_GPU = pytest.mark.trainwreck(backend="gloo", device="cuda")


SHARD = re.compile(r"__(\d+)_(\d+)\.distcp")
"""A DCP shard file, named by the rank that writes it: `__<rank>_<index>.distcp`."""


def on_one_gpu(scenario: Scenario) -> Scenario:
    """The scenario at world size 1: every fault aimed at rank 0, and every shard file it
    names renamed to rank 0's (at world size 1 no other rank writes one)."""
    plan = []
    for fault in scenario.plan:
        moved = dict(fault)
        if "rank" in moved:
            moved["rank"] = 0
        if "ranks" in moved:
            moved["ranks"] = [0]
        if isinstance(moved.get("file"), str):
            moved["file"] = SHARD.sub(r"__0_\2.distcp", moved["file"])
        plan.append(moved)
    return replace(scenario, plan=tuple(plan), world_sizes=(1,))


def needs(scenario: Scenario) -> int:
    return max(scenario.world_sizes)


@NCCL
@pytest.mark.parametrize("scenario", [pytest.param(s, marks=pytest.mark.gpu(devices=needs(s)), id=s.name)
                                      for s in SCENARIOS])
def test_on_nccl_the_reference_trainer_stays_valid_with_one_rank_per_gpu(run_scenario: Callable[..., Any],
                                                                         scenario: Scenario) -> None:
    judged = run_scenario(scenario)
    assert_every_fault_fired(judged)
    assert_valid(judged, scenario.threatens)


def test_moving_a_scenario_to_one_gpu_renames_the_shard_files_its_faults_name() -> None:
    moved = on_one_gpu(get_scenario("fsdp-corrupt-shard"))
    assert [f.get("file") for f in moved.plan if f["kind"] == "corrupt"] == ["__0_0.distcp"]
    assert all(f.get("rank", 0) == 0 for f in moved.plan) and moved.world_sizes == (1,)


@NCCL
@pytest.mark.gpu(devices=1)
@pytest.mark.parametrize("scenario", [on_one_gpu(s) for s in SCENARIOS], ids=[s.name for s in SCENARIOS])
def test_on_one_gpu_the_reference_trainer_stays_valid_at_world_size_one(run_scenario: Callable[..., Any],
                                                                        scenario: Scenario) -> None:
    judged = run_scenario(scenario)
    assert_every_fault_fired(judged)
    assert_valid(judged, tuple(n for n in scenario.threatens if n != "replicas"))


@NCCL
@pytest.mark.gpu(devices=1)
@pytest.mark.parametrize("amp_dtype", ["fp16", "bf16"])
def test_on_one_gpu_a_resume_under_amp_matches_the_uninterrupted_run(run_scenario: Callable[..., Any],
                                                                     amp_dtype: str) -> None:
    # fp16 carries a GradScaler whose scale and growth tracker live in scheduler.pt;
    # continuity compares every resumed digest with the golden run's.
    judged = run_scenario("crash-exception", world_sizes=(1,),
                          plan=({"id": "raise-r0", "kind": "kill", "rank": 0, "step": 7, "how": "exception"},),
                          config={"amp_dtype": amp_dtype})
    assert_every_fault_fired(judged)
    assert_valid(judged, ("continuity", "coverage"))
    assert judged.judgement.verdicts["continuity"].counts["restores_checked"] >= 1


@SHARED_GPU
@pytest.mark.gpu(devices=1)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_ranks_sharing_one_gpu_over_gloo_keep_the_reference_trainer_valid(run_scenario: Callable[..., Any],
                                                                          scenario: Scenario) -> None:
    judged = run_scenario(scenario)
    assert_every_fault_fired(judged)
    assert_valid(judged, scenario.threatens)
    assert_ranks_shared_one_gpu(judged)


@SHARED_GPU
@pytest.mark.gpu(devices=1)
def test_two_ranks_sharing_one_gpu_resume_fp16_with_the_grad_scaler_state(run_scenario: Callable[..., Any]) -> None:
    judged = run_scenario("kill-resume", config={"amp_dtype": "fp16"})
    assert_every_fault_fired(judged)
    assert_valid(judged, ("coverage", "continuity", "atomicity", "replicas"))
    assert judged.judgement.verdicts["continuity"].counts["restores_checked"] >= 1
    assert_ranks_shared_one_gpu(judged)


@pytest.mark.gpu(devices=1)
def test_the_cuda_rng_and_grad_scaler_survive_a_checkpoint_round_trip() -> None:
    # In a spawned child: CUDA autograd in this pytest worker would make every later
    # fork-based test in it fail ("Unable to handle autograd's threading ... fork").
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_cuda_rng_and_grad_scaler_round_trip)  # re-raises the child's AssertionError


def _cuda_rng_and_grad_scaler_round_trip() -> None:
    import torch

    from trainwreck.trainer.checkpoint import from_bytes, to_bytes
    from trainwreck.trainer.state import capture_rng, restore_rng

    torch.cuda.manual_seed_all(1234)
    saved = from_bytes(to_bytes(capture_rng()))
    expected = torch.rand(8, device="cuda")
    torch.rand(8, device="cuda")  # move the stream on
    restore_rng(saved)
    assert torch.equal(torch.rand(8, device="cuda"), expected)

    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, growth_interval=3)
    model = torch.nn.Linear(4, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):  # a few updates so the scale and growth tracker move
        optimizer.zero_grad()
        scaler.scale(model(torch.ones(2, 4, device="cuda")).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    restored = torch.amp.GradScaler("cuda")
    restored.load_state_dict(from_bytes(to_bytes(scaler.state_dict())))
    assert restored.state_dict() == scaler.state_dict()
    assert restored.get_scale() == scaler.get_scale() != 1024.0
