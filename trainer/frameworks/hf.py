"""Hugging Face `Trainer` under trainwreck: a `TrainerCallback` plus a dataset and collator
wrapper, so each rank's sample ids per optimizer step are recorded without the user's
model ever seeing them. Nothing in transformers is patched.

    tw = TrainwreckHF.from_env()
    trainer = Trainer(model, args, train_dataset=tw.dataset(ds), data_collator=tw.collator(collate),
                      callbacks=[tw.callback()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))

How the ids travel: the dataset wrapper notes each index it hands out; the collator
wrapper, which the DataLoader calls right after fetching a batch's items, moves those
notes onto a queue as one batch (the items themselves stay untouched, so the Trainer's
column filtering and the user's model never see an extra field). That needs the items
fetched in this process: `dataloader_num_workers=0`, checked at train begin. The
Trainer collates an update's micro-batches in order (accelerate may fetch one batch ahead),
so at `on_step_end` the oldest `gradient_accumulation_steps` queued batches are exactly
that update's.

The loss: a callback is never handed it, but with `logging_strategy="steps"` and
`logging_steps=1` the Trainer logs, every update, the loss it gathered from every rank and
averaged (`nested_gather(tr_loss).mean()`): the global loss of that update, in the Trainer's
own terms. The `step` event of an update is then written at `on_log`, with that loss; with
any other logging setting it is written at `on_step_end` with `loss: null` (continuity then
compares digests only, which settles a same-world-size resume but not a world-size change).

Saves: at `on_step_end`, when the Trainer has decided to save (`control.should_save`, set by
its flow callback before ours runs), the probe's `saving` scope opens, so every file
operation of `_save_checkpoint` is a foreign-save fault point; `on_save`, which the Trainer
calls right after the write, closes it and reports the save once every rank's part is there.
Fault point `step_start` fires at `on_step_begin`.
"""
from __future__ import annotations

import math
from collections import deque
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import TrainerCallback

from trainwreck.trainer.probe import Probe, state_digest

class IndexedDataset(torch.utils.data.Dataset):
    """The user's map-style dataset, noting the index of every item it hands out."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        self.fetched.append(int(index))
        return self.dataset[index]


class TrainwreckHF:
    """The probe and the queue of collated batches' ids that the callback drains."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.pending: deque[list[int]] = deque()
        self.indexed: IndexedDataset | None = None

    @classmethod
    def from_env(cls, run_dir: str | Path | None = None) -> TrainwreckHF:
        return cls(Probe.from_env(run_dir))

    def checkpoint_dir(self, relative: str = "checkpoints") -> str:
        """Where `TrainingArguments.output_dir` should point, so the harness finds the checkpoints."""
        return str(Path(self.probe.run_dir or ".") / relative)

    def dataset(self, dataset: Any) -> IndexedDataset:
        self.indexed = IndexedDataset(dataset)
        return self.indexed

    def collator(self, collate: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        def collate_recording(features: list[Any]) -> Any:
            if self.indexed is None:
                raise ValueError("wrap the train dataset with TrainwreckHF.dataset(...) too")
            ids, self.indexed.fetched = self.indexed.fetched, []
            if len(ids) != len(features):
                raise RuntimeError(f"{len(features)} items reached the collator but {len(ids)} were fetched here; "
                                   "set dataloader_num_workers=0 (trainwreck records ids in this process)")
            self.pending.append(ids)
            return collate(features)
        return collate_recording

    def callback(self) -> TrainerCallback:
        return _Callback(self)


class _Callback(TrainerCallback):
    def __init__(self, tw: TrainwreckHF) -> None:
        self.tw, self.probe = tw, tw.probe
        self.digest = ""
        self.unlogged: int | None = None
        """An update whose `step` event waits for the Trainer's log of its loss."""
        self.save_scope: AbstractContextManager[Any] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kw: Any) -> None:
        probe = self.probe
        if self.tw.indexed is None or args.dataloader_num_workers != 0:
            raise ValueError("trainwreck's HF adapter needs train_dataset=tw.dataset(...), "
                             "data_collator=tw.collator(...) and dataloader_num_workers=0")
        probe.write_run_json(dataset_size=len(self.tw.indexed), drop_last=bool(args.dataloader_drop_last),
                             global_batch=args.per_device_train_batch_size * args.world_size
                             * args.gradient_accumulation_steps, total_steps=int(args.max_steps))
        probe.start()
        if state.global_step > 0:  # the Trainer already loaded model, optimizer and trainer state
            self.digest = state_digest(model, optimizer)
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            probe.restore(state.global_step, folder.name, self.digest, path=folder if folder.is_dir() else None)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.probe.point("step_start", state.global_step + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                    **kw: Any) -> None:
        step, pending = state.global_step, self.tw.pending
        micro = [pending.popleft() for _ in range(min(args.gradient_accumulation_steps, len(pending)))]
        epoch = max(0, math.ceil(state.epoch) - 1)
        self.probe.batch(step, epoch, [i for batch in micro for i in batch])
        self.digest = state_digest(model, optimizer)
        if logs_every_update(args) and control.should_log:
            self.unlogged = step  # the Trainer logs this update's global loss next: on_log writes `step`
        else:
            self.probe.step(step, None, self.digest)
        if control.should_save:  # _save_checkpoint runs next; on_save follows it
            self.save_scope = self.probe.saving(step, args.output_dir)
            self.save_scope.__enter__()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if self.unlogged is not None and logs and "loss" in logs:
            self.probe.step(self.unlogged, float(logs["loss"]), self.digest)
            self.unlogged = None

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.unlogged is not None:  # no log came (a setting the adapter did not foresee): no loss
            self.probe.step(self.unlogged, None, self.digest)
            self.unlogged = None
        if self.save_scope is not None:
            scope, self.save_scope = self.save_scope, None
            scope.__exit__(None, None, None)
        # Every rank wrote its part (its rng_state_{rank}.pth; rank 0 also model and optimizer)
        # before on_save; `save` is reported only once every rank's part is on disk.
        name = f"checkpoint-{state.global_step}"
        folder = Path(args.output_dir) / name
        mine = folder / (f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth")
        self.probe.save(state.global_step, name, self.digest, durable_on_every_rank=mine.is_file(), path=folder)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.unlogged is not None:
            self.probe.step(self.unlogged, None, self.digest)
            self.unlogged = None
        self.probe.phase(state.global_step, "done")
        self.probe.end(state.global_step)
        self.probe.flush()


def logs_every_update(args: Any) -> bool:
    """Whether the Trainer logs (and so gathers) the loss of every update."""
    return str(getattr(args.logging_strategy, "value", args.logging_strategy)) == "steps" and args.logging_steps == 1
