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
"""
from __future__ import annotations

import errno as errno_codes
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable

from trainwreck.trainer.storage import OnChunk, Produce, Storage, gather

MUTATING = ("remove", "mkdir", "write", "rename", "fsync_dir")
STORAGE_KINDS = ("storage_stall", "storage_throttle", "storage_error", "torn_write", "crash_op")

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


@dataclass
class _Armed:
    fault: dict[str, Any]
    seen: int = 0
    """Matching ops seen so far (for nth / op_index / count)."""
    fired: bool = False


class FaultyStorage:
    """Wraps a Storage; every call goes through `_before`/`_after` so faults can act."""

    def __init__(self, inner: Storage, faults: list[dict[str, Any]], clock: StepClock,
                 record: Recorder, crash: Callable[[], None] = crash_now) -> None:
        self.inner = inner
        self.clock = clock
        self.record = record
        self.crash = crash
        self.armed = [_Armed(f) for f in faults if f["kind"] in STORAGE_KINDS]

    # ----- the Storage protocol ----------------------------------------------------------

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def read(self, path: str, on_chunk: OnChunk | None = None, limit: int | None = None) -> bytes:
        self._stall("read", path)
        data = self.inner.read(path, on_chunk, limit)
        self._throttle("read", path, len(data))
        return data

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        self._stall("write", path)
        self._fail_write(path)
        self._torn_write(path, data)
        op = self._crash_before("write", (path,), data)
        self.inner.write(path, data, durable=durable)
        self._throttle("write", path, len(data))
        self._crash_after(op)

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
        self._mutate("mkdir", (path,), lambda: self.inner.mkdir(path))

    def rename(self, src: str, dst: str) -> None:
        self._mutate("rename", (src, dst), lambda: self.inner.rename(src, dst))

    def fsync_dir(self, path: str) -> None:
        self._mutate("fsync_dir", (path,), lambda: self.inner.fsync_dir(path))

    def list(self, path: str) -> list[str]:
        return self.inner.list(path)

    def remove(self, path: str) -> None:
        self._mutate("remove", (path,), lambda: self.inner.remove(path))

    # ----- faults ------------------------------------------------------------------------

    def _now(self) -> int:
        """The save an op belongs to: a background persist thread (ckpt_mode="async") says
        which save it writes, because the training thread has moved the clock on since."""
        from trainwreck.trainer.async_ckpt import current_save_step

        step = current_save_step()
        return self.clock.step if step is None else step

    def _due(self, kind: str, from_step: bool = True) -> list[_Armed]:
        """Armed faults of `kind` whose step has come (>= step, or == step for one save)."""
        out = []
        now = self._now()
        for armed in self.armed:
            f = armed.fault
            if f["kind"] != kind:
                continue
            if (now >= f["step"]) if from_step else (now == f["step"]):
                out.append(armed)
        return out

    def _stall(self, op: str, path: str) -> None:
        for armed in self._due("storage_stall"):
            f = armed.fault
            if f["op"] != op or armed.seen >= f["count"]:
                continue
            armed.seen += 1
            if not armed.fired:
                armed.fired = True
                self.record(f, f"storage {op} of {path} stalled {f['seconds']} s "
                               f"(and the next {f['count'] - 1} {op}s)")
            time.sleep(f["seconds"])  # the stall itself: a slow disk, not a synchronisation

    def _throttle(self, op: str, path: str, size: int) -> None:
        for armed in self._due("storage_throttle"):
            f = armed.fault
            if f["op"] != op:
                continue
            if not armed.fired:
                armed.fired = True
                self.record(f, f"storage {op}s throttled to {f['bytes_per_s']} bytes/s from {path}")
            time.sleep(size / f["bytes_per_s"])  # the time those bytes take at that bandwidth

    def _fail_write(self, path: str) -> None:
        for armed in self._due("storage_error"):
            f = armed.fault
            if armed.fired:
                continue
            armed.seen += 1
            if armed.seen == f["nth"]:
                armed.fired = True
                code = getattr(errno_codes, f["errno"])
                self.record(f, f"write {armed.seen} of {path} raised {f['errno']}")
                raise OSError(code, f"{os.strerror(code)} (injected by fault {f['id']!r})", path)

    def _torn_write(self, path: str, data: bytes) -> None:
        for armed in self._due("torn_write", from_step=False):
            f = armed.fault
            if armed.fired or ("file" in f and path.rsplit("/", 1)[-1] != f["file"]):
                continue
            armed.seen += 1
            if armed.seen == f["nth"]:
                armed.fired = True
                self._tear(f, path, data)

    def _tear(self, fault: dict[str, Any], path: str, data: bytes) -> None:
        half = len(data) // 2
        extra = {}
        name = damaged_checkpoint(path)
        if name is not None:
            extra["checkpoint"] = name
        self.record(fault, f"tore the write of {path}: {half} of {len(data)} bytes persisted, then SIGKILL", **extra)
        self.inner.write(path, data[:half])
        self.crash()

    # crash_op: counted over the mutating ops of the save at its step, in call order.

    def _crash_point(self) -> _Armed | None:
        due = [a for a in self._due("crash_op", from_step=False) if not a.fired]
        return due[0] if due else None

    def _crash_before(self, name: str, args: tuple[str, ...], data: bytes | None = None) -> tuple[_Armed, Op] | None:
        armed = self._crash_point()
        if armed is None:
            return None
        f = armed.fault
        index = armed.seen
        armed.seen += 1
        op = Op(name, args, len(data) if data is not None else None)
        if index != f["op_index"]:
            return None
        armed.fired = True
        where = f"op {index} {op.describe()} of the save at step {f['step']}"
        if f["when"] == "before":
            self.record(f, f"SIGKILL before {where}")
            self.crash()
        elif f["when"] == "torn" and name == "write" and data is not None:
            self._tear(f, args[0], data)
        elif f["when"] == "torn":
            # Only a write can tear; a torn crash point on another op crashes before it.
            self.record(f, f"SIGKILL before {where} (not a write, so nothing to tear)")
            self.crash()
        return armed, op

    def _crash_after(self, pending: tuple[_Armed, Op] | None) -> None:
        if pending is None:
            return
        armed, op = pending
        f = armed.fault
        self.record(f, f"SIGKILL after op {f['op_index']} {op.describe()} of the save at step {f['step']}")
        self.crash()

    def _mutate(self, name: str, args: tuple[str, ...], run: Callable[[], None]) -> None:
        pending = self._crash_before(name, args)
        run()
        self._crash_after(pending)


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
