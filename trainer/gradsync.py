"""The gradient all-reduce, in an order that does not depend on DDP's bucket layout.

Floating-point addition is not associative: with three or more ranks, the bits of a
reduced gradient depend on the order in which the ranks' values are added, and a ring
all-reduce adds each element in an order set by where the element sits in the flat
buffer it reduces. DDP reduces buckets, and its first iteration after construction uses
one bucket of every parameter; from the second on it uses buckets rebuilt in the order
gradients became ready. A resumed attempt builds a new DDP, so its first update reduced
the gradients in a different layout from the uninterrupted run's same update and the
digests parted (measured: 4 ranks, kill-resume, every lineage step after the restore).
With two ranks a + b = b + a, which is why only larger worlds showed it.

The fix reduces each parameter's gradient on its own: a parameter's elements are then
always at the same offsets of the tensor reduced, whatever bucket carried them, so every
update adds in the same order in every attempt. The cost is one collective per
parameter instead of one per bucket, which the reference trainer pays for exactness.
"""
from typing import Any, Callable

import torch
import torch.distributed as dist

CommHook = Callable[[Any, Any], "torch.futures.Future[torch.Tensor]"]
"""A DDP communication hook: (state, GradBucket) -> future of the reduced bucket buffer."""


# Annotations evaluated, not postponed: DDP checks a hook's annotations at registration.
def per_parameter_allreduce(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients across ranks, one all-reduce per parameter.

    `bucket.gradients()` are views into `bucket.buffer()`, so reducing them in place
    reduces the buffer DDP copies back into the parameters' `.grad`."""
    group = state if isinstance(state, dist.ProcessGroup) else None
    world = dist.get_world_size(group)
    works = [dist.all_reduce(grad, group=group, async_op=True) for grad in bucket.gradients()]
    for work in works:
        work.wait()
    buffer = bucket.buffer()
    buffer.div_(world)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
