"""The gradient hook's layout rule (trainer/gradsync.py), on buckets built by hand.

That the rule keeps a resumed 4-rank run digest for digest on the golden run is the scenario
test's (tests/scenarios/test_scenarios.py, four ranks): reducing DDP's own buffer layout fails it.
Here: which call reduces what, with a stand-in for torch.distributed that records each call."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from trainwreck.trainer import gradsync
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.gradsync import ONE_BUCKET_BYTES, ParameterOrder, canonical_allreduce
from trainwreck.trainer.model import MLP

WORLD = 4  # a power of two: the sum of WORLD equal gradients over WORLD is each one, bit for bit


class Bucket:
    """A GradBucket's surface: parameters, their gradients as views into one flat buffer."""

    def __init__(self, params: list[nn.Parameter], index: int = 0) -> None:
        self._params, self._index = params, index
        self._buffer = torch.cat([torch.randn(p.numel()) for p in params])
        self._views = list(self._buffer.split([p.numel() for p in params]))
        self.before = self._buffer.clone()

    def parameters(self) -> list[nn.Parameter]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        return [v.view(p.shape) for v, p in zip(self._views, self._params)]

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every tensor all-reduced, as it was handed over; each becomes WORLD times itself, as a sum
    over WORLD ranks that all hold the same gradient would."""
    seen: list[torch.Tensor] = []

    def all_reduce(tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
        seen.append(tensor.clone())
        tensor.mul_(WORLD)
        return SimpleNamespace(wait=lambda: None)

    fake = SimpleNamespace(all_reduce=all_reduce, get_world_size=lambda group=None: WORLD,
                           ProcessGroup=type("ProcessGroup", (), {}))
    monkeypatch.setattr(gradsync, "dist", fake)
    return seen


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def test_a_bucket_of_every_parameter_is_reduced_once_in_the_modules_parameter_order(
        calls: list[torch.Tensor]) -> None:
    net = model()
    params = list(net.parameters())
    bucket = Bucket(list(reversed(params)))  # DDP's buckets run backwards through the module
    future = canonical_allreduce(ParameterOrder(net), bucket)
    (reduced,) = calls
    in_bucket_order = bucket.before.split([p.numel() for p in bucket.parameters()])
    in_module_order = torch.cat(list(reversed(in_bucket_order)))
    assert torch.equal(reduced, in_module_order)
    assert torch.equal(future.wait(), bucket.before)  # summed over WORLD equal ranks, averaged


def test_the_same_bucket_in_another_order_hands_the_all_reduce_the_same_layout(calls: list[torch.Tensor]) -> None:
    net = model()
    params = list(net.parameters())
    first, rebuilt = Bucket(params), Bucket([params[i] for i in (2, 0, 3, 1)])
    rebuilt._buffer.copy_(torch.cat([first.gradients()[i].reshape(-1) for i in (2, 0, 3, 1)]))
    order = ParameterOrder(net)
    canonical_allreduce(order, first)
    canonical_allreduce(order, rebuilt)
    assert torch.equal(calls[0], calls[1])


@pytest.mark.parametrize("which", ["some parameters", "a stranger's parameter"])
def test_a_bucket_without_exactly_every_parameter_is_reduced_one_parameter_at_a_time(
        calls: list[torch.Tensor], which: str) -> None:
    net = model()
    params = list(net.parameters())
    held = params[:2] if which == "some parameters" else params[:-1] + [nn.Parameter(torch.zeros(2))]
    bucket = Bucket(held)
    future = canonical_allreduce(ParameterOrder(net), bucket)
    assert [c.numel() for c in calls] == [p.numel() for p in held]
    assert torch.equal(future.wait(), bucket.before)


def test_without_its_state_the_hook_reduces_one_parameter_at_a_time(calls: list[torch.Tensor]) -> None:
    params = list(model().parameters())
    canonical_allreduce(None, Bucket(params))
    assert len(calls) == len(params)


def test_a_model_too_large_for_one_bucket_is_reduced_one_parameter_at_a_time_even_in_one_bucket(
        calls: list[torch.Tensor]) -> None:
    # DDP's first update after construction puts every parameter in one bucket, its rebuilt ones
    # then split a model past the first-bucket cap: the first update must use the later layout.
    net = model()
    params = list(net.parameters())
    size = sum(p.numel() * p.element_size() for p in params)
    canonical_allreduce(ParameterOrder(net, one_bucket_bytes=size), Bucket(params))
    assert len(calls) == len(params)
    canonical_allreduce(ParameterOrder(net, one_bucket_bytes=size + 1), Bucket(params))
    assert len(calls) == len(params) + 1


@pytest.mark.parametrize("cfg", [TrainConfig(), TrainConfig.tiny()], ids=["default", "tiny"])
def test_the_reference_trainers_models_are_one_bucket_in_every_update(cfg: TrainConfig) -> None:
    net = MLP(cfg)
    assert sum(p.numel() * p.element_size() for p in net.parameters()) < ONE_BUCKET_BYTES
    assert ParameterOrder(net).flat
