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
    # Inside a step: DDP holds every parameter whole; FSDP its shard plus the layer it computes
    # (at least the largest layer, never the whole model).
    if parallelism == "ddp":
        assert run["peak_gathered_bytes"] == numel * 4
    else:
        assert run["largest_layer_bytes"] <= run["peak_gathered_bytes"] < numel * 4

