"""Storage faults: a ``Storage`` wrapper that stalls, throttles, fails, tears or crashes.

The trainer's checkpoint store does every byte of checkpoint I/O through one
``Storage`` (trainer/storage.py), and ``Hooks.wrap_storage`` lets the in-rank hooks
hand it this wrapper instead. The wrapper knows the update the rank is in from the
fault points (``StepClock``): storage ops happen only at an attempt's restore (step
0 of the clock, before any point) and inside the save after update S (clock at S),
so "the save at step S" is simply "the ops while the clock reads S".

Mutating ops (what a crash can land between) are MUTATING; ``exists``, ``read`` and
``list`` change nothing, so a crash just before one of them is the crash just after
the previous mutating op, and the crash-point sweep does not count them.

Each storage kind is one class here (``Stall``, ``Throttle``, ``WriteError``, ``TornWrite``,
``CrashOp``), named by its declaration's `injector` in faults/plan.py KINDS: the wrapper builds
one per fault and tells each before and after every op (the ``StorageFault`` seam), and never
asks a fault its kind, so a new storage kind is its declaration and its class.
"""
from __future__ import annotations

import errno as errno_codes
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from trainwreck.faults.plan import KINDS
from trainwreck.trainer.storage import OnChunk, Produce, Storage, gather

MUTATING = ("remove", "mkdir", "write", "rename", "fsync_dir")

# record(fault, detail, **extra): writes the `fault` event (flushed) before the fault acts.
Recorder = Callable[..., None]


@dataclass
class StepClock:
    """The update the rank is in, as the fault points last said (0 before the first point)."""

    step: int = 0


@dataclass
class Op:
    """One storage call: its name and arguments (the data itself is not kept)."""

    name: str
    args: tuple[str, ...]
    size: int | None = None

    def describe(self) -> str:
        what = f"{self.name}({', '.join(self.args)})"
        return f"{what} [{self.size} bytes]" if self.size is not None else what


def damaged_checkpoint(path: str) -> str | None:
    """The committed-checkpoint directory a write to `path` lands in, if any: a write
    inside `step-XXXXXXXX/` damages that checkpoint; one inside a temporary directory
    or to the pointer damages no checkpoint (the temporary never becomes one torn)."""
    from trainwreck.trainer.checkpoint import checkpoint_step

    first = path.split("/", 1)[0]
    return first if "/" in path and checkpoint_step(first) is not None else None


def crash_now() -> None:
    """SIGKILL ourselves: no finally blocks, no flushes, exactly like a power cut of the process."""
    os.kill(os.getpid(), signal.SIGKILL)


@runtime_checkable
class StorageFault(Protocol):
    """Acts on the rank's storage ops: built per fault as ``cls(fault, store)`` by FaultyStorage,
    told before and after every op that reads or changes a file (``data``: a write's bytes)."""

    def before(self, op: Op, data: bytes | None) -> None: ...

    def after(self, op: Op) -> None: ...


def _storage_injector(fault: dict[str, Any]) -> type[StorageFault] | None:
    declared = KINDS.get(fault["kind"])
    injector = declared.load_injector() if declared is not None else None
    return injector if isinstance(injector, type) and issubclass(injector, StorageFault) else None


class FaultyStorage:
    """Wraps a Storage; every op that reads or changes a file tells the armed faults before and after it."""

    def __init__(self, inner: Storage, faults: list[dict[str, Any]], clock: StepClock,
                 record: Recorder, crash: Callable[[], None] = crash_now) -> None:
        self.inner = inner
        self.clock = clock
        self.record = record
        self.crash = crash
        # In declaration order, so that before a write a stall comes first, then an error, a tear, a crash.
        order = list(KINDS)
        self.armed: list[StorageFault] = [
            cls(f, self) for f in sorted(faults, key=lambda f: order.index(f["kind"]) if f["kind"] in KINDS else 0)
            if (cls := _storage_injector(f)) is not None]

    # ----- the Storage protocol ----------------------------------------------------------

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def read(self, path: str, on_chunk: OnChunk | None = None, limit: int | None = None) -> bytes:
        self._before(Op("read", (path,)))
        data = self.inner.read(path, on_chunk, limit)
        self._after(Op("read", (path,), len(data)))
        return data

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        op = Op("write", (path,), len(data))
        self._before(op, data)
        self.inner.write(path, data, durable=durable)
        self._after(op)

    def write_stream(self, path: str, produce: Produce, durable: bool = True) -> int:
        """A streamed write is one `write`: with no storage fault armed it streams through;
        with one armed, the content is gathered first so every fault (a tear at half the
        bytes, a crash before or after, an error, a throttle) acts on it exactly as on `write`."""
        if not self.armed:
            return self.inner.write_stream(path, produce, durable=durable)
        data = gather(produce)
        self.write(path, data, durable=durable)
        return len(data)

    def mkdir(self, path: str) -> None:
        self._mutate(Op("mkdir", (path,)), lambda: self.inner.mkdir(path))

    def rename(self, src: str, dst: str) -> None:
        self._mutate(Op("rename", (src, dst)), lambda: self.inner.rename(src, dst))

    def fsync_dir(self, path: str) -> None:
        self._mutate(Op("fsync_dir", (path,)), lambda: self.inner.fsync_dir(path))

    def list(self, path: str) -> list[str]:
        return self.inner.list(path)

    def remove(self, path: str) -> None:
        self._mutate(Op("remove", (path,)), lambda: self.inner.remove(path))

    # ----- for the faults ----------------------------------------------------------------

    def now(self) -> int:
        """The save an op belongs to: a background persist thread (ckpt_mode="async") says
        which save it writes, because the training thread has moved the clock on since."""
        from trainwreck.trainer.async_ckpt import current_save_step

        step = current_save_step()
        return self.clock.step if step is None else step

    def tear(self, fault: dict[str, Any], path: str, data: bytes) -> None:
        """Persist half of the write's bytes, then crash (the event first, naming a damaged checkpoint)."""
        half = len(data) // 2
        extra = {}
        name = damaged_checkpoint(path)
        if name is not None:
            extra["checkpoint"] = name
        self.record(fault, f"tore the write of {path}: {half} of {len(data)} bytes persisted, then SIGKILL", **extra)
        self.inner.write(path, data[:half])
        self.crash()

    def _before(self, op: Op, data: bytes | None = None) -> None:
        for fault in self.armed:
            fault.before(op, data)

    def _after(self, op: Op) -> None:
        for fault in self.armed:
            fault.after(op)

    def _mutate(self, op: Op, run: Callable[[], None]) -> None:
        self._before(op)
        run()
        self._after(op)


class _Armed:
    """A storage fault of one plan entry: due from update `step` on (`one_save`: only in the save
    at `step`), with the matching ops it has seen and whether it has fired."""

    one_save = False

    def __init__(self, fault: dict[str, Any], store: FaultyStorage) -> None:
        self.fault, self.store = fault, store
        self.seen = 0
        """Matching ops seen so far (for nth / op_index / count)."""
        self.fired = False

    def due(self) -> bool:
        now = self.store.now()
        return now == self.fault["step"] if self.one_save else now >= self.fault["step"]

    def before(self, op: Op, data: bytes | None) -> None:
        pass

    def after(self, op: Op) -> None:
        pass


class Stall(_Armed):
    """`storage_stall`: the first `count` matching ops from its step on take `seconds` longer."""

    def before(self, op: Op, data: bytes | None) -> None:
        f = self.fault
        if op.name != f["op"] or not self.due() or self.seen >= f["count"]:
            return
        self.seen += 1
        if not self.fired:
            self.fired = True
            self.store.record(f, f"storage {op.name} of {op.args[0]} stalled {f['seconds']} s "
                                 f"(and the next {f['count'] - 1} {op.name}s)")
        time.sleep(f["seconds"])  # the stall itself: a slow disk, not a synchronisation


class Throttle(_Armed):
    """`storage_throttle`: matching ops from its step on run at `bytes_per_s`."""

    def after(self, op: Op) -> None:
        f = self.fault
        if op.name != f["op"] or not self.due():
            return
        if not self.fired:
            self.fired = True
            self.store.record(f, f"storage {op.name}s throttled to {f['bytes_per_s']} bytes/s from {op.args[0]}")
        time.sleep((op.size or 0) / f["bytes_per_s"])  # the time those bytes take at that bandwidth


class WriteError(_Armed):
    """`storage_error`: the `nth` write from its step on raises ENOSPC or EIO."""

    def before(self, op: Op, data: bytes | None) -> None:
        f = self.fault
        if op.name != "write" or self.fired or not self.due():
            return
        self.seen += 1
        if self.seen == f["nth"]:
            self.fired = True
            code = getattr(errno_codes, f["errno"])
            path = op.args[0]
            self.store.record(f, f"write {self.seen} of {path} raised {f['errno']}")
            raise OSError(code, f"{os.strerror(code)} (injected by fault {f['id']!r})", path)


class TornWrite(_Armed):
    """`torn_write`: the `nth` write (of file `file`) of the save at its step persists half, then SIGKILL."""

    one_save = True

    def before(self, op: Op, data: bytes | None) -> None:
        f, path = self.fault, op.args[0]
        if op.name != "write" or self.fired or not self.due() or ("file" in f and path.rsplit("/", 1)[-1] != f["file"]):
            return
        self.seen += 1
        if self.seen == f["nth"] and data is not None:
            self.fired = True
            self.store.tear(f, path, data)


class CrashOp(_Armed):
    """`crash_op`: SIGKILL before or after the `op_index`-th mutating op of the save at its step,
    counted in call order, or tear it when it is a write."""

    one_save = True

    def __init__(self, fault: dict[str, Any], store: FaultyStorage) -> None:
        super().__init__(fault, store)
        self.pending: Op | None = None
        """The op it fired at: after it, the crash "after" it."""

    def before(self, op: Op, data: bytes | None) -> None:
        f = self.fault
        if op.name not in MUTATING or self.fired or not self.due():
            return
        index = self.seen
        self.seen += 1
        if index != f["op_index"]:
            return
        self.fired, self.pending = True, op
        where = f"op {index} {op.describe()} of the save at step {f['step']}"
        if f["when"] == "before":
            self.store.record(f, f"SIGKILL before {where}")
            self.store.crash()
        elif f["when"] == "torn" and op.name == "write" and data is not None:
            self.store.tear(f, op.args[0], data)
        elif f["when"] == "torn":
            # Only a write can tear; a torn crash point on another op crashes before it.
            self.store.record(f, f"SIGKILL before {where} (not a write, so nothing to tear)")
            self.store.crash()

    def after(self, op: Op) -> None:
        if self.pending is op:
            f = self.fault
            self.store.record(f, f"SIGKILL after op {f['op_index']} {op.describe()} of the save at step {f['step']}")
            self.store.crash()


class RecordingStorage:
    """Records every call made on the wrapped Storage (the crash-point sweep's reference)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.ops: list[Op] = []
        self.recording = True

    def _log(self, name: str, *args: str, size: int | None = None) -> None:
        if self.recording:
            self.ops.append(Op(name, args, size))

    def exists(self, path: str) -> bool:
        self._log("exists", path)
        return self.inner.exists(path)

    def read(self, path: str, on_chunk: OnChunk | None = None, limit: int | None = None) -> bytes:
        self._log("read", path)
        return self.inner.read(path, on_chunk, limit)

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        self._log("write", path, size=len(data))
        self.inner.write(path, data, durable=durable)

    def write_stream(self, path: str, produce: Produce, durable: bool = True) -> int:
        # Recorded as the `write` it is (one file written), so crash points keep their names.
        op = Op("write", (path,))
        if self.recording:
            self.ops.append(op)
        op.size = self.inner.write_stream(path, produce, durable=durable)
        return op.size

    def mkdir(self, path: str) -> None:
        self._log("mkdir", path)
        self.inner.mkdir(path)

    def rename(self, src: str, dst: str) -> None:
        self._log("rename", src, dst)
        self.inner.rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self._log("fsync_dir", path)
        self.inner.fsync_dir(path)

    def list(self, path: str) -> list[str]:
        self._log("list", path)
        return self.inner.list(path)

    def remove(self, path: str) -> None:
        self._log("remove", path)
        self.inner.remove(path)

    def mutating(self) -> list[Op]:
        return [op for op in self.ops if op.name in MUTATING]
