"""The "12 bytes per parameter for Adam" arithmetic, checked against a real run of each parallelism."""
from __future__ import annotations

import pytest

from trainwreck.benchmarks.fsdp import measure


@pytest.mark.parametrize("parallelism, world, per_rank", [("ddp", 2, 12.0), ("fsdp", 2, 6.0), ("fsdp", 4, 3.0)])
def test_a_rank_holds_12_bytes_per_parameter_divided_by_the_shards(parallelism: str, world: int,
                                                                   per_rank: float) -> None:
    run = measure(parallelism, world, steps=2)
    numel = run["numel"]
    # fp32 parameters + AdamW's two fp32 moments: 4 + 4 + 4 bytes, all on a DDP rank, 1/world with FSDP.
    assert (run["params"] + run["optimizer"]) / numel == pytest.approx(per_rank, rel=1e-3)
    assert run["grads"] / numel == pytest.approx(per_rank / 3, rel=1e-3)


@pytest.mark.parametrize("parallelism, world", [("ddp", 2), ("fsdp", 2)])
def test_inside_a_step_fsdp_holds_one_gathered_layer_whole_and_ddp_every_parameter(parallelism: str,
                                                                                    world: int) -> None:
    run = measure(parallelism, world, steps=2)
    whole = run["numel"] * 4  # fp32
    if parallelism == "ddp":
        assert run["peak_gathered_bytes"] == whole
    else:  # the steady state is the shard; the peak adds the layer being computed, never the whole model
        assert run["peak_gathered_bytes"] >= run["largest_layer_bytes"]
        assert run["peak_gathered_bytes"] < whole
