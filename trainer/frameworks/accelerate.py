"""accelerate adapter: a small loop helper around the user's own ``Accelerator``; accelerate unchanged.

    probe = Probe.from_env()
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=run_dir, automatic_checkpoint_naming=True, total_limit=2))
    loader = DataLoader(track_samples(dataset), ...)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loop = TrainwreckLoop(accelerator, probe)      # before save_state/load_state: it registers its counter
    first = loop.resume() if resuming else 0       # accelerator.load_state(), then a `restore` event
    for each update k > first: loop.batch(k, epoch, batch); ...; optimizer.step(); loop.step(k, loss, model, optimizer)
    every N updates: loop.save(k, model, optimizer)   # accelerator.save_state() inside fault points

What the helper adds to the checkpoint: a counter (update and epoch) registered with
``register_for_checkpointing``, so a resume knows where it is; accelerate's own state (model,
optimizer, sampler, every process's ``random_states_<i>.pkl``) is untouched.

``save`` runs ``accelerator.save_state`` inside the foreign-save fault points (faults/foreign.py,
through the probe's ``saving``), then each rank checks and fsyncs its own part (rank 0 the model
and optimizer files, every rank its RNG file) and the probe reports ``save`` only when every
rank's part is durable.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from trainwreck.trainer.frameworks import take_samples
from trainwreck.trainer.probe import Probe, state_digest

INSTALL = "pip install 'trainwreck[accelerate]'"
MODEL_FILES = ("model.safetensors", "pytorch_model.bin")


class Progress:
    """The update and epoch, saved with accelerate's state (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.step, self.epoch = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step, self.epoch = int(state["step"]), int(state["epoch"])


class TrainwreckLoop:
    """Reports start/restore/batch/step/save through the probe; fires its fault points."""

    def __init__(self, accelerator: Accelerator, probe: Probe) -> None:
        self.accelerator, self.probe = accelerator, probe
        self.progress = Progress()
        accelerator.register_for_checkpointing(self.progress)
        probe.start()

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               input_dir: str | Path | None = None) -> tuple[int, int]:
        """accelerator.load_state (the newest automatic checkpoint when input_dir is None), then the
        `restore` event; returns (step, epoch) to continue from."""
        self.accelerator.load_state(str(input_dir) if input_dir is not None else None)
        folder = Path(input_dir) if input_dir is not None else (
            Path(self.accelerator.project_dir) / "checkpoints" / _newest(self.accelerator))
        self.probe.restore(self.progress.step, folder.name, self.digest(model, optimizer), path=folder)
        return self.progress.step, self.progress.epoch

    def digest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
        return state_digest(self.accelerator.unwrap_model(model), optimizer)

    def batch(self, step: int, epoch: int, batch: Any) -> None:
        self.probe.point("step_start", step)
        self.probe.batch(step, epoch, take_samples(batch))

    def step(self, step: int, epoch: int, loss: torch.Tensor, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer) -> None:
        self.progress.step, self.progress.epoch = step, epoch
        mean = self.accelerator.reduce(loss.detach().float().clone(), reduction="mean")
        self.probe.step(step, float(mean), self.digest(model, optimizer))

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             output_dir: str | Path | None = None) -> Path:
        """accelerator.save_state inside fault points; `save` once every rank's part is durable."""
        root = Path(self.accelerator.project_dir) / "checkpoints" if output_dir is None else Path(output_dir).parent
        with self.probe.saving(step, root):
            where = Path(self.accelerator.save_state(str(output_dir) if output_dir is not None else None))
        mine = _durable_part(where, self.accelerator.process_index, self.accelerator.is_main_process)
        self.probe.save(step, where.name, self.digest(model, optimizer), durable_on_every_rank=mine, path=where)
        return where


def _newest(accelerator: Accelerator) -> str:
    """The folder load_state(None) picks: accelerate's own rule, the highest checkpoint_<n>."""
    folders = os.listdir(Path(accelerator.project_dir) / "checkpoints")
    return max(folders, key=lambda f: int(f.rsplit("_", 1)[-1]) if f.rsplit("_", 1)[-1].isdigit() else -1)


def _durable_part(folder: Path, index: int, main: bool) -> bool:
    """This rank's files of the checkpoint exist and are fsynced (folder too)."""
    files = [folder / f"random_states_{index}.pkl"]
    if main:
        model = next((folder / m for m in MODEL_FILES if (folder / m).is_file()), folder / MODEL_FILES[0])
        files += [model, folder / "optimizer.bin"]
    if not all(f.is_file() for f in files):
        return False
    for path in [*files, folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return True
