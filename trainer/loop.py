"""The reference train loop: DDP over a synthetic task, correct under restart.

Read `Trainer.train` top to bottom: restore, then per update publish progress, hit
the fault points, log the batch, forward/backward, reduce the loss, step the
optimizer, log the step, checkpoint. Everything a restart needs is in the checkpoint;
everything a judge needs is in the event log.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from trainwreck.trainer import hooks as fp
from trainwreck.trainer.async_ckpt import AsyncCheckpointer
from trainwreck.trainer.checkpoint import CheckpointRejected, CheckpointStore, FileContent, IncompatibleCheckpoint, \
    Verified, from_bytes
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.data import SyntheticDataset
from trainwreck.trainer.gradsync import ParameterOrder, canonical_allreduce
from trainwreck.trainer.hooks import Hooks
from trainwreck.trainer.launch import RankContext
from trainwreck.trainer.model import draw_noise_key
from trainwreck.trainer.parallel import build_state, full_state_digest, no_sync, wrap
from trainwreck.trainer.probe import Probe
from trainwreck.rundir.layout import RunDir
from trainwreck.trainer.sampler import ElasticSampler, rank_slice
from trainwreck.trainer.sharded import check_parallelism, decode_sharded, load_shards, save_sharded
from trainwreck.trainer.state import TrainState, capture_rng, checkpoint_meta, restore_rng, training_files
from trainwreck.trainer.storage import Heartbeat, LocalStorage


def resolve_backend(cfg: TrainConfig, device: torch.device, local_world_size: int = 1, gpus: int = 0) -> str:
    """cfg.backend, or for auto: nccl when every rank on this host has a GPU of its own, else gloo
    (CPU, or ranks sharing GPUs)."""
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if device.type == "cuda" and gpus >= local_world_size else "gloo"


def amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    name = cfg.amp_dtype if cfg.amp_dtype != "auto" else ("bf16" if device.type == "cuda" else "none")
    return {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


class PhaseTimer:
    """Seconds per phase of one update, accumulated between marks."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now


class Trainer:
    """The reference trainer; planted-defect variants (trainer/defects.py) subclass it, and
    trainer/entry.py picks one by name."""

    store_class: type[CheckpointStore] = CheckpointStore
    async_writer_class: type[AsyncCheckpointer] = AsyncCheckpointer
    sampler_class: type[ElasticSampler] = ElasticSampler

    def __init__(self, ctx: RankContext, cfg: TrainConfig, device: torch.device, probe: Probe,
                 hooks: Hooks) -> None:
        self.ctx, self.cfg, self.device = ctx, cfg, device
        # Every event and progress record goes through the probe, the run format's one writer;
        # the checkpoint store and planted defects write their events through its log.
        self.probe, self.hooks = probe, hooks
        if probe.events is None or probe.progress is None:
            raise ValueError("the reference trainer needs an enabled probe: build it with a run directory")
        self.events, self.progress = probe.events, probe.progress
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.identity = cfg.identity()
        self.dataset = SyntheticDataset(cfg.seed, cfg.dataset_size, cfg.input_dim, cfg.num_classes)
        self.sampler = self.sampler_class(cfg.dataset_size, cfg.step_batch(self.world_size), cfg.seed,
                                          cfg.drop_last)
        self.amp = amp_dtype(cfg, device)
        self.lr_ramp: dict[str, float] = {}
        """Filled by a restore onto another global batch when cfg.lr_rewarmup asks to re-warm the LR."""
        self.state = self._fresh_state()
        self.ddp = wrap(cfg, self.state, device)  # DDP, or the FSDP-sharded model (trainer/parallel.py)
        if isinstance(self.ddp, DistributedDataParallel):
            self.ddp.register_comm_hook(ParameterOrder(self.ddp.module),  # type: ignore[arg-type]
                                       hooks.wrap_comm_hook(canonical_allreduce))
        self.checkpoint_root = RunDir(ctx.run_dir).checkpoints
        raw_storage = hooks.wrap_storage(LocalStorage(self.checkpoint_root, within=ctx.run_dir))
        storage = Heartbeat(raw_storage, lambda: probe.phase(self.state.step, "checkpoint"))
        self.checkpoints = self.store_class(storage, self.events, hooks, cfg.keep_last)
        # The background writer's progress is the rank's only while the training thread
        # waits for it: a training thread that hangs must not look alive because a persist moves.
        persist_storage = Heartbeat(raw_storage, self._beat_while_waiting_for_persist)
        self.async_writer = (self.async_writer_class(self.store_class(persist_storage, self.events, hooks, cfg.keep_last))
                             if cfg.ckpt_mode == "async" else None)
        self._last_save_seconds = 0.0
        self._digest, self._digest_step = "", -1

    def _beat_while_waiting_for_persist(self) -> None:
        if self.async_writer is not None and self.async_writer.waiting:
            self.probe.phase(self.state.step, "checkpoint")

    def _fresh_state(self) -> TrainState:
        return build_state(self.cfg, self.device, self.amp == torch.float16, self.amp, self.world_size,
                           self.lr_ramp)

    # ----- the loop ---------------------------------------------------------------------

    def train(self) -> None:
        self.restore()
        for step in range(self.state.step + 1, self.cfg.total_steps + 1):
            if self.async_writer is not None:
                self.async_writer.raise_if_failed()
            self.train_step(step)
            if self.cfg.saves_after(step):
                self.save(step)
        if self.async_writer is not None:
            self.probe.phase(self.state.step, "checkpoint")
            self.async_writer.wait()  # done means the last checkpoint is committed
        self.probe.phase(self.state.step, "done")
        if self.ctx.standalone and self.rank == 0:
            self.probe.emit("end", status="completed", final_step=self.state.step)

    def train_step(self, step: int) -> None:
        timer = PhaseTimer()
        self.probe.phase(step, "start")
        self.probe.point(fp.STEP_START, step)

        self.probe.phase(step, "data")
        epoch, global_ids = self.sampler.next_global_batch()
        ids = self.shard(global_ids)
        x, y = (t.to(self.device) for t in self.dataset.batch(ids))
        if self.cfg.instrument:
            self.probe.batch(step, epoch, ids.tolist())
        timer.mark("data")
        self.probe.point(fp.AFTER_DATA, step)

        loss_sum = self.forward_backward(step, x, y, ids.to(self.device), len(global_ids), timer)
        self.probe.point(fp.AFTER_BACKWARD, step, model=self.ddp)

        loss = None
        if self.cfg.instrument:
            self.probe.phase(step, "sync")
            loss = self.global_mean(loss_sum, len(global_ids))
            timer.mark("sync")

        self.probe.phase(step, "optimizer")
        self.optimizer_step()
        self.state.step = step
        timer.mark("optimizer")
        self.probe.point(fp.AFTER_OPTIMIZER, step)

        if self.cfg.instrument:
            timer.seconds["checkpoint"] = self._last_save_seconds
            self.probe.step(step, loss, self.digest(), lr=self.state.scheduler.get_last_lr()[0],
                            phases={k: round(v, 6) for k, v in timer.seconds.items()})
        self._last_save_seconds = 0.0
        self.probe.flush()

    def shard(self, global_ids: torch.Tensor) -> torch.Tensor:
        """This rank's sample ids of a global batch (a seam: planted defects override it)."""
        return rank_slice(global_ids, self.rank, self.world_size)

    def forward_backward(self, step: int, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor,
                         n_global: int, timer: PhaseTimer) -> torch.Tensor:
        """Sum of per-sample losses on this rank; gradients end up as the global-batch mean."""
        self.probe.phase(step, "forward")
        noise_key = draw_noise_key()
        # DDP averages over ranks; scaling the local sum by world/n_global makes the
        # result the mean over the whole global batch, however it is partitioned.
        scale = self.world_size / n_global
        micro = list(zip(*(torch.tensor_split(t, self.cfg.grad_accum) for t in (x, y, ids))))
        total = torch.zeros((), device=self.device)
        for index, (mx, my, mids) in enumerate(micro):
            last = index == len(micro) - 1
            with (nullcontext() if last else no_sync(self.ddp)):
                with torch.autocast(self.device.type, dtype=self.amp or torch.float32,
                                    enabled=self.amp is not None):
                    logits = self.ddp(mx, mids, noise_key)
                loss = F.cross_entropy(logits.float(), my, reduction="sum")
                timer.mark("forward")
                if last:
                    self.probe.point(fp.AFTER_FORWARD, step)
                    self.probe.phase(step, "backward")
                scaled = loss * scale
                (self.state.scaler.scale(scaled) if self.state.scaler else scaled).backward()
                timer.mark("backward")
            total = total + loss.detach()
        return total

    def global_mean(self, loss_sum: torch.Tensor, n_global: int) -> float:
        reduced = loss_sum.clone()
        dist.all_reduce(reduced)
        return reduced.item() / n_global

    def optimizer_step(self) -> None:
        state = self.state
        if self.async_writer is not None:
            self.async_writer.before_update()  # the snapshot of the last save overlapped forward/backward
        if state.scaler is not None:
            state.scaler.step(state.optimizer)
            state.scaler.update()
        else:
            state.optimizer.step()
        state.scheduler.step()
        state.optimizer.zero_grad(set_to_none=True)

    # ----- checkpoints ------------------------------------------------------------------

    def save(self, step: int) -> None:
        if self.cfg.parallelism == "fsdp":
            save_sharded(self, step)  # every rank writes its shards (trainer/sharded.py)
            return
        started = time.perf_counter()
        self.probe.phase(step, "checkpoint_wait")
        rngs: list[Any] = [None] * self.world_size
        dist.all_gather_object(rngs, capture_rng(cuda=self.device.type == "cuda"))
        if self.rank == 0:
            self.probe.phase(step, "checkpoint")  # only the writer; storage ops republish it
            files = self.checkpoint_files(rngs)
            meta = checkpoint_meta(self.world_size, self.identity, self.digest(), self.ctx.attempt)
            if self.async_writer is not None:
                self.async_writer.submit(step, files, meta)  # the step pays for the snapshot only
            else:
                self.checkpoints.save(step, files, meta)
            self.probe.phase(step, "checkpoint_wait")
        self.probe.point(fp.SAVE_WAIT, step)
        # Nobody runs ahead of a save: a crash inside it must find every rank in this phase.
        dist.barrier()
        self._last_save_seconds = time.perf_counter() - started

    def digest(self) -> str:
        """The state digest, hashed once per update: the step event and a save share it."""
        if self._digest_step != self.state.step:
            self._digest, self._digest_step = full_state_digest(self.cfg, self.state), self.state.step
        return self._digest

    def checkpoint_files(self, rngs: list[Any]) -> dict[str, FileContent]:
        """The files of a checkpoint of the current state (a seam: planted defects override it)."""
        return training_files(self.state, self.sampler.state_dict(), rngs, self.identity)

    def shard_manifest_files(self, tmp: str) -> list[str]:
        """The staged files a sharded checkpoint's manifest covers: all of them (a seam for defects)."""
        return self.checkpoints.storage.list(tmp)

    def decode(self, verified: Verified) -> dict[str, Any]:
        """Refuse the other parallelism's checkpoint by name, then decode this one's files."""
        check_parallelism(verified, self.cfg, self.events)
        return decode_sharded(verified) if self.cfg.parallelism == "fsdp" else decode_payloads(verified)

    def restore(self) -> None:
        # Verification decodes every payload, so rank 0 finds an undecodable one before it decides.
        self.checkpoints.decode = self.decode
        verified, error = None, None
        if self.rank == 0:
            try:
                verified = self.checkpoints.select(self.identity)
                self.checkpoints.remove_stale()
            except IncompatibleCheckpoint as exc:
                error = str(exc)
        # Rank 0 alone decides, so every rank restores the same checkpoint.
        decision: list[Any] = [verified.name if verified else None, error]
        dist.broadcast_object_list(decision, src=0)
        name, error = decision
        if error:
            raise IncompatibleCheckpoint(error)
        if name is None:
            return  # nothing intact: a fresh start from step 0
        if verified is None:
            # Rank 0 already verified and decoded these bytes; a failure here means the
            # files changed under a running job, and a rank must not silently diverge.
            verified = self.checkpoints.verify(name)
        self.load(verified)
        if self.rank == 0:
            self.checkpoints.announce_if_unannounced(verified)
        self.probe.restore(self.state.step, name, self.digest(), path=None)  # names are unique: no bytes to hash

    def load(self, verified: Verified) -> None:
        payloads = verified.payloads or self.decode(verified)
        state = self.state
        self._digest_step = -1  # the state changes under whatever step number it had
        if self.cfg.parallelism == "fsdp":
            self.read_shards(verified)
        else:
            state.model.load_state_dict(payloads["model.pt"])
            state.optimizer.load_state_dict(payloads["optimizer.pt"])
        sched = payloads["scheduler.pt"]
        state.scheduler.load_state_dict(sched["scheduler"])
        if state.scaler is not None and sched["scaler"] is not None:
            state.scaler.load_state_dict(sched["scaler"])
        trainer_state = payloads["trainer.pt"]
        state.step = int(trainer_state["step"])
        self.sampler.load_state_dict(trainer_state["sampler"])
        self.load_rng(payloads["rng.pt"])
        saved_world = int(verified.manifest.get("world_size") or self.world_size)
        if self.cfg.lr_rewarmup and self.cfg.step_batch(saved_world) != self.cfg.step_batch(self.world_size):
            self.lr_ramp.update(start=state.step, **{"from": self.cfg.lr_scale(saved_world)})

    def read_shards(self, verified: Verified) -> None:
        """Model and optimizer shards of a verified sharded checkpoint (a seam: planted defects override it)."""
        load_shards(self.state, self.checkpoints.storage, self.checkpoint_root, verified.name)

    def load_rng(self, rngs: list[Any]) -> None:
        # RNG draws are replicated across ranks by design, so a rank that did not exist
        # when the checkpoint was written takes rank 0's stream.
        restore_rng(rngs[self.rank] if self.rank < len(rngs) else rngs[0])



REQUIRED_FILES = ("model.pt", "optimizer.pt", "scheduler.pt", "trainer.pt", "rng.pt")
"""Every file `Trainer.load` reads; a manifest that lacks one is not a checkpoint of this trainer."""


def decode_payloads(verified: Verified) -> dict[str, Any]:
    """Decode every required file weights-only, so that a checksum-valid file which is
    not a loadable payload (a crafted pickle, a truncated zip) rejects the checkpoint
    while rank 0 is still choosing, not after every rank has committed to it."""
    missing = [f for f in REQUIRED_FILES if f not in verified.files]
    if missing:
        raise CheckpointRejected(f"{verified.name}/manifest.json lacks {', '.join(missing)}")
    payloads = {}
    for file_name in REQUIRED_FILES:
        try:
            payloads[file_name] = from_bytes(verified.files[file_name])
        except Exception as exc:  # noqa: BLE001  whatever the unpickler raises, the file is unusable
            raise CheckpointRejected(
                f"{verified.name}/{file_name} is not a loadable weights-only payload "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    return payloads
