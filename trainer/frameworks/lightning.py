"""PyTorch Lightning adapter: a ``Callback`` and a ``CheckpointIO`` plugin; Lightning unchanged.

    probe = Probe.from_env()
    dataset = track_samples(dataset)                       # records each rank's sample ids
    trainer = L.Trainer(..., callbacks=[TrainwreckCallback(probe)],
                        plugins=[TrainwreckCheckpointIO(probe)])

What it reports (trainer/probe.py writes the events):

- ``start`` at fit start; ``restore`` at train start when Lightning resumed from
  ``ckpt_path`` (step, the file, the digest of what was loaded);
- ``batch`` at each batch start: the ids ``track_samples`` saw this rank fetch for it.
  Lightning fetches one batch ahead, so ids are kept first in, first out, and a batch
  takes as many as it has rows;
- ``step`` after each optimizer step, with the loss averaged over ranks and the digest;
- ``save`` only once the file is durable: the plugin (global rank 0, the only DDP writer)
  fsyncs the file and its directory after Lightning's own write and reports it at once with
  ``probe.commit`` (one writer: no collective, so a peer dying just after the write cannot
  leave a durable checkpoint unreported). A rank killed inside the save never reports it.

Faults: ``step_start`` and ``after_backward`` fault points; inside the plugin's write, the
file operations Lightning performs are foreign-save fault points (faults/foreign.py), through
the probe's ``saving(step, root)`` (armed under `trainwreck run --cmd`; see docs/FRAMEWORKS.md).
"""
from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.plugins.io import TorchCheckpointIO

from trainwreck.trainer.frameworks import take_samples, track_samples  # noqa: F401 - track_samples re-exported for the example trainer
from trainwreck.trainer.probe import Probe, state_digest

INSTALL = "pip install 'trainwreck[lightning]'"
def _digest(module: torch.nn.Module, trainer: Trainer) -> str:
    optimizers = trainer.optimizers
    return state_digest(module, optimizers[0] if optimizers else None)


class TrainwreckCheckpointIO(TorchCheckpointIO):
    """Lightning's own torch writer, run inside foreign-save fault points, then made durable
    and reported at once (DDP: global rank 0 writes the whole checkpoint alone)."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe
        self.digests: deque[str] = deque()
        """The digest of each checkpoint the callback saw built, oldest first (a top-k file
        and last.ckpt are two saves of one state)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        step = int(checkpoint.get("global_step", 0))
        target = Path(path)
        with self.probe.saving(step, target.parent):
            super().save_checkpoint(checkpoint, path, storage_options)
        _fsync(target)
        # One writer, so no collective: a peer dying now must not leave a durable checkpoint
        # unreported (the next attempt would restore it anyway).
        self.probe.commit(step, target.name, self.digests.popleft() if self.digests else "", path=target)

    def remove_checkpoint(self, path: str | Path) -> None:
        super().remove_checkpoint(path)
        self.probe.prune(Path(path).name)


def _fsync(path: Path) -> None:
    """File and directory to disk: the `save` event claims a checkpoint that survives a power cut."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TrainwreckCallback(Callback):
    """Reports start/restore/batch/step/save through the probe; fires its fault points."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def _io(self, trainer: Trainer) -> TrainwreckCheckpointIO | None:
        io = trainer.strategy.checkpoint_io
        return io if isinstance(io, TrainwreckCheckpointIO) else None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.probe.start()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.ckpt_path:
            self.probe.restore(trainer.global_step, Path(trainer.ckpt_path).name, _digest(pl_module, trainer),
                               path=trainer.ckpt_path if Path(trainer.ckpt_path).exists() else None)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        io = self._io(trainer)
        if io is not None and trainer.is_global_zero:
            io.digests.append(_digest(pl_module, trainer))

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step + 1
        self.probe.point("step_start", step)
        samples = take_samples(batch)
        self.probe.batch(step, trainer.current_epoch, samples)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.probe.point("after_backward", trainer.global_step + 1, model=pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.probe.step(trainer.global_step, _global_mean(loss), _digest(pl_module, trainer))


def _global_mean(loss: torch.Tensor) -> float:
    value = loss.detach().float().clone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(value)
        value /= torch.distributed.get_world_size()
    return float(value)


def adapters(probe: Probe) -> tuple[TrainwreckCallback, TrainwreckCheckpointIO]:
    """The callback and the plugin, for `Trainer(callbacks=[cb], plugins=[io])`."""
    return TrainwreckCallback(probe), TrainwreckCheckpointIO(probe)
