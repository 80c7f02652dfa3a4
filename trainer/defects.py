"""Planted defects: deliberately wrong trainer components, selected by TrainConfig.variant.

Each is a named alternative implementation (a subclass overriding one piece), never an
`if` in the reference path. The self-tests (harness/suites/defects.py, `trainwreck defects`)
require the invariant named for a defect to judge a run of it invalid while the
reference trainer passes the same scenario. Every one is a bug real trainers shipped.
"""
from __future__ import annotations

import json
import signal
import threading
from types import FrameType
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainwreck.trainer.async_ckpt import AsyncCheckpointer
from trainwreck.trainer.checkpoint import MANIFEST, POINTER, CheckpointStore, FileContent, Payload, Verified, \
    checkpoint_name, checkpoint_step, from_bytes, payload_object, to_bytes
from trainwreck.trainer.loop import Trainer
from trainwreck.trainer.parallel import build_state
from trainwreck.trainer.sampler import ElasticSampler
from trainwreck.trainer.state import TrainState
from trainwreck.trainer.storage import Produce, Storage

DEFECTS: dict[str, type[Trainer]] = {}
"""The planted defects by name; trainer/entry.py lists them beside the reference."""


def register_variant(name: str):  # type: ignore[no-untyped-def]
    """Class decorator: make a Trainer subclass selectable as TrainConfig.variant=name."""
    def decorate(cls: type[Trainer]) -> type[Trainer]:
        DEFECTS[name] = cls
        return cls
    return decorate


# ----- the data pipeline ---------------------------------------------------------------


class ForgetfulSampler(ElasticSampler):
    """Its state_dict is always the start of training: the position is never checkpointed."""

    def state_dict(self) -> dict[str, int]:
        return {"epoch": 0, "cursor": 0}


@register_variant("sampler_not_saved")
class SamplerNotSavedTrainer(Trainer):
    """The sampler position is not saved; a resume replays data from the start (caught by: coverage)."""

    sampler_class = ForgetfulSampler


class EpochBlindSampler(ElasticSampler):
    """Every epoch's order is epoch 0's: DistributedSampler without set_epoch(epoch)."""

    def order(self, epoch: int) -> torch.Tensor:
        return super().order(0)


@register_variant("shuffle_ignores_epoch")
class ShuffleIgnoresEpochTrainer(Trainer):
    """Each epoch repeats the first epoch's order (caught by: coverage, against the golden batches)."""

    sampler_class = EpochBlindSampler


class EpochRestartingSampler(ElasticSampler):
    """Restores the epoch but not the cursor: a mid-epoch resume starts the epoch over."""

    def load_state_dict(self, state: dict[str, int]) -> None:
        super().load_state_dict({"epoch": state["epoch"], "cursor": 0})


@register_variant("resume_restarts_epoch")
class ResumeRestartsEpochTrainer(Trainer):
    """A mid-epoch resume restarts the epoch, repeating its first samples (caught by: coverage)."""

    sampler_class = EpochRestartingSampler


@register_variant("ckpt_mid_window")
class CheckpointMidWindowTrainer(Trainer):
    """Counts micro-batches, not updates, toward its checkpoint interval, so a save lands one micro-batch
    into the next accumulation window: the sampler position it records has handed out that micro-batch,
    whose gradient lives only in .grad and is not saved. The resumed job never trains on those samples and
    every later batch is shifted (caught by: coverage, the batches against the golden run's)."""

    def checkpoint_files(self, rngs: list[Any]) -> dict[str, FileContent]:
        files = super().checkpoint_files(rngs)
        saved = payload_object(files["trainer.pt"])
        micro = self.cfg.step_batch(self.world_size) // self.cfg.grad_accum  # one micro-batch, all ranks
        cursor = min(int(saved["sampler"]["cursor"]) + micro, self.cfg.dataset_size)
        files["trainer.pt"] = Payload({**saved, "sampler": {**saved["sampler"], "cursor": cursor}})
        return files


@register_variant("pad_uneven_shards")
class PadUnevenShardsTrainer(Trainer):
    """Uneven shards of a partial batch are padded with repeated ids, as DistributedSampler
    does, so some samples are trained twice in the epoch (caught by: coverage)."""

    def shard(self, global_ids: torch.Tensor) -> torch.Tensor:
        per_rank = -(-len(global_ids) // self.world_size)  # ceil
        padded = torch.cat([global_ids, global_ids[:per_rank * self.world_size - len(global_ids)]])
        return padded[self.rank * per_rank:(self.rank + 1) * per_rank]


@register_variant("truncate_uneven_shards")
class TruncateUnevenShardsTrainer(Trainer):
    """Uneven shards of a partial batch are cut to the shortest one, as DistributedSampler with
    drop_last=True evens them, so the tail samples of every epoch are never trained: the silent
    twin of padding (caught by: coverage, ids not covered)."""

    def shard(self, global_ids: torch.Tensor) -> torch.Tensor:
        per_rank = len(global_ids) // self.world_size  # floor: the remainder is dropped
        return global_ids[self.rank * per_rank:(self.rank + 1) * per_rank]


class PerRankCursorSampler(ElasticSampler):
    """Checkpoints each rank's own progress (samples per rank) instead of the global cursor,
    and converts back with the *current* world size, like a resumable per-rank sampler."""

    world_size = 1

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.state.epoch, "cursor": self.state.cursor // self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        cursor = min(int(state["cursor"]) * self.world_size, self.dataset_size)
        super().load_state_dict({"epoch": state["epoch"], "cursor": cursor})


@register_variant("world_size_reslices")
class WorldSizeReslicesTrainer(Trainer):
    """A world-size change re-slices per-rank positions: after 4 -> 2 ranks half the epoch's
    consumed samples are replayed (caught by: coverage)."""

    sampler_class = PerRankCursorSampler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sampler.world_size = self.world_size  # type: ignore[attr-defined]


# ----- what the checkpoint holds -------------------------------------------------------


@register_variant("optimizer_not_saved")
class OptimizerNotSavedTrainer(Trainer):
    """The checkpoint holds the optimizer's hyperparameters but not its moments, so AdamW
    restarts cold after a resume (caught by: continuity, restore digest != save digest)."""

    def checkpoint_files(self, rngs: list[Any]) -> dict[str, FileContent]:
        files = super().checkpoint_files(rngs)
        optimizer = self.state.optimizer.state_dict()
        files["optimizer.pt"] = to_bytes({"state": {}, "param_groups": optimizer["param_groups"]})
        return files


@register_variant("scheduler_not_saved")
class SchedulerNotSavedTrainer(Trainer):
    """The checkpoint holds a fresh LR schedule, so a resume re-runs the warmup (caught by:
    continuity, against the golden digests; the digest itself does not cover the schedule)."""

    def checkpoint_files(self, rngs: list[Any]) -> dict[str, FileContent]:
        files = super().checkpoint_files(rngs)
        saved = payload_object(files["scheduler.pt"])
        saved = {**saved, "scheduler": {**saved["scheduler"], "last_epoch": 0, "_step_count": 1}}
        files["scheduler.pt"] = Payload(saved)
        return files


@register_variant("rng_not_restored")
class RngNotRestoredTrainer(Trainer):
    """The RNG state is saved but never restored, so dropout after a resume draws a
    different stream (caught by: continuity, against the golden digests)."""

    def load_rng(self, rngs: list[Any]) -> None:
        pass


# ----- mixed precision (amp_dtype="fp16": a GradScaler scales the loss) --------------------


@register_variant("scaler_not_saved")
class ScalerNotSavedTrainer(Trainer):
    """The checkpoint leaves the GradScaler out (a `scaler.state_dict()` nobody added), so a
    resume restarts the loss scale and its growth counter from their defaults (caught by:
    continuity, restore digest != save digest; the digest covers the scaler's state)."""

    def checkpoint_files(self, rngs: list[Any]) -> dict[str, FileContent]:
        files = super().checkpoint_files(rngs)
        saved = payload_object(files["scheduler.pt"])
        files["scheduler.pt"] = Payload({**saved, "scaler": None})
        return files


@register_variant("fp16_unscaled")
class Fp16UnscaledTrainer(Trainer):
    """fp16 autocast without a GradScaler: gradients below fp16's smallest subnormal (about
    6e-8) flush to zero and small ones lose bits (caught by: continuity, against the golden
    run that scales the loss; no invariant sees the underflow itself)."""

    def _fresh_state(self) -> TrainState:
        return build_state(self.cfg, self.device, False, self.amp)


# ----- the checkpoint store ------------------------------------------------------------


class InPlacePointerFirstStore(CheckpointStore):
    """The naive writer: advance `latest` (and announce the save) first, then torch.save
    each file straight into the final directory, with no temporary directory or fsync of
    the parent. A crash anywhere after the pointer leaves a 'committed' checkpoint that
    is missing or torn."""

    def save(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> str:
        name = checkpoint_name(step)
        self.storage.write(POINTER, json.dumps({"step": step, "checkpoint": name}).encode())
        self.events.emit("save", step=step, checkpoint=name, digest=meta.get("digest"))
        self.storage.mkdir(name)
        entries = {}
        for file_name, content in files.items():
            entries[file_name] = self._write_file(step, name, f"{name}/{file_name}", file_name, content)
        manifest = {"format": "trainwreck-ckpt/1", "step": step, "files": entries, **meta}
        self._write_file(step, name, f"{name}/{MANIFEST}", MANIFEST, json.dumps(manifest).encode())
        self.retain()
        return name


@register_variant("naive_writer")
class NaiveWriterTrainer(Trainer):
    """Checkpoints written in place, pointer first (caught by: atomicity)."""

    store_class = InPlacePointerFirstStore


class PointerBeforeRenameStore(CheckpointStore):
    """Writes the files into a temporary directory correctly, but commits (`latest` and the
    `save` event) before the directory is renamed into place and fsynced: a crash in
    between leaves a commit pointing at a checkpoint that does not exist."""

    def save(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> str:
        from trainwreck.trainer import hooks as fp

        name = checkpoint_name(step)
        tmp = self.stage(step, files, meta)  # staged like the reference...
        self._move_aside(name)
        # ...but committed before the directory it names is in place.
        self.hooks.point(fp.SAVE_BEFORE_POINTER, step, checkpoint=name)
        self._write_pointer(step, name)
        self.events.emit("save", step=step, checkpoint=name, digest=meta.get("digest"))
        self.hooks.point(fp.SAVE_AFTER_POINTER, step, checkpoint=name)
        self.hooks.point(fp.SAVE_BEFORE_RENAME, step, checkpoint=name)
        self.storage.rename(tmp, name)
        self.hooks.point(fp.SAVE_AFTER_RENAME, step, checkpoint=name)
        self.retain()
        return name


@register_variant("pointer_before_durable")
class PointerBeforeDurableTrainer(Trainer):
    """`latest` advances before the checkpoint is renamed into place (caught by: atomicity)."""

    store_class = PointerBeforeRenameStore


class HighestDirectoryStore(CheckpointStore):
    """Resumes from the highest-numbered step directory, ignoring the commit pointer and
    never checking the manifest's sizes and checksums."""

    def select(self, identity: str) -> Verified | None:
        names = self._step_dirs()
        if not names:
            return None
        name = names[0]
        manifest = json.loads(self.storage.read(f"{name}/{MANIFEST}"))
        files = {f: self.storage.read(f"{name}/{f}") for f in manifest["files"]}
        return Verified(name=name, manifest=manifest, files=files)


@register_variant("resume_highest_unverified")
class ResumeHighestUnverifiedTrainer(Trainer):
    """Resume takes the highest-numbered directory without verifying it was committed
    (caught by: atomicity, a restore of a checkpoint that was never saved)."""

    store_class = HighestDirectoryStore


@register_variant("rank_restores_different")
class RankRestoresDifferentTrainer(Trainer):
    """The last rank loads its weights from the previous committed checkpoint, as when each
    rank resolves the checkpoint on its own while `latest` moves (caught by: replicas)."""

    def load(self, verified: Verified) -> None:
        super().load(verified)
        if self.rank != self.world_size - 1 or self.world_size == 1:
            return
        older = [n for n in self.checkpoints.committed_names()
                 if (checkpoint_step(n) or 0) < (checkpoint_step(verified.name) or 0)]
        if older:
            files = self.checkpoints.verify(older[0]).files
            self.state.model.load_state_dict(from_bytes(files["model.pt"]))


# ----- the job's lifecycle -------------------------------------------------------------


class Preempted(Exception):
    """Raised inside the loop once every rank has agreed to stop."""


@register_variant("sigterm_exits_clean")
class SigtermExitsCleanTrainer(Trainer):
    """A 'graceful' preemption handler: on SIGTERM every rank agrees to stop at the next
    update and exits 0 without finishing, so the job reports success at a step short of
    total_steps (caught by: progress)."""

    _sigterm = False

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._sigterm = True

    def train(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            super().train()
        except Preempted:
            self.progress.publish(self.state.step, "done")

    def train_step(self, step: int) -> None:
        # The ranks agree before stopping, so all of them leave at the same update.
        flag = torch.tensor([1.0 if self._sigterm else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            raise Preempted
        super().train_step(step)


# ----- durability (the power-loss model, faults/powerloss.py) ---------------------------


class NeverSynced:
    """A Storage that makes nothing durable: writes skip their fsync, directory fsyncs do
    nothing. Everything else goes to the storage it wraps, unchanged."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        self.inner.write(path, data, durable=False)

    def write_stream(self, path: str, produce: Produce, durable: bool = True) -> int:
        return self.inner.write_stream(path, produce, durable=False)

    def fsync_dir(self, path: str) -> None:
        pass


class RenameNoFsyncStore(CheckpointStore):
    """The common "write a temporary, rename it over" with no fsync at all: the reference
    save's every step, minus every fsync of a file, of the temporary directory and of the
    parent after the renames. A process crash never shows it (the OS still writes
    everything out); a power cut can persist the rename of step-N while its files' data is
    lost, behind a pointer naming it."""

    def __init__(self, storage: Storage, *args: Any, **kwargs: Any) -> None:
        super().__init__(NeverSynced(storage), *args, **kwargs)


@register_variant("rename_no_fsync")
class RenameNoFsyncTrainer(Trainer):
    """Write a temporary, rename it over, never fsync (caught by: the power-loss sweep only;
    identical to the reference on a clean run and under process crashes)."""

    store_class = RenameNoFsyncStore


# ----- the sharded (FSDP) checkpoint ---------------------------------------------------


@register_variant("fsdp_optimizer_not_loaded")
class FsdpOptimizerNotLoadedTrainer(Trainer):
    """FSDP resume reads the model's shards but not the optimizer's, so AdamW's sharded
    moments restart cold (caught by: continuity, restore digest != save digest)."""

    def read_shards(self, verified: Verified) -> None:
        from trainwreck.trainer.sharded import load_shards

        load_shards(self.state, self.checkpoints.storage, self.checkpoint_root, verified.name, optimizer=False)


@register_variant("fsdp_only_rank0_shards")
class FsdpOnlyRank0ShardsTrainer(Trainer):
    """Only rank 0's shard file reaches the committed checkpoint (the others are dropped, as a
    writer that keeps only 'its' output does): every such checkpoint is rejected on resume and
    the job silently restarts from step 0 (caught by: atomicity)."""

    def shard_manifest_files(self, tmp: str) -> list[str]:
        storage = self.checkpoints.storage
        kept = []
        for name in storage.list(tmp):
            if name.endswith(".distcp") and not name.startswith("__0_"):
                storage.remove(f"{tmp}/{name}")
            else:
                kept.append(name)
        return kept


@register_variant("fsdp_commit_before_shards")
class FsdpCommitBeforeShardsTrainer(Trainer):
    """Rank 0 commits the step (manifest, rename, pointer) first and the ranks write their shards
    into the committed directory afterwards: a crash in between leaves a committed checkpoint
    without shards (caught by: atomicity)."""

    def save(self, step: int) -> None:
        from trainwreck.trainer.sharded import stage_small_files, staging_name, write_shards
        from trainwreck.trainer.state import capture_rng, checkpoint_meta

        digest = self.digest()
        rngs: list[Any] = [None] * self.world_size
        dist.all_gather_object(rngs, capture_rng(cuda=self.device.type == "cuda"))
        if self.rank == 0:
            tmp = staging_name(step)
            self.checkpoints.storage.remove(tmp)
            self.checkpoints.storage.mkdir(tmp)
            meta = {**checkpoint_meta(self.world_size, self.identity, digest, self.ctx.attempt),
                    "parallelism": "fsdp", "shards": self.world_size}
            stage_small_files(self, step, tmp, rngs, meta)
            self.checkpoints.commit(step, tmp, meta, 0.0)
        dist.barrier()
        write_shards(self.state, self.checkpoints.storage, self.checkpoint_root, checkpoint_name(step))
        dist.barrier()
def as_saved_layout(tensor: Any, rank: int, saved_world: int) -> None:
    """Overwrite this rank's local shard of a correctly loaded FSDP DTensor with what the
    rank of the same index held when the checkpoint was saved on `saved_world` ranks
    (FSDP2 shards dim 0 as torch.chunk does), copied as-is: the overlapping leading rows,
    the rest left as they are. That is what a loader that skips resharding ends up with
    (each rank reading "its" saved shard); on the saving world size it changes nothing.
    `full_tensor` is a collective: every rank calls this in the same order."""
    local = tensor.to_local()
    chunks = torch.chunk(tensor.full_tensor(), saved_world, dim=0)
    saved = chunks[rank] if rank < len(chunks) else local.new_empty((0, *local.shape[1:]))
    rows = min(len(saved), len(local))
    with torch.no_grad():
        local[:rows].copy_(saved[:rows])


def fsdp_moments(state: Any) -> list[Any]:
    """AdamW's sharded moments, in parameter order (the same on every rank)."""
    moments = []
    for param in state.model.parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            value = state.optimizer.state.get(param, {}).get(key)
            if value is not None and hasattr(value, "full_tensor"):
                moments.append(value)
    return moments


@register_variant("fsdp_optimizer_not_resharded")
class FsdpOptimizerNotReshardedTrainer(Trainer):
    """On a world-size change, each rank loads the optimizer shard its rank index saved, as-is
    (the model is resharded correctly): AdamW's moments land on the wrong rows and parameters
    (caught by: continuity, restore digest != save digest)."""

    def read_shards(self, verified: Verified) -> None:
        super().read_shards(verified)
        saved_world = int(verified.manifest["world_size"])
        for moment in fsdp_moments(self.state):
            as_saved_layout(moment, self.rank, saved_world)


@register_variant("fsdp_other_sharding_accepted")
class FsdpOtherShardingAcceptedTrainer(Trainer):
    """A checkpoint written with another sharding (another world size) is accepted as if it
    were this run's: no check of the manifest's world size against this run's, no resharding,
    every rank takes its rank index's saved shards of parameters and moments as they are
    (caught by: continuity, restore digest != save digest)."""

    def read_shards(self, verified: Verified) -> None:
        super().read_shards(verified)
        saved_world = int(verified.manifest["world_size"])
        for tensor in [*self.state.model.parameters(), *fsdp_moments(self.state)]:
            as_saved_layout(tensor, self.rank, saved_world)


# ----- asynchronous checkpoints (trainer/async_ckpt.py) ---------------------------------


class CommitFirstAsyncWriter(AsyncCheckpointer):
    """Commits (advances `latest`, writes the `save` event) as soon as it has the snapshot,
    then writes and renames the files in the background: the commit record runs ahead of
    data that is not yet durable, so a crash during the persist leaves a commit naming a
    checkpoint that does not exist."""

    def submit(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> None:
        self.wait()
        snapshot = self.take_snapshot(files)
        name = checkpoint_name(step)
        self.store._write_pointer(step, name)
        self.store.events.emit("save", step=step, checkpoint=name, digest=meta.get("digest"))
        self._start(step, lambda: self._persist_after_commit(step, snapshot, meta))

    def _persist_after_commit(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> None:
        store, name = self.store, checkpoint_name(step)
        tmp = store.stage(step, files, meta)
        store._move_aside(name)
        store.storage.rename(tmp, name)
        store.storage.fsync_dir(".")
        store.retain()


@register_variant("async_commit_before_durable")
class AsyncCommitBeforeDurableTrainer(Trainer):
    """An async writer that commits before its data is durable (caught by: atomicity, when
    a crash lands in the background persist)."""

    async_writer_class = CommitFirstAsyncWriter


class LiveStateAsyncWriter(AsyncCheckpointer):
    """No snapshot: the background thread serializes the live tensors while training keeps
    updating them in place. The persist starts once the next update has run, as it does
    whenever writing takes longer than an update (any real model), so the checkpoint of
    step S holds parameters of step S+1 beside the sampler and step counter of S."""

    def __init__(self, store: CheckpointStore) -> None:
        super().__init__(store)
        self.next_update_ran = threading.Event()
        self.updates_started = 0

    def _start(self, step: int, work: Callable[[], None]) -> None:
        self.next_update_ran.clear()  # submit has waited for the previous save: count from here
        self.updates_started = 0
        super()._start(step, work)

    def take_snapshot(self, files: dict[str, FileContent]) -> dict[str, FileContent]:
        return files  # the bug: references to the live state, not a copy

    def persist(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> None:
        self.next_update_ran.wait()
        super().persist(step, files, meta)

    def raise_if_failed(self) -> None:
        # Called at the start of every update: at the second one since the snapshot, the
        # update after the save has run in full (its optimizer step included).
        self.updates_started += 1
        if self.updates_started >= 2:
            self.next_update_ran.set()
        super().raise_if_failed()

    def wait(self) -> None:
        self.next_update_ran.set()  # no further update is coming before this wait returns
        super().wait()


@register_variant("async_no_snapshot")
class AsyncNoSnapshotTrainer(Trainer):
    """An async writer that lets training mutate tensors while they are written (caught by:
    continuity, the restored state's digest differs from the one its save recorded)."""

    async_writer_class = LiveStateAsyncWriter
