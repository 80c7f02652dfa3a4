"""Power loss for the framework writers: record what a framework's own code does to the
checkpoint folder, with the data it wrote and the fsyncs that made it durable, as the op
log faults/powerloss.py's crash-state generator takes (unchanged).

    python -m trainwreck.faults.foreign_record --record -- train.py --steps 12   # one rank, recorded
    log = load_foreign_oplog(run_dir / "powerloss")                               # every rank, merged

A framework writes checkpoints with its own code, never through trainwreck's Storage, so
the recording happens in each rank's process, for the whole run (every save, whatever
calls it; Hugging Face's Trainer saves with no hook around the save):

- Python audit hooks (the same events as faults/foreign.py): ``open`` for writing starts a
  file's data, ``os.rename``/``os.replace``, ``os.remove``, ``os.mkdir``, ``os.rmdir``;
- wrappers: ``torch.save`` and safetensors' ``serialize_file`` to a path (C++/Rust writers
  raise no audit event), ``shutil.rmtree`` (one recursive unlink), ``os.fsync`` and
  ``os.fdatasync`` (the durability barriers; the fd's path comes from /proc/self/fd: a
  directory's fsync is a directory barrier, a file's a data barrier);
- a file's bytes are read from disk at the next recorded op of its process, at its fsync,
  when a wrapped writer returns, and at exit (audit hooks see no `write`): the data op
  records the file as it was then, timed when its writing began.

Each rank appends raw records to RUN_DIR/powerloss/raw-aNNN-rNNN.jsonl (data kept once per
content in powerloss/blobs, as ShippedRecorder does); ``load_foreign_oplog`` merges the
ranks by time and replays them through a PowerLossRecorder, which assigns identities and
drops what did not change the namespace (a mkdir of a folder that exists, a remove of
something never there). Only paths under the root count; a rename into the root from
outside it (Lightning's fsspec writes into $TMPDIR and moves the file in) records the
file's bytes and an entry with no source (faults/powerloss.py rule 5).
"""
from __future__ import annotations

import argparse
import atexit
import heapq
import json
import os
import runpy
import shutil
import stat
import sys
import threading
import time
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from trainwreck.faults.foreign import AUDITED, OUTSIDE as OUTSIDE_NAME, is_write_open
from trainwreck.faults.powerloss import (OPS_DIR, OUTSIDE, OpLog, PowerLossRecorder, Tree, snapshot,
                                         store_blob)

RAW_PREFIX = "raw-"
"""RUN_DIR/powerloss/raw-aNNN-rNNN.jsonl: one rank's raw records of one attempt."""


def raw_file(run_dir: Path, attempt: int, rank: int) -> Path:
    return Path(run_dir) / OPS_DIR / f"{RAW_PREFIX}a{attempt:03d}-r{rank:03d}.jsonl"


# ----- 1. in the rank: the raw recording ---------------------------------------------------


class ForeignRecorder:
    """Records one process's file operations under `root` into `out` (JSON lines)."""

    def __init__(self, root: Path, out: Path, rank: int = 0) -> None:
        self.root = Path(root).resolve()
        self.out, self.rank = Path(out), rank
        self.blobs = self.out.parent / "blobs"
        self.watch: dict[str, tuple[float, tuple[int, int] | None]] = {}
        """Files this process wrote, by path under the root: (when writing began, the (size,
        mtime) last captured; None: not captured yet). Re-read when that changes."""
        self.seq = 0
        self.quiet = 0
        """>0 while the recorder itself works, or a wrapped writer runs: no audit counts."""
        self.lock = threading.RLock()

    def start(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.blobs.mkdir(exist_ok=True)
        before = snapshot(self.root) if self.root.is_dir() else {}
        self._line({"before": {p: (None if c is None else store_blob(self.blobs, c)) for p, c in before.items()},
                    "rank": self.rank, "root": str(self.root)})

    # ----- records --------------------------------------------------------------------------

    def _line(self, record: dict[str, Any]) -> None:
        with self.out.open("a") as f:  # one line per op, written before the next op is issued
            f.write(json.dumps(record) + "\n")

    def record(self, op: str, path: str | None, t: float | None = None, **fields: Any) -> None:
        self.seq += 1
        self._line({"op": op, "path": path, "t": time.time() if t is None else t, "seq": self.seq, **fields})

    def relative(self, path: Any) -> str | None:
        """`path` relative to the root ("." for the root), or None when outside it."""
        if path is None or isinstance(path, int):
            return None
        try:
            full = Path(os.fsdecode(path))
            full = (full if full.is_absolute() else Path.cwd() / full).resolve()
            rel = full.relative_to(self.root).as_posix()
        except (ValueError, OSError, TypeError):
            return None
        return rel if rel else "."

    @staticmethod
    def _sig(full: Path) -> tuple[int, int] | None:
        try:
            st = full.stat()
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None

    def settle(self, only: str | None = None) -> None:
        """Capture the bytes of every watched file that changed since it was last captured."""
        for rel in [only] if only is not None else list(self.watch):
            if rel not in self.watch:
                continue
            began, seen = self.watch[rel]
            full = self.root / rel
            sig = self._sig(full)
            if sig is None or sig == seen:
                continue
            data = full.read_bytes()
            self.watch[rel] = (began, sig)
            # The first capture is timed when the writing began; a later one (the file grew) now.
            self.record("data", rel, t=began if seen is None else time.time(), blob=store_blob(self.blobs, data))

    # ----- what the hooks report --------------------------------------------------------

    def opened(self, rel: str) -> None:
        now = time.time()
        self.settle()
        self.record("open", rel, t=now)
        self.watch[rel] = (now, None)

    def renamed(self, src: str | None, dst: str | None, source: Any) -> None:
        self.settle()
        if src is None:  # moved in from outside the root: its bytes are recorded with the entry
            data = Path(os.fsdecode(source)).read_bytes() if Path(os.fsdecode(source)).is_file() else b""
            self.record("rename", None, dst=dst, blob=store_blob(self.blobs, data))
            self.watch[dst] = (time.time(), self._sig(Path(os.fsdecode(source))))  # type: ignore[index]
            return
        self.record("rename", src, dst=dst)
        for rel in [r for r in self.watch if r == src or r.startswith(src + "/")]:
            entry = self.watch.pop(rel)
            if dst is not None:
                self.watch[dst + rel[len(src):]] = entry

    def removed(self, op: str, rel: str) -> None:
        self.settle()
        self.record(op, rel)
        for gone in [r for r in self.watch if r == rel or r.startswith(rel + "/")]:
            del self.watch[gone]

    def made_dir(self, rel: str) -> None:
        self.settle()
        self.record("mkdir", rel)

    def synced(self, rel: str, t: float) -> None:
        self.settle(rel)  # the barrier covers the bytes written so far
        self.settle()
        self.record("fsync", rel, t=t)

    # ----- the audit hook ----------------------------------------------------------------

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        name = AUDITED.get(event)
        if name is None or self.quiet:
            return
        with self.lock, self._busy():
            if name == "open":
                if is_write_open(args[1], args[2]) and (rel := self.relative(args[0])) not in (None, "."):
                    self.opened(rel)  # type: ignore[arg-type]
            elif name == "rename":
                src, dst = self.relative(args[0]), self.relative(args[1])
                if (src is not None or dst is not None) and _no_dir_fd(args[2:]):
                    self.renamed(src, dst, args[0])
            elif _no_dir_fd(args[2:] if name == "mkdir" else args[1:]):
                rel = self.relative(args[0])
                if rel is not None and name == "mkdir":
                    self.made_dir(rel)
                elif rel is not None:
                    self.removed(name, rel)

    @contextmanager
    def _busy(self) -> Iterator[None]:
        self.quiet += 1
        try:
            yield
        finally:
            self.quiet -= 1

    # ----- the wrappers ------------------------------------------------------------------

    def whole_file(self, real: Callable[..., Any], path_arg: int, kind: str = "open") -> Callable[..., Any]:
        """A writer of a whole file (torch.save, serialize_file) or tree (rmtree): one op."""
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            target = args[path_arg] if len(args) > path_arg else kwargs.get("f", kwargs.get("filename",
                                                                                            kwargs.get("path")))
            rel = self.relative(target) if isinstance(target, (str, bytes, os.PathLike)) and not self.quiet else None
            if rel is None:
                return real(*args, **kwargs)
            with self.lock, self._busy():
                self.opened(rel) if kind == "open" else self.removed(kind, rel)
                result = real(*args, **kwargs)
                self.settle(rel)
            return result
        wrapper.__wrapped__ = real  # type: ignore[attr-defined]
        return wrapper

    def barrier(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def wrapper(fd: int) -> None:
            t = time.time()
            real(fd)
            if self.quiet:
                return
            try:
                rel = self.relative(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                rel = None
            if rel is not None:
                with self.lock, self._busy():
                    self.synced(rel, t)
        wrapper.__wrapped__ = real  # type: ignore[attr-defined]
        return wrapper

    def finish(self) -> None:
        with self.lock, self._busy():
            self.settle()


def _no_dir_fd(rest: tuple[Any, ...]) -> bool:
    """A dir_fd-relative op (rmtree's own unlinks) names no path we can resolve: rmtree is wrapped.
    The audit event gives -1 (or None) when no dir_fd was passed."""
    return all(fd is None or (isinstance(fd, int) and fd < 0) for fd in rest)


_RECORDER: ForeignRecorder | None = None


def install(root: Path, out: Path, rank: int = 0) -> ForeignRecorder:
    """Record this process's file operations under `root` from now until it exits (an audit
    hook cannot be removed: one recorder per process)."""
    global _RECORDER
    if _RECORDER is not None:
        raise RuntimeError("a foreign recorder is already installed in this process")
    recorder = _RECORDER = ForeignRecorder(root, out, rank)
    recorder.start()
    import torch

    torch.save = recorder.whole_file(torch.save, 1)
    try:
        import safetensors.torch as st  # save_file calls this module global at call time
        st.serialize_file = recorder.whole_file(st.serialize_file, 1)
    except ImportError:
        pass
    shutil.rmtree = recorder.whole_file(shutil.rmtree, 0, kind="rmtree")
    os.fsync = recorder.barrier(os.fsync)
    os.fdatasync = recorder.barrier(os.fdatasync)
    real_exit = os._exit

    def exit_after_settling(code: int) -> None:  # some scripts leave with os._exit (accelerate_train)
        recorder.finish()
        real_exit(code)
    os._exit = exit_after_settling  # type: ignore[assignment]
    atexit.register(recorder.finish)
    sys.addaudithook(lambda event, args: recorder.audit(event, args) if _RECORDER is recorder else None)
    return recorder


# ----- 2. on the harness side: the merged op log ---------------------------------------------


class _Nothing:
    """A Storage that does nothing: the replay only logs (the ops happened in the ranks)."""

    def mkdir(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def remove(self, path: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...


class Replay(PowerLossRecorder):
    """Turns raw records into low-level ops, tracking identities as PowerLossRecorder does."""

    def __init__(self, before: Tree) -> None:
        super().__init__(_Nothing(), Path("."))  # type: ignore[arg-type]
        self.start(before)

    def _clock(self) -> float:
        return self._issued  # the time of the raw record being applied, set by apply()

    def apply(self, raw: dict[str, Any], data: Callable[[str], bytes]) -> None:
        self._issued = float(raw["t"])
        op, path = raw["op"], raw.get("path")
        if op in ("open", "data") and path not in self.ids:
            if _parent(path) not in self.ids:
                return  # inside a folder never seen (its mkdir was not recorded): nothing to model
            self.ids[path] = self._new(False)
            self._add("create", path, inode=self.ids[path], **self._entry(path))
        if op == "data" and path in self.ids and self.ids[path] not in self.dirs:
            self._add("data", path, inode=self.ids[path], data=data(raw["blob"]))
        elif op == "fsync" and path in self.ids:
            inode = self.ids[path]
            self._add("fsync_dir" if inode in self.dirs else "fsync_file", path, inode=inode)
        elif op == "mkdir" and path not in self.ids and _parent(path) in self.ids:
            self.mkdir(path)
        elif op in ("remove", "rmdir", "rmtree") and path in self.ids:
            self.remove(path)
        elif op == "rename":
            self._rename(path, raw.get("dst"), raw.get("blob"), data)

    def _rename(self, src: str | None, dst: str | None, blob: str | None, data: Callable[[str], bytes]) -> None:
        if src is not None and src not in self.ids:
            return  # a rename that failed, or of something never seen
        if dst is None or _parent(dst) not in self.ids:  # moved out of the root (or nowhere we know)
            if src is not None:
                self.remove(src)
        elif src is not None:
            self.rename(src, dst)
        else:  # moved in from outside: its bytes, then the entry
            inode = self._new(False)
            name = dst.rsplit("/", 1)[-1]
            self._add("data", f"{OUTSIDE_NAME}/{name}", inode=inode, data=data(blob) if blob else b"")
            entry = self._entry(dst)
            self._add("rename", OUTSIDE_NAME, inode=inode, parent=OUTSIDE, name=name, dst=dst,
                      dst_parent=entry["parent"], dst_name=entry["name"])
            for p in self._subtree(dst):
                del self.ids[p]
            self.ids[dst] = inode


def _parent(path: str | None) -> str:
    return "." if path is None or "/" not in path else path.rsplit("/", 1)[0]


def _records(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines or "before" not in lines[0]:
        raise ValueError(f"{path} is not a foreign power-loss recording: its first line must hold 'before'")
    return lines[0], lines[1:]


def load_foreign_oplog(ops_dir: Path, attempt: int = 0) -> OpLog:
    """Every rank's raw records of `attempt`, merged by time (each rank's own order kept),
    as one op log whose durable state before is rank 0's snapshot at its start."""
    files = sorted(Path(ops_dir).glob(f"{RAW_PREFIX}a{attempt:03d}-r*.jsonl"))
    if not files:
        raise ValueError(f"{ops_dir} holds no {RAW_PREFIX}a{attempt:03d}-r*.jsonl: the observed run recorded nothing; "
                         "run the command through `python -m trainwreck.faults.foreign_record --record`")
    blobs = Path(ops_dir) / "blobs"
    heads, streams = zip(*(_records(f) for f in files))
    before = {p: (None if h is None else (blobs / h).read_bytes()) for p, h in heads[0]["before"].items()}
    replay = Replay(before)
    read = lambda digest: (blobs / digest).read_bytes()  # noqa: E731
    for raw in heapq.merge(*streams, key=lambda r: r["t"]):
        replay.apply(raw, read)
    return replay.log


# ----- 3. the command wrapper ------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m trainwreck.faults.foreign_record [--record] [--dataset-size N ...] -- SCRIPT ARGS`:
    run one rank of a framework's script (as `trainwreck run --cmd` starts it), recording
    its file operations under $TRAINWRECK_RUN_DIR/checkpoints with --record, and adding the
    run.json fields only the script knows when it does not write them itself."""
    parser = argparse.ArgumentParser(prog="python -m trainwreck.faults.foreign_record")
    parser.add_argument("--record", action="store_true", help="record this rank's file operations")
    parser.add_argument("--ckpt-dir", default="checkpoints", help="the checkpoint folder, relative to the run dir")
    for name in ("dataset-size", "global-batch", "total-steps"):
        parser.add_argument(f"--{name}", type=int, help="run.json's field, for a script whose probe does not write it")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    run_dir = os.environ.get("TRAINWRECK_RUN_DIR")
    if run_dir is None:
        parser.error("TRAINWRECK_RUN_DIR is not set: start this under `trainwreck run --cmd`")
    rank, attempt = int(os.environ.get("RANK", "0")), int(os.environ.get("TRAINWRECK_ATTEMPT", "0"))
    if ns.dataset_size is not None:
        from trainwreck.trainer.probe import Probe

        writer = Probe(None, rank, int(os.environ.get("WORLD_SIZE", "1")))
        writer.run_dir = Path(run_dir)  # run.json only: this probe writes no events
        writer.write_run_json(dataset_size=ns.dataset_size, global_batch=ns.global_batch, drop_last=True,
                              total_steps=ns.total_steps)
    if ns.record:
        install(Path(run_dir) / ns.ckpt_dir, raw_file(Path(run_dir), attempt, rank), rank)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    sys.argv = [ns.script, *args]
    runpy.run_path(ns.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
