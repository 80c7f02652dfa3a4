"""Planted defects: deliberately wrong trainer components, selected by TrainConfig.variant.

Each is a named alternative implementation (a subclass overriding one piece), never an
`if` in the reference path. The self-tests require the invariant named for a defect to
judge a run of it invalid while the reference trainer passes the same scenario.
"""
from __future__ import annotations

import json
from typing import Any

from trainer.checkpoint import MANIFEST, POINTER, CheckpointStore, checkpoint_name, sha256
from trainer.loop import Trainer, register_variant


class InPlacePointerFirstStore(CheckpointStore):
    """The naive writer: advance `latest` (and announce the save) first, then torch.save
    each file straight into the final directory, with no temporary directory or fsync of
    the parent. A crash anywhere after the pointer leaves a 'committed' checkpoint that
    is missing or torn."""

    def save(self, step: int, files: dict[str, bytes], meta: dict[str, Any]) -> str:
        name = checkpoint_name(step)
        self.storage.write(POINTER, json.dumps({"step": step, "checkpoint": name}).encode())
        self.events.emit("save", step=step, checkpoint=name, digest=meta.get("digest"))
        self.storage.mkdir(name)
        entries = {}
        for file_name, data in files.items():
            self._write_file(step, name, f"{name}/{file_name}", file_name, data)
            entries[file_name] = {"size": len(data), "sha256": sha256(data)}
        manifest = {"format": "trainwreck-ckpt/1", "step": step, "files": entries, **meta}
        self._write_file(step, name, f"{name}/{MANIFEST}", MANIFEST, json.dumps(manifest).encode())
        self.retain()
        return name


@register_variant("naive_writer")
class NaiveWriterTrainer(Trainer):
    """Checkpoints written in place, pointer first (caught by: atomicity)."""

    store_class = InPlacePointerFirstStore
