"""The elastic sampler: exactly once per epoch, whatever the world sizes and resume points."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainwreck.trainer.data import SyntheticDataset
from trainwreck.trainer.sampler import ElasticSampler, rank_slice


@st.composite
def elastic_histories(draw: st.DrawFn) -> tuple[int, int, bool, list[tuple[int, int]]]:
    """A dataset, a global batch, drop_last, and segments of (steps, world size) between resumes."""
    dataset_size = draw(st.integers(1, 200))
    global_batch = draw(st.integers(1, dataset_size))
    drop_last = draw(st.booleans())
    segments = draw(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8)), min_size=1, max_size=6))
    return dataset_size, global_batch, drop_last, segments


@settings(max_examples=200, deadline=None)
@given(elastic_histories(), st.integers(0, 2**31))
def test_every_epoch_covers_each_sample_exactly_once_across_resumes_and_world_sizes(
        history: tuple[int, int, bool, list[tuple[int, int]]], seed: int) -> None:
    dataset_size, global_batch, drop_last, segments = history
    epochs: dict[int, list[int]] = {}
    state = None
    for steps, world_size in segments:
        sampler = ElasticSampler(dataset_size, global_batch, seed, drop_last)  # a fresh process
        if state is not None:
            sampler.load_state_dict(state)
        for _ in range(steps):
            epoch, ids = sampler.next_global_batch()
            shards = [rank_slice(ids, r, world_size) for r in range(world_size)]
            assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1, "uneven beyond one sample"
            epochs.setdefault(epoch, []).extend(i for s in shards for i in s.tolist())
        state = sampler.state_dict()
    last = max(epochs, default=-1)
    for epoch, ids in epochs.items():
        assert len(ids) == len(set(ids)), f"epoch {epoch} repeats a sample"
        assert all(0 <= i < dataset_size for i in ids)
        if epoch < last:  # a completed epoch
            missing = dataset_size - len(ids)
            assert missing == 0 if not drop_last else 0 <= missing < global_batch


def test_the_epoch_order_depends_on_the_epoch_and_the_seed_only() -> None:
    a, b = ElasticSampler(50, 10, 3, True), ElasticSampler(50, 10, 3, True)
    assert torch.equal(a.order(2), b.order(2))
    assert not torch.equal(a.order(1), a.order(2))
    assert not torch.equal(a.order(1), ElasticSampler(50, 10, 4, True).order(1))


def test_a_sample_has_the_same_content_whichever_batch_it_is_in() -> None:
    data = SyntheticDataset(seed=7, size=100, input_dim=8, num_classes=4)
    x1, y1 = data.batch(torch.tensor([5, 42, 9]))
    x2, y2 = data.batch(torch.tensor([42]))
    assert torch.equal(x1[1], x2[0]) and y1[1] == y2[0]
    assert len(set(data.batch(torch.arange(100))[1].tolist())) > 1, "labels must not be constant"
