"""The faults a foreign trainer (the user's own script, a framework) takes in its ranks: crashes
inside its saves, and the hooks its probe builds for a `trainwreck run --cmd` rank.

Crashes inside a foreign save: intercept the file operations a framework performs while it
writes a checkpoint, and kill the rank before or after the N-th one, or tear the file it wrote.

    foreign = ForeignSave(plan, rank=0, attempt=0, record=emit_fault, root=ckpt_dir)
    with foreign.saving(step=8):          # the adapter wraps the framework's save call
        trainer.save_checkpoint(path)     # every file op under ckpt_dir is counted here

    ops = record_ops(lambda: writer(path), root=ckpt_dir)   # recording mode: one save's ops

Operations seen (what a crash can land between), in call order:

- Python audit events (``sys.addaudithook``): ``open`` for writing, ``os.rename`` (also
  raised by ``os.replace``), ``os.remove`` (also ``os.unlink``), ``os.mkdir``, ``os.rmdir``;
- ``torch.save`` and ``safetensors.torch.save_file`` to a path, wrapped, because both write
  from C++/Rust and raise no audit event, and ``shutil.rmtree``, wrapped, so a directory's
  removal is one op; each counts as one op (what they do inside is not counted again). ``torch.save`` into a buffer counts nothing: those bytes reach disk
  through a later ``open``.

Only operations on paths under ``root`` count (a save may also import modules or write logs),
and a rename with either end under it (fsspec writes into a temporary file elsewhere and moves it
in).
Interception is active only inside ``saving()``: an audit hook cannot be removed once added,
so outside a save the hook returns after one attribute test, and the rest of training is not
slowed. ``torch.save`` is wrapped only while a save is in progress.

``before`` crashes in the audit hook, which Python calls before doing the operation.
``after`` crashes at the next counted operation of the save, or at its end: nothing the
save does in between is an operation a crash could land between (a write to a file already
open is part of that file's ``open``), so the disk looks exactly as right after op N.
``torn`` (a write: ``open`` for writing or a wrapped save) lets the file be written, then
cuts it to a block boundary (``torn_size``), then crashes; a torn point on another
operation crashes before it. Every fault writes its ``fault`` event before it acts.

The hooks of a --cmd rank (``CmdHooks``, below) are built by its probe from run.json's plan.

A user's trainer is not the reference trainer: the harness cannot reach its storage or its
gradient hook, only what its adapter calls through the probe. So a --cmd rank takes exactly
the kinds below; the job spec refuses every other in-rank kind (harness/supervise/spec.py), naming it.

- ``kill`` and ``hang`` at the fault points the adapter calls (``probe.point``): every adapter
  here calls ``step_start``; Lightning's also ``after_backward``. A point the trainer never
  reaches leaves the fault unfired, and the judge then says "unknown", never a pass.
- ``foreign_crash`` inside the framework's own save, through ``probe.saving(step, root)``
  (``ForeignSave`` above counts the save's file operations).

The harness names this factory in the rank's environment (harness/launch/launchers.py ``cmd_env``),
and the probe resolves it by name, so the trainer package never imports faults/. ``corrupt``
is the harness's own between attempts (faults/between_attempts.py), so the ranks leave it alone.

Every save's file operations are also recorded as a ``save_ops`` event (an extension kind the
judge ignores): the frameworks table turns the golden run's into one run per crash point.
"""
from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from trainwreck.faults.inrank import FaultHooks
from trainwreck.faults.plan import FOREIGN, IN_RANK, KINDS, command_kinds, parse_plan, with_defaults
from trainwreck.faults.storage import crash_now

FOREIGN_KIND = "foreign_crash"
TEAR_BLOCK = 512
"""A torn file keeps whole 512-byte sectors: the unit a crash can leave on a disk."""
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# audit event -> the op's name in recordings and fault details
AUDITED = {"open": "open", "os.rename": "rename", "os.remove": "remove", "os.mkdir": "mkdir",
           "os.rmdir": "rmdir"}
WRITE_OPS = ("open", "torch.save", "save_file")
"""The ops that write a file's bytes: the ones a `torn` crash point can tear."""
OUTSIDE = "<outside the root>"
"""How an op names a path outside the root (a temporary file's random name would differ per run)."""
Recorder = Callable[..., None]
"""record(fault, detail, **extra): writes the `fault` event (flushed) before the fault acts."""


def torn_size(size: int) -> int:
    """The bytes a torn file keeps: about half, cut down to a whole block."""
    return (size // 2) // TEAR_BLOCK * TEAR_BLOCK


def is_write_open(mode: Any, flags: Any) -> bool:
    """Whether an `open` audit event opens for writing (builtins.open gives mode, os.open flags)."""
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


@dataclass(frozen=True)
class ForeignOp:
    """One file operation of a foreign save; `path` is relative to the root."""

    name: str
    path: str
    dst: str | None = None

    def describe(self) -> str:
        return f"{self.name}({self.path}{', ' + self.dst if self.dst is not None else ''})"

    @property
    def writes(self) -> bool:
        return self.name in WRITE_OPS


@dataclass
class _Session:
    """One save in progress: its step, the ops seen, and a crash owed after op N."""

    step: int
    root: Path
    ops: list[ForeignOp] = field(default_factory=list)
    pending: tuple[dict[str, Any], ForeignOp, bool] | None = None
    """(fault, op, torn): crash once op N is done (torn: after cutting op N's file)."""
    depth: int = 0
    """>0 while inside a wrapped save: its own file work is not counted again."""


class ForeignSave:
    """Fires this rank's `foreign_crash` faults inside the saves it is told about."""

    def __init__(self, plan: list[dict[str, Any]], rank: int, attempt: int, record: Recorder,
                 root: str | Path, crash: Callable[[], None] = crash_now) -> None:
        faults = [with_defaults(f) for f in parse_plan(plan).faults]
        self.faults = [f for f in faults if f["kind"] == FOREIGN_KIND and f["rank"] == rank
                       and f["attempt"] == attempt]
        self.rank, self.record, self.crash = rank, record, crash
        self.root = Path(root)
        self.fired: set[str] = set()
        self.session: _Session | None = None
        self.recorded: list[ForeignOp] = []
        """The ops of the last save (recording mode is simply this list)."""

    @contextmanager
    def saving(self, step: int) -> Iterator[None]:
        """Count and fault the file operations of the save after update `step`."""
        _install()
        self.session = _Session(step, self.root.resolve())
        _ACTIVE.append(self)
        try:
            with _wrapped_writers():
                yield
            self._settle()  # an `after`/`torn` crash owed by the save's last op
        finally:
            _ACTIVE.remove(self)
            self.recorded = list(self.session.ops)
            self.session = None

    # ----- called by the audit hook and the wrappers ------------------------------------

    def relative(self, path: Any) -> str | None:
        """`path` relative to the root, or None when it is outside (not counted)."""
        if isinstance(path, int) or path is None:
            return None  # an fd or dir_fd-relative name: not resolvable to our root here
        try:
            full = Path(os.fsdecode(path))
            full = (full if full.is_absolute() else Path.cwd() / full).resolve()
            return full.relative_to(self.session.root).as_posix() if self.session else None
        except (ValueError, OSError, TypeError):
            return None

    def on_op(self, op: ForeignOp) -> None:
        """Before op: settle a crash owed by the previous op, count this one, maybe crash."""
        session = self.session
        assert session is not None
        self._settle()
        index = len(session.ops)
        session.ops.append(op)
        for fault in self.faults:
            if fault["id"] in self.fired or fault["step"] != session.step or fault["op_index"] != index:
                continue
            self.fired.add(fault["id"])
            where = f"op {index} {op.describe()} of the save at step {session.step}"
            if fault["when"] == "before" or (fault["when"] == "torn" and not op.writes):
                note = "" if fault["when"] == "before" else " (not a write, so nothing to tear)"
                self._fire(fault, f"SIGKILL before {where}{note}")
                self.crash()
            session.pending = (fault, op, fault["when"] == "torn")

    def _fire(self, fault: dict[str, Any], detail: str, **extra: Any) -> None:
        """The fault event; the event log's own file work is not an op of the save."""
        assert self.session is not None
        self.session.depth += 1
        try:
            self.record(fault, detail, **extra)
        finally:
            self.session.depth -= 1

    def _settle(self) -> None:
        session = self.session
        if session is None or session.pending is None:
            return
        fault, op, torn = session.pending
        session.pending = None
        where = f"op {fault['op_index']} {op.describe()} of the save at step {session.step}"
        if not torn:
            self._fire(fault, f"SIGKILL after {where}")
            self.crash()
            return
        target = session.root / op.path
        size = target.stat().st_size if target.is_file() else 0
        keep = torn_size(size)
        self._fire(fault, f"tore {where}: {keep} of {size} bytes kept, then SIGKILL", file=op.path)
        if target.is_file():
            os.truncate(target, keep)
        self.crash()


# ----- the process-wide audit hook (added once, never removable) -----------------------

_ACTIVE: list[ForeignSave] = []
_INSTALLED = False


def _install() -> None:
    global _INSTALLED
    if not _INSTALLED:
        sys.addaudithook(_audit)
        _INSTALLED = True


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _ACTIVE:  # outside every save: the whole cost of the hook
        return
    name = AUDITED.get(event)
    if name is None:
        return
    save = _ACTIVE[-1]
    if save.session is None or save.session.depth:
        return
    if name == "open" and not is_write_open(args[1], args[2]):
        return
    path = save.relative(args[0])
    if name == "rename":
        # A file written elsewhere (a temporary directory) and moved into the root counts too.
        dst = save.relative(args[1])
        if path is None and dst is None:
            return
        save.on_op(ForeignOp(name, OUTSIDE if path is None else path, OUTSIDE if dst is None else dst))
    elif path is not None:
        save.on_op(ForeignOp(name, path))


def _counted_save(name: str, real: Callable[..., Any], path_arg: int) -> Callable[..., Any]:
    """A wrapper of a whole-file writer: one op when it writes to a path under the root."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        save = _ACTIVE[-1] if _ACTIVE else None
        target = args[path_arg] if len(args) > path_arg else kwargs.get("f", kwargs.get("filename", kwargs.get("path")))
        rel = save.relative(target) if save is not None and save.session and isinstance(target, (str, os.PathLike)) \
            else None
        if save is None or save.session is None or save.session.depth or rel is None:
            return real(*args, **kwargs)
        save.on_op(ForeignOp(name, rel))
        save.session.depth += 1
        try:
            return real(*args, **kwargs)
        finally:
            save.session.depth -= 1
    wrapper.__wrapped__ = real  # type: ignore[attr-defined]
    return wrapper


@contextmanager
def _wrapped_writers() -> Iterator[None]:
    """torch.save, safetensors' save_file and shutil.rmtree, wrapped for the save's duration only
    (rmtree's audit event has no end, so the removals it makes could not be told from the save's)."""
    import torch

    patches: list[tuple[Any, str, Any]] = [(torch, "save", _counted_save("torch.save", torch.save, 1)),
                                           (shutil, "rmtree", _counted_save("rmtree", shutil.rmtree, 0))]
    try:
        import safetensors.torch as st  # optional: only frameworks that use it have it
        # save_file calls this module global at call time, so a caller that bound save_file
        # at import (accelerate does) is still seen.
        patches.append((st, "serialize_file", _counted_save("save_file", st.serialize_file, 1)))
    except ImportError:
        pass
    originals = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in patches]
    for mod, attr, new in patches:
        setattr(mod, attr, new)
    try:
        yield
    finally:
        for mod, attr, old in originals:
            setattr(mod, attr, old)


# ----- recording mode --------------------------------------------------------------------


def record_ops(save: Callable[[], Any], root: str | Path, step: int = 0) -> list[ForeignOp]:
    """Run one save with nothing armed and return its file operations (the crash points)."""
    recorder = ForeignSave([], rank=0, attempt=0, record=lambda *a, **k: None, root=root)
    with recorder.saving(step):
        save()
    return recorder.recorded


def crash_points(ops: list[ForeignOp]) -> list[tuple[int, str, str]]:
    """(op_index, description, when) for every op: before, after, and torn for writes."""
    return [(i, op.describe(), when) for i, op in enumerate(ops)
            for when in ("before", "after", "torn") if when != "torn" or op.writes]


def crash_plan(step: int, op_index: int, when: str, rank: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"foreign-{when}-op{op_index}", "kind": FOREIGN_KIND, "rank": rank, "step": step,
             "op_index": op_index, "when": when}]


CMD_KINDS = tuple(k for k in command_kinds() if KINDS[k].where in (IN_RANK, FOREIGN))
"""The in-rank kinds a --cmd rank fires (declared `command=True` in faults/plan.py; the
harness's own kinds and `corrupt` come on top)."""
HOOKS_FACTORY = "trainwreck.faults.foreign:build_cmd_hooks"
"""What the harness names in TRAINWRECK_HOOKS for every --cmd rank."""


class CmdHooks(FaultHooks):
    """FaultHooks for the point faults, plus the foreign-save faults of ``saving``."""

    def __init__(self, plan: list[dict[str, Any]]) -> None:
        mine = [f for f in plan if f.get("kind") != "corrupt"]  # the harness applies those between attempts
        super().__init__(mine)
        self.foreign_plan = [f for f in mine if f.get("kind") == FOREIGN_KIND]
        self.saves: dict[Path, ForeignSave] = {}

    @contextmanager
    def saving(self, step: int, root: Path) -> Iterator[None]:
        """The framework's save after update `step`, writing under `root`: its file operations are
        counted, planned crashes fire inside it, and the ops are recorded once it is done."""
        assert self.events is not None, "bind() must run before a save"
        root = Path(root)
        if root not in self.saves:
            self.saves[root] = ForeignSave(self.foreign_plan, self.rank, self.attempt, self.record, root)
        save = self.saves[root]
        with save.saving(step):
            yield
        self.events.emit("save_ops", step=step, root=root.name, ops=[op.describe() for op in save.recorded])


def build_cmd_hooks(plan: list[dict[str, Any]]) -> CmdHooks:
    return CmdHooks(plan)
