"""The probe's ten-line surface: helpers that let a plain torchrun script write the run format
without restructuring its loop.

The probe's typed calls (`batch`, `step`, `commit`, ...) are the contract; a script that uses
them must count its updates, find its sample ids, reduce its loss over ranks and digest its
state by hand, which took 23 lines in a real script. These helpers do that bookkeeping:

- `TrackedLoader` wraps the script's own DataLoader and notes the sample ids of every batch
  it yields, read from the loader's index sampler (so worker processes and prefetching are
  fine: indices are drawn in the main process, in order);
- `Update` is one optimizer update (`with probe.update(...)`): it enters the update (progress,
  its fault points, the `batch` event) before the body's first collective and, after it,
  writes `step` with the global mean loss (gloo has no AVG: a SUM divided by the world size)
  and the state digest; ids known only inside the update (micro-batches drawn in the
  accumulation loop, `Update.samples`) make its `batch` be written at the end instead;
- `seed_everything` seeds python, numpy and torch in one call.
"""
from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch



def plain_ids(ids: Any) -> list[int]:
    """Sample ids as plain ints, whatever the script holds them in (a list, a tensor, an array):
    what an event's JSON can carry."""
    ids = ids.tolist() if hasattr(ids, "tolist") else ids
    return [int(i) for i in ids]

class ProbeError(ValueError):
    """The probe was misused or misconfigured; the message says the fix."""


class UpdateSink(Protocol):
    """What an Update needs of its probe (trainer/probe.py's Probe)."""

    world_size: int
    current: Update | None

    def enter(self, step: int) -> None: ...

    def advance(self, step: int, name: str) -> None: ...

    def take_samples(self, step: int, samples: Sequence[int] | None,
                     epoch: int | None) -> tuple[list[int] | None, int]: ...

    def batch(self, step: int, epoch: int, samples: Sequence[int]) -> None: ...

    def step(self, step: int, loss: float | None, digest: str, **extra: Any) -> None: ...


def seed_everything(seed: int) -> None:
    """python's `random`, numpy's global generator (when numpy is installed) and torch (CPU and
    every CUDA device): what an uninterrupted run needs to repeat itself exactly."""
    random.seed(seed)
    try:
        import numpy
    except ImportError:  # numpy is optional for a user's script
        pass
    else:
        numpy.random.seed(seed)
    torch.manual_seed(seed)


class _RecordingBatches:
    """Stands in for a DataLoader's batch sampler: yields its batches unchanged and queues each
    one's ids for the iteration that drew them (an abandoned iterator, e.g. a script's
    `next(iter(loader))` to print a batch size, has its own queue)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.queue: deque[list[int]] = deque()

    def __iter__(self) -> Iterator[Any]:
        return self._record(iter(self.inner), self.queue)  # the queue is bound now, not at first next()

    @staticmethod
    def _record(batches: Iterator[Any], queue: deque[list[int]]) -> Iterator[Any]:
        for batch in batches:
            queue.append([int(i) for i in batch])
            yield batch

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TrackedLoader:
    """The script's DataLoader, unchanged to its loop (`len`, `.sampler`, `.dataset` pass
    through), telling the probe the sample ids of each batch it yields."""

    def __init__(self, loader: Any, on_batch: Callable[[list[int], int | None], None]) -> None:
        if getattr(loader, "batch_sampler", None) is None:
            raise TypeError("probe.loader needs a torch DataLoader with batching (batch_size or batch_sampler); "
                            "pass samples= to probe.update for any other loader")
        self.inner, self.on_batch = loader, on_batch
        self.recorder = _RecordingBatches(loader.batch_sampler)
        # DataLoader forbids setting its batch sampler after construction; its iterators read it
        # afresh each time, so swapping in a recorder that yields the same batches is safe.
        object.__setattr__(loader, "batch_sampler", self.recorder)

    def __iter__(self) -> Iterator[Any]:
        self.recorder.queue = queue = deque()  # this iteration's ids (a new DataLoader iterator binds it)
        for batch in self.inner:
            self.on_batch(queue.popleft() if queue else [], self.epoch)
            yield batch

    @property
    def epoch(self) -> int | None:
        """The sampler's own epoch (DistributedSampler.set_epoch); None for a sampler without one
        (the probe then counts epochs by updates: a peek at one batch starts no epoch)."""
        value = getattr(getattr(self.inner, "sampler", None), "epoch", None)
        return value if isinstance(value, int) else None

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_fields(loader: Any, world_size: int, batches_per_update: int, epochs: int | None,
               total_steps: int | None) -> dict[str, Any]:
    """run.json's dataset fields, read off the script's own DataLoader."""
    per_rank = loader.batch_size if loader.batch_size is not None else getattr(loader.batch_sampler, "batch_size", None)
    if per_rank is None:
        raise TypeError("probe.loader cannot tell the batch size of this DataLoader; call "
                        "probe.write_run_json(dataset_size=, global_batch=, drop_last=, total_steps=) instead")
    if total_steps is None:
        assert epochs is not None
        total_steps = epochs * (len(loader) // batches_per_update)
    fields = {"dataset_size": len(loader.dataset), "global_batch": per_rank * world_size * batches_per_update,
              "drop_last": bool(loader.drop_last), "total_steps": total_steps}
    if getattr(loader.sampler, "replacement", False) is True:  # RandomSampler(replacement=True)
        fields["sampling"] = "with_replacement"
    return fields


def global_mean(value: Any, world_size: int) -> float:
    """The mean of `value` over every rank: one all-reduce SUM (gloo has no AVG) divided by the
    world size; alone, or with no process group, the value itself."""
    import torch.distributed as dist

    tensor = value.detach().float().reshape(-1)[:1].clone() if torch.is_tensor(value) else torch.tensor([float(value)])
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "nccl" and not tensor.is_cuda:
            tensor = tensor.cuda()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= world_size
    return float(tensor.item())


class Update:
    """One optimizer update of the script (`with probe.update(...)`); see Probe.update.

    Its `batch` is written when the update begins if its ids are known then (`samples=`, or
    batches the tracked loader yielded before it); otherwise when it ends, with every id the
    body reported (`samples(ids)`, once per micro-batch) or the tracked loader yielded inside
    it: a script that fetches its micro-batches inside the accumulation loop reports them all."""

    def __init__(self, probe: UpdateSink, step: int, epoch: int | None, samples: Any, digest: Callable[[], dict[str, str]],
                 enabled: bool) -> None:
        self.probe, self.step, self.epoch, self.given = probe, step, epoch, samples
        self.digest, self.enabled = digest, enabled
        self.loss: Any = None
        """The script's loss of this update on this rank (probe.loss sets it); reduced over ranks at the end."""
        self.reported = False
        """Whether `batch` was written on entry (the ids were known when the update began)."""
        self.added: list[int] | None = None
        """The ids the body reported with `samples`, in order; None: it reported none."""

    def __enter__(self) -> Update:
        self.probe.current = self
        if not self.enabled:
            return self
        probe = self.probe
        probe.enter(self.step)  # progress and fault points first: a signal at this step lands here
        samples, epoch = probe.take_samples(self.step, self.given, self.epoch)
        if samples is not None:
            probe.batch(self.step, epoch, samples)
            self.reported = True
        else:
            # Past step_start, into the body that fetches its micro-batches: the watchdog must see this
            # rank ahead of a peer hung at that point, or a hang blames both ranks alike.
            probe.advance(self.step, "data")
        return self

    def samples(self, ids: Sequence[int] | Any) -> None:
        """Add one micro-batch's sample ids (a list, tensor or array) to this update's batch."""
        if not self.enabled:
            return
        if self.reported:
            raise ProbeError(f"update {self.step}'s batch was written when it began (samples= or probe.loader "
                             "batches drawn before it); report every micro-batch with probe.samples(ids) inside "
                             "the update instead, and pass no samples= to probe.update")
        self.added = (self.added or []) + plain_ids(ids)

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.probe.current = None
        if not self.enabled or kind is not None:
            return  # disabled, or the update did not complete: no `step` (the exception goes on)
        if not self.reported:  # the ids the body reported, or the loader yielded, during the update
            samples, epoch = self.probe.take_samples(self.step, self.added, self.epoch)
            if samples is not None:
                self.probe.batch(self.step, epoch, samples)
        loss = None if self.loss is None else global_mean(self.loss, self.probe.world_size)
        self.probe.step(self.step, loss, **self.digest())  # `digest`, and `buffers` where the model has local ones
