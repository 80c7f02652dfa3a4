"""Sharded checkpoints for the FSDP trainer, through torch.distributed.checkpoint (DCP).

A save: rank 0 creates the staging directory ``.tmp-step-N-sharded``; every rank writes
its own shards into it with DCP's FileSystemWriter, every file through the store's one
``Storage`` (trainer/storage.py storage_fs: each file fsynced by it; DCP's rank 0 writes
``.metadata.tmp`` and renames it to ``.metadata`` after gathering every rank's write results); a barrier proves every rank's
shards durable; then rank 0 alone writes the small replicated files (scheduler, trainer
position, RNG of every rank), a manifest with every file's size and checksum (shards and
``.metadata`` included), and commits with the store's one rename-and-pointer protocol
(CheckpointStore.commit). A load: the checkpoint is verified by that manifest first, then
DCP reads it into this run's sharding, whatever world size wrote it (DCP reshards by FQN
and global offset).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist

from trainwreck.trainer import checksum
from trainwreck.trainer import hooks as fp
from trainwreck.trainer.checkpoint import (CheckpointRejected, IncompatibleCheckpoint, Verified, checkpoint_name,
                                           from_bytes, to_bytes)
from trainwreck.trainer.checkpoint import CheckpointStore
from trainwreck.trainer.config import TrainConfig
from trainwreck.rundir.events import EventLog
from trainwreck.trainer.launch import RankContext
from trainwreck.trainer.probe import Probe
from trainwreck.trainer.sampler import ElasticSampler
from trainwreck.trainer.state import TrainState, capture_rng, checkpoint_meta
from trainwreck.trainer.storage import Storage, storage_fs

DCP_METADATA = ".metadata"
SHARD_SUFFIX = ".distcp"


class Trainer(Protocol):
    """What a sharded save reads from trainer/loop.py's Trainer (a Protocol: loop imports this module)."""

    ctx: RankContext
    rank: int
    world_size: int
    device: Any
    identity: str
    state: TrainState
    sampler: ElasticSampler
    probe: Probe
    checkpoints: CheckpointStore
    checkpoint_root: Path
    _last_save_seconds: float

    def digest(self) -> str: ...
    def shard_manifest_files(self, tmp: str) -> list[str]: ...


SMALL_FILES = ("scheduler.pt", "trainer.pt", "rng.pt")
"""Replicated state rank 0 writes beside the shards, exactly as the DDP checkpoint holds it."""


def staging_name(step: int) -> str:
    # One name every rank can compute (the DDP store uses its pid); `.tmp-` so retention clears it.
    return f".tmp-{checkpoint_name(step)}-sharded"


def parallelism_of(manifest: dict[str, Any]) -> str:
    """Checkpoints written before the field existed are DDP checkpoints."""
    return str(manifest.get("parallelism", "ddp"))


def check_parallelism(verified: Verified, cfg: TrainConfig, events: EventLog) -> None:
    """Refuse, by name and with a `reject` event, a checkpoint of the other parallelism: its
    files do not hold what this trainer loads, so using it (or silently skipping to an older
    one, or to a fresh start) would be wrong."""
    found = parallelism_of(verified.manifest)
    if found == cfg.parallelism:
        return
    reason = (f"{verified.name} was written with parallelism={found}, this run has "
              f"parallelism={cfg.parallelism}")
    events.emit("reject", checkpoint=verified.name, reason=reason)
    raise IncompatibleCheckpoint(f"{reason}: resume with --set parallelism={found}, or start in a new run directory")


def decode_sharded(verified: Verified) -> dict[str, Any]:
    """The small files decoded weights-only, and the shard set checked complete: DCP's
    ``.metadata`` plus one shard file per writing rank (the manifest's `shards`)."""
    names = set(verified.files)
    shards = sorted(n for n in names if n.endswith(SHARD_SUFFIX))
    expected = verified.manifest.get("shards")
    missing = [f for f in (*SMALL_FILES, DCP_METADATA) if f not in names]
    if missing or not isinstance(expected, int) or len(shards) != expected:
        raise CheckpointRejected(
            f"{verified.name}/manifest.json lists {len(shards)} shard file(s) for {expected!r} writing ranks"
            + (f" and lacks {', '.join(missing)}" if missing else ""))
    payloads = {}
    for file_name in SMALL_FILES:
        try:
            payloads[file_name] = from_bytes(verified.files[file_name])
        except Exception as exc:  # noqa: BLE001  whatever the unpickler raises, the file is unusable
            raise CheckpointRejected(f"{verified.name}/{file_name} is not a loadable weights-only payload "
                                     f"({type(exc).__name__})") from None
    return payloads


def save_sharded(trainer: Trainer, step: int) -> None:
    """Every rank writes its shards; rank 0 commits only after all are durable (see module doc)."""
    started = time.perf_counter()
    t = trainer
    t.probe.phase(step, "checkpoint_wait")
    digest = t.digest()  # a collective for FSDP: every rank computes it here
    rngs: list[Any] = [None] * t.world_size
    dist.all_gather_object(rngs, capture_rng(cuda=t.device.type == "cuda"))
    tmp = staging_name(step)
    if t.rank == 0:
        t.checkpoints.storage.remove(tmp)
        t.checkpoints.storage.mkdir(tmp)
    dist.barrier()  # the staging directory exists before any rank writes into it
    t.probe.phase(step, "checkpoint")
    write_shards(t.state, t.checkpoints.storage, t.checkpoint_root, tmp)
    dist.barrier()  # every rank's shards are durable before anything commits them
    if t.rank == 0:
        meta = {**checkpoint_meta(t.world_size, t.identity, digest, t.ctx.attempt),
                "parallelism": "fsdp", "shards": t.world_size}
        stage_small_files(t, step, tmp, rngs, meta)
        t.checkpoints.commit(step, tmp, meta, started)
        t.probe.phase(step, "checkpoint_wait")
    t.probe.point(fp.SAVE_WAIT, step)
    dist.barrier()  # nobody runs ahead of a save, as for DDP
    t._last_save_seconds = time.perf_counter() - started


def _dcp() -> tuple[Any, Any, Any, Any]:
    """DCP and its state-dict helpers, imported on first use (with FSDP's, 1.5 s of DTensor imports
    that a process which never writes shards need not pay: trainer/parallel.py fsdp2)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict

    return dcp, get_state_dict, set_model_state_dict, set_state_dict


def write_shards(state: TrainState, storage: Storage, root: Path, directory: str) -> None:
    """This rank's shards of the model and optimizer into `directory` (relative to the
    store's `root`), every file through the store's Storage (storage_fs): storage faults,
    crash points and the sweep's recorder see each shard and DCP's ``.metadata`` commit.
    Each file is durable (fsynced by the Storage) when its write returns."""
    dcp, get_state_dict, _, _ = _dcp()
    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    writer = dcp.FileSystemWriter(str(root / directory), sync_files=False)  # the Storage fsyncs, not DCP
    writer.fs = storage_fs(storage, root, sync_files=True)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer)


def stage_small_files(t: Trainer, step: int, tmp: str, rngs: list[Any], meta: dict[str, Any]) -> None:
    """Rank 0: the replicated files, then a manifest over every file in the staging dir."""
    storage, state = t.checkpoints.storage, t.state
    small = {
        "scheduler.pt": to_bytes({"scheduler": state.scheduler.state_dict(),
                                  "scaler": state.scaler.state_dict() if state.scaler is not None else None}),
        "trainer.pt": to_bytes({"step": state.step, "sampler": t.sampler.state_dict(),
                                "config_identity": t.identity}),
        "rng.pt": to_bytes(rngs),
    }
    for file_name, data in small.items():
        storage.write(f"{tmp}/{file_name}", data)
    entries = {}
    for file_name in t.shard_manifest_files(tmp):
        data = storage.read(f"{tmp}/{file_name}")
        entries[file_name] = checksum.entry_of(data)
    t.checkpoints.write_manifest(step, tmp, entries, meta)


def load_shards(state: TrainState, storage: Storage, root: Path, directory: str, optimizer: bool = True) -> None:
    """Read the (already verified) shards into this run's sharding, through the Storage:
    DCP maps every saved shard by FQN and global offset onto the local shards, so 4 ranks'
    files load on 2 or 3. `optimizer=False` leaves AdamW's moments fresh (only a planted
    defect asks for that)."""
    dcp, get_state_dict, set_model_state_dict, set_state_dict = _dcp()
    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    loaded = {"model": model_sd, **({"optim": optim_sd} if optimizer else {})}
    reader = dcp.FileSystemReader(str(root / directory))
    reader.fs = storage_fs(storage, root)
    dcp.load(loaded, storage_reader=reader)
    if optimizer:
        set_state_dict(state.model, state.optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    else:
        set_model_state_dict(state.model, loaded["model"])
