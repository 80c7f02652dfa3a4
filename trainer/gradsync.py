"""The gradient all-reduce, in a layout that does not depend on DDP's bucket layout.

Floating-point addition is not associative: with three or more ranks, the bits of a
reduced gradient depend on the order in which the ranks' values are added, and a ring
all-reduce adds each element in an order set by where the element sits in the flat
buffer it reduces. DDP reduces buckets, and its first iteration after construction uses
one bucket of every parameter; from the second on it uses buckets rebuilt in the order
gradients became ready. A resumed attempt builds a new DDP, so its first update reduced
the gradients in a different layout from the uninterrupted run's same update and the
digests parted (measured: 4 ranks, kill-resume, every lineage step after the restore).
With two ranks a + b = b + a, which is why only larger worlds showed it.

The fix gives every element one offset in every update of every attempt. A model whose
gradients fit in DDP's first bucket (1 MiB under DDP's default caps, which the trainer keeps;
the default configuration's model is 0.57 MB, the scenarios' tiny one 7 KB) has one bucket in
every update, the first and every rebuilt one: it is copied into one flat tensor in the
module's parameter order and reduced in one call, whatever order DDP put the gradients in.
A larger model's rebuilt buckets hold some parameters each, and which ones may change when
DDP rebuilds them, so its parameters are reduced one at a time, each at offset 0 of its own
call, in the first update as in every other. One call per parameter cost 2.4-2.9 times the
step of a 2-rank job of the tiny model (14-15 ms against 5.8-6.1 ms, gloo on 2 busy cores,
2026-11-28): per-call overhead, not bytes.
"""
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

CommHook = Callable[[Any, Any], "torch.futures.Future[torch.Tensor]"]
"""A DDP communication hook: (state, GradBucket) -> future of the reduced bucket buffer."""


ONE_BUCKET_BYTES = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20)
"""DDP's first-bucket cap at its default bucket sizes (torch 2.4 to 2.13): gradients below it are
one bucket however DDP orders them, so every update's bucket holds every parameter."""


class ParameterOrder:
    """The hook's state: each trainable parameter's place in `module.parameters()`, the one layout
    a flat reduction uses, and whether the model is small enough for one (module docstring). Held
    by identity: DDP's buckets hand back the module's own parameters."""

    def __init__(self, module: nn.Module, group: dist.ProcessGroup | None = None,
                 one_bucket_bytes: int = ONE_BUCKET_BYTES) -> None:
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.place = {id(p): i for i, p in enumerate(trainable)}
        self.flat = sum(p.numel() * p.element_size() for p in trainable) < one_bucket_bytes
        self.group = group

    def of(self, bucket: dist.GradBucket) -> list[int] | None:
        """The bucket's gradients' indices in parameter order; None (one call per parameter) for a
        model too large to be one bucket in every update, or a bucket without exactly its parameters."""
        places = [self.place.get(id(p), -1) for p in bucket.parameters()]
        if not self.flat or len(places) != len(self.place) or sorted(places) != list(range(len(places))):
            return None
        return sorted(range(len(places)), key=places.__getitem__)


# Annotations evaluated, not postponed (no __future__ import here): DDP checks a hook's annotations
# at registration.
def canonical_allreduce(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients across ranks, each element at the same offset of the
    tensor reduced in every update (module docstring)."""
    order = state.of(bucket) if isinstance(state, ParameterOrder) else None
    group = state.group if isinstance(state, ParameterOrder) else state
    if order is None:
        return per_parameter_allreduce(group, bucket)
    grads = bucket.gradients()
    flat = torch.cat([grads[i].reshape(-1) for i in order])
    dist.all_reduce(flat, group=group)
    for i, piece in zip(order, flat.split([grads[i].numel() for i in order])):
        grads[i].copy_(piece.view_as(grads[i]))  # views into the bucket's buffer
    return _averaged(bucket, group)


def per_parameter_allreduce(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients across ranks, one all-reduce per parameter.

    `bucket.gradients()` are views into `bucket.buffer()`, so reducing them in place
    reduces the buffer DDP copies back into the parameters' `.grad`."""
    group = state if isinstance(state, dist.ProcessGroup) else None
    works = [dist.all_reduce(grad, group=group, async_op=True) for grad in bucket.gradients()]
    for work in works:
        work.wait()
    return _averaged(bucket, group)


def _averaged(bucket: dist.GradBucket, group: dist.ProcessGroup | None) -> torch.futures.Future[torch.Tensor]:
    """The bucket's buffer, summed over ranks, divided by the world size: the future DDP awaits."""
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(group))
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
