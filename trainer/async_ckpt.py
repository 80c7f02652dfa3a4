"""Asynchronous checkpoints (``ckpt_mode="async"``): the step pays only for a snapshot.

    writer = AsyncCheckpointer(store)       # a CheckpointStore: the same commit protocol
    writer.submit(step, files, meta)        # waits for the previous commit, returns at once
    writer.raise_if_failed()                # each update: a failed persist stops the rank
    writer.before_update()                  # before the optimizer changes the state
    writer.wait()                           # end of training: the last save is committed

A background thread copies every tensor of the checkpoint into host memory the writer
owns (reused from one save to the next, so a steady-state snapshot is a memcpy, not an
allocation) while the next update's forward and backward run: they read the parameters
and write only gradients, so the state is still the saved step's until the optimizer
step, which waits in `before_update` for the copy (the step pays only for what the copy
takes beyond forward and backward). The thread then streams that snapshot through the
store's ordinary save:
temporary directory, fsyncs, rename, pointer. The `save` event is written by the store
after the pointer, so it still means "committed". A crash, kill or storage fault during
the persist leaves the pointer where it was; the next attempt restores the previous
committed checkpoint, as after any interrupted save.

Storage faults are aimed at "the save at step S" (faults/storage.py); while a background
thread persists save S the training thread is already in later updates, so the thread
says which save it persists (`current_save_step`).
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import torch

from trainwreck.trainer.checkpoint import CheckpointStore, FileContent, Payload

SAVE_STEP_ATTR = "trainwreck_save_step"
"""Set on a background persist thread: the step of the save it writes."""


def current_save_step() -> int | None:
    """The step of the save this thread persists in the background, or None on any other thread."""
    return getattr(threading.current_thread(), SAVE_STEP_ATTR, None)


class Snapshot:
    """Host-memory copies of a checkpoint's objects, reusing the previous save's tensors
    where shape and dtype match (the state's structure does not change between saves)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, files: dict[str, FileContent]) -> dict[str, FileContent]:
        return {name: Payload(self._copy(content.obj, name)) if isinstance(content, Payload) else content
                for name, content in files.items()}

    def _copy(self, obj: Any, where: str) -> Any:
        if torch.is_tensor(obj):
            return self._tensor(obj, where)
        if isinstance(obj, dict):
            return {key: self._copy(value, f"{where}/{key}") for key, value in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._copy(value, f"{where}/{i}") for i, value in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return obj  # numbers, strings, None: immutable

    def _tensor(self, tensor: torch.Tensor, where: str) -> torch.Tensor:
        source = tensor.detach()
        buffer = self._buffers.get(where)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = self._buffers[where] = torch.empty_like(source, device="cpu")
        return buffer.copy_(source)


class AsyncCheckpointer:
    """Persists checkpoints on one background thread, one save at a time."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.snapshots = Snapshot()
        self._worker: threading.Thread | None = None
        self._jobs: queue.Queue[tuple[Callable[[], None], threading.Event]] = queue.Queue()
        self._done: threading.Event | None = None
        self._copied: threading.Event | None = None
        self._error: BaseException | None = None
        self.waiting = False
        """True while the training thread is blocked in `wait`: only then is the persist's
        progress the rank's progress (the trainer's heartbeat asks)."""

    def submit(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> None:
        """Snapshot the checkpoint of `step` and persist it, both in the background. Waits
        for the previous save's commit first: one persist in flight, and its snapshot
        buffers are free again before they are overwritten. Until `before_update`
        returns, the caller must not change the state it passed."""
        self.wait()
        copied = self._copied = threading.Event()

        def work() -> None:
            try:
                snapshot = self.take_snapshot(files)
            finally:
                copied.set()
            self.persist(step, snapshot, meta)
        self._start(step, work)

    def before_update(self) -> None:
        """Block until the snapshot of the last submitted save is taken: called before the
        optimizer step, the first moment the training state changes after a save."""
        if self._copied is not None:
            self._copied.wait()
            self._copied = None

    def take_snapshot(self, files: dict[str, FileContent]) -> dict[str, FileContent]:
        """What the step pays for (a seam: a planted defect skips it)."""
        return self.snapshots.take(files)

    def persist(self, step: int, files: dict[str, FileContent], meta: dict[str, Any]) -> None:
        """Runs on the background thread: the store's ordinary, atomic save."""
        self.store.save(step, files, meta)

    def _start(self, step: int, work: Callable[[], None]) -> None:
        # One long-lived worker, woken through a queue: starting a thread per save would
        # hand it the GIL at once and make the training thread wait for it (up to the
        # interpreter's 5 ms switch interval) before `submit` could return.
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name="ckpt-persist", daemon=True)
            self._worker.start()
        setattr(self._worker, SAVE_STEP_ATTR, step)  # the worker is idle: the previous save is done
        self._done = threading.Event()
        self._jobs.put((work, self._done))

    def _serve(self) -> None:
        while True:
            work, done = self._jobs.get()
            try:
                work()
            except BaseException as exc:  # noqa: BLE001  handed to the training thread, which dies of it
                self._error = exc
            finally:
                done.set()

    def wait(self) -> None:
        """Block until the save in flight is committed; re-raise its failure here."""
        self._copied = None  # a committed save was copied long before
        if self._done is not None:
            self.waiting = True
            try:
                self._done.wait()
            finally:
                self.waiting = False
            self._done = None
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """A persist that failed (ENOSPC, a bad path) fails the rank, as a synchronous save would."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
