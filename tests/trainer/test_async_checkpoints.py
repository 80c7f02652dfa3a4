"""Asynchronous checkpoints in process: snapshot semantics, commit order, failures.

The whole-job cases (a kill, a storage error and a torn write during the background
persist, each resuming from the newest committed checkpoint with every invariant
holding) are in tests/trainer/test_async_scenarios.py."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.forkranks import Events
from tests.trainer.test_checkpoint_store import IDENTITY, make_store
from trainwreck.faults.storage import FaultyStorage, StepClock
from trainwreck.trainer.async_ckpt import AsyncCheckpointer, Snapshot, current_save_step
from trainwreck.trainer.checkpoint import CheckpointStore, Payload, from_bytes
from trainwreck.trainer.config import ConfigError, TrainConfig
from trainwreck.trainer.defects import CommitFirstAsyncWriter, LiveStateAsyncWriter
from trainwreck.trainer.storage import Heartbeat, LocalStorage

META = {"config_identity": IDENTITY, "digest": "d", "world_size": 1}


class GatedPointer(LocalStorage):
    """Blocks the commit (the rename onto `latest`) until the test opens the gate."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.reached = threading.Event()
        self.ops: list[str] = []

    def mkdir(self, path: str) -> None:
        self.ops.append(f"mkdir {path}")
        super().mkdir(path)

    def rename(self, src: str, dst: str) -> None:
        if dst == "latest":
            self.reached.set()
            assert self.gate.wait(30), "the test never opened the gate"
            self.ops.append("commit")
        super().rename(src, dst)


def _saved_model(store: CheckpointStore) -> dict[str, torch.Tensor]:
    chosen = store.select(IDENTITY)
    assert chosen is not None
    return from_bytes(chosen.files["model.pt"])


def test_the_async_writer_persists_the_snapshot_not_what_training_did_to_the_tensors_next(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    weights = torch.zeros(1000)
    writer = AsyncCheckpointer(store)
    writer.submit(4, {"model.pt": Payload({"w": weights})}, META)
    writer.before_update()  # as the trainer does before its optimizer step
    weights.add_(1.0)  # the next update, in place, while the persist may still run
    writer.wait()
    assert torch.equal(_saved_model(store)["w"], torch.zeros(1000))


class GatedSnapshot(AsyncCheckpointer):
    """Holds the background copy until the test opens the gate."""

    def __init__(self, store: CheckpointStore) -> None:
        super().__init__(store)
        self.gate, self.copying = threading.Event(), threading.Event()

    def take_snapshot(self, files: dict[str, Any]) -> dict[str, Any]:
        self.copying.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return super().take_snapshot(files)


def test_submit_returns_before_the_copy_and_the_optimizer_step_waits_for_it(tmp_path: Path) -> None:
    writer = GatedSnapshot(make_store(tmp_path))
    writer.submit(4, {"model.pt": Payload({"w": torch.zeros(1000)})}, META)  # returns: the copy is gated
    assert writer.copying.wait(30)
    update = threading.Thread(target=writer.before_update)
    update.start()
    update.join(0.2)
    assert update.is_alive(), "the optimizer step went ahead of the snapshot"
    writer.gate.set()
    update.join(30)
    assert not update.is_alive()
    writer.wait()
    assert torch.equal(_saved_model(writer.store)["w"], torch.zeros(1000))


def test_the_planted_no_snapshot_writer_persists_the_mutated_tensors(tmp_path: Path) -> None:
    # The check above, on the defect: it must see the update that came after the save.
    store = make_store(tmp_path)
    weights = torch.zeros(1000)
    writer = LiveStateAsyncWriter(store)
    writer.submit(4, {"model.pt": Payload({"w": weights})}, META)
    writer.raise_if_failed()  # the update after the save starts...
    weights.add_(1.0)         # ...and changes the weights in place
    writer.wait()
    assert torch.equal(_saved_model(store)["w"], torch.ones(1000))


def test_the_save_event_is_written_only_after_the_pointer_commits(tmp_path: Path) -> None:
    storage = GatedPointer(tmp_path / "checkpoints")
    store = make_store(tmp_path, storage=storage)
    writer = AsyncCheckpointer(store)
    writer.submit(4, {"model.pt": Payload({"w": torch.ones(3)})}, META)
    assert storage.reached.wait(30)
    store.events.flush()
    assert Events.read(tmp_path).of("save") == [] and store.read_pointer() is None
    storage.gate.set()
    writer.wait()
    assert [e["step"] for e in Events.read(tmp_path).of("save")] == [4] and store.read_pointer() == 4


def test_the_planted_commit_first_writer_announces_the_save_before_the_data_is_in_place(tmp_path: Path) -> None:
    storage = GatedPointer(tmp_path / "checkpoints")
    storage.gate.set()
    store = make_store(tmp_path, storage=storage)
    writer = CommitFirstAsyncWriter(store)
    writer.submit(4, {"model.pt": Payload({"w": torch.ones(3)})}, META)
    # Committed and announced on return, whatever the persist has done yet.
    assert store.read_pointer() == 4 and [e["step"] for e in Events.read(tmp_path).of("save")] == [4]
    writer.wait()


def test_the_next_save_starts_only_after_the_previous_one_committed(tmp_path: Path) -> None:
    storage = GatedPointer(tmp_path / "checkpoints")
    store = make_store(tmp_path, storage=storage)
    writer = AsyncCheckpointer(store)
    writer.submit(4, {"model.pt": Payload({"w": torch.ones(3)})}, META)
    assert storage.reached.wait(30)
    second = threading.Thread(target=writer.submit, args=(8, {"model.pt": Payload({"w": torch.ones(3)})}, META))
    second.start()
    second.join(0.2)
    assert second.is_alive(), "submit(8) returned while save 4 was still uncommitted"
    storage.gate.set()
    second.join(30)
    writer.wait()
    second_save = next(i for i, op in enumerate(storage.ops) if op.startswith("mkdir .tmp-step-00000008"))
    assert storage.ops.index("commit") < second_save
    assert store.read_pointer() == 8


def test_a_storage_error_in_the_background_persist_surfaces_and_never_moves_the_pointer(tmp_path: Path) -> None:
    fired: list[str] = []
    clock = StepClock()
    fault = {"id": "enospc-8", "kind": "storage_error", "step": 8, "errno": "ENOSPC", "nth": 1}
    faulty = FaultyStorage(LocalStorage(tmp_path / "checkpoints"), [fault], clock,
                           lambda f, detail, **_: fired.append(detail))
    store = make_store(tmp_path, storage=faulty)
    writer = AsyncCheckpointer(store)
    writer.submit(4, {"model.pt": Payload({"w": torch.ones(3)})}, META)
    clock.step = 9  # the training thread is past the save; the fault still finds save 8
    writer.submit(8, {"model.pt": Payload({"w": torch.ones(3)})}, META)
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    assert fired and "raised ENOSPC" in fired[0]
    assert store.read_pointer() == 4 and _saved_model(store)["w"].tolist() == [1.0, 1.0, 1.0]


def test_the_persist_thread_says_which_save_it_writes() -> None:
    seen: list[Any] = []

    class Probe(AsyncCheckpointer):
        def persist(self, step: int, files: Any, meta: Any) -> None:
            seen.append(current_save_step())

    writer = Probe(None)  # type: ignore[arg-type]
    writer.submit(12, {}, {})
    writer.wait()
    assert seen == [12] and current_save_step() is None


def test_a_snapshot_reuses_its_host_buffers_and_copies_the_new_values() -> None:
    snapshots = Snapshot()
    weights = torch.zeros(16)
    first = snapshots.take({"model.pt": Payload({"w": weights, "meta": [1, (2, "x")]})})
    weights.add_(5.0)
    second = snapshots.take({"model.pt": Payload({"w": weights, "meta": [1, (2, "x")]})})
    a, b = first["model.pt"].obj, second["model.pt"].obj  # type: ignore[union-attr]
    assert b["w"].data_ptr() == a["w"].data_ptr() != weights.data_ptr()
    assert torch.equal(b["w"], torch.full((16,), 5.0)) and b["meta"] == [1, (2, "x")]


def test_ckpt_mode_accepts_sync_and_async_and_the_error_names_the_field_and_the_fix() -> None:
    assert TrainConfig.tiny(ckpt_mode="async").ckpt_mode == "async"
    assert TrainConfig.tiny(ckpt_mode="async").identity() == TrainConfig.tiny().identity()
    with pytest.raises(ConfigError, match=r"ckpt_mode='later' is not one of sync, async; use 'sync'"):
        TrainConfig.tiny(ckpt_mode="later")


def test_the_writer_says_it_is_waited_for_only_while_the_training_thread_blocks_on_it(tmp_path: Path) -> None:
    # The trainer lets the persist's storage ops republish the rank's progress only then
    # (trainer/loop.py), so a hung training thread never looks alive because a persist moves.
    storage = GatedPointer(tmp_path / "checkpoints")
    seen: list[bool] = []
    writers: list[AsyncCheckpointer] = []
    store = make_store(tmp_path, storage=Heartbeat(storage, lambda: seen.append(writers[0].waiting)))
    writers.append(AsyncCheckpointer(store))
    writers[0].submit(4, {"model.pt": Payload({"w": torch.ones(3)})}, META)
    assert storage.reached.wait(30)
    before_wait = list(seen)

    def open_gate_once_waited_for() -> None:
        deadline = time.monotonic() + 30
        while not writers[0].waiting and time.monotonic() < deadline:
            time.sleep(0.001)  # polls the condition; the gate opens only once it holds
        storage.gate.set()

    opener = threading.Thread(target=open_gate_once_waited_for)
    opener.start()
    writers[0].wait()
    opener.join(30)
    assert before_wait and not any(before_wait), "beats while nobody waited"
    assert seen[len(before_wait):] and all(seen[len(before_wait):]), "no beats while the training thread waited"
    assert writers[0].waiting is False
