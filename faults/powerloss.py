"""Power loss: the states a file system may leave when the power is cut during a save.

    log = record_save("rename_no_fsync")          # OpLog: pre-save snapshot + low-level ops
    states, stats = crash_states(log, seed=0, cap=64)
    states[0].describe()                           # "after op 12 ...: lost ...; torn ..."
    materialise(states[0], run_copy / "checkpoints")

A process crash (faults/sweep.py) leaves every earlier operation complete: the kernel
still writes the page cache out. A power cut does not: file data that was not fsynced
can be lost or torn, and directory entries (create, rename, unlink) whose directory was
not fsynced can vanish. The model (docs/FAULTS.md, "Power loss") is close to ext4
data=ordered, but assumes only what POSIX and ext4 document, never a journal side
effect:

1. Synced operations are never lost: file data followed by an fsync of that file;
   an entry operation followed by an fsync of the directory it lives in.
2. Unsynced data of a file (only its last write counts: every write replaces the file)
   persists fully, is lost (the file is empty, ext4's zero-length file), or is torn at
   4096-byte blocks (a prefix of whole blocks persists).
3. Unsynced entry operations of one directory persist as a prefix, in order; those of
   different directories persist independently (any subset of directories' prefixes).
4. data=ordered: a file's data written before a rename of that file persisted is
   itself persisted in full (ext4 flushes it before committing the rename). A file
   renamed as part of its directory gets no such guarantee.
5. A rename is atomic; an entry operation inside a directory that is not reachable is
   invisible (directories and files are tracked by identity, so renames do not confuse
   which directory an operation belongs to). A rename into the root from outside it (a
   framework's temporary file) only adds the entry: the file's data is recorded just before
   it, so rule 4 applies to it as to any rename.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from trainwreck.trainer.hooks import NoHooks
from trainwreck.rundir.layout import RunDir
from trainwreck.trainer.storage import OnChunk, Produce, Storage, check_relative, gather, storage_fs

BLOCK = 4096
"""The granularity at which unsynced file data tears (a page and an ext4 block)."""
ROOT = 0
"""The identity of the storage root directory."""
OUTSIDE = -2
"""The parent of a file renamed into the root from outside it (its source is not modelled)."""
ENTRY_KINDS = ("create", "mkdir", "rename", "unlink")

Tree = dict[str, "bytes | None"]
"""A materialisable directory tree: relative path -> file bytes, or None for a directory."""


@dataclass(frozen=True)
class LowOp:
    """One low-level file-system operation, with the identities the model needs."""

    index: int
    kind: str
    """create, mkdir, rename, unlink (entries); data, fsync_file (file data); fsync_dir."""
    path: str
    """The path at the time of the op (the source of a rename, the directory of fsync_dir)."""
    inode: int = -1
    """The file or directory the op creates, moves, unlinks, writes or fsyncs."""
    parent: int = -1
    """The directory holding the entry (the source directory of a rename)."""
    name: str = ""
    dst: str = ""
    dst_parent: int = -1
    dst_name: str = ""
    data: bytes = b""
    t: float = 0.0
    """Wall-clock time the op was issued (in-rank recordings; 0 for in-process ones): the
    observer's event log is cut here when the power fails just before this op."""

    @property
    def group(self) -> int:
        """The directory whose fsync makes this entry op durable (a rename: its destination)."""
        return self.dst_parent if self.kind == "rename" else self.parent

    def describe(self) -> str:
        if self.kind == "rename":
            return f"rename({self.path} -> {self.dst})"
        if self.kind == "data":
            return f"data({self.path}) [{len(self.data)} bytes]"
        return f"{self.kind}({self.path})"


@dataclass
class OpLog:
    """The durable state before the save, and the save as low-level ops."""

    before: Tree
    ids: dict[str, int] = field(default_factory=dict)
    """The identity of each path of `before` ("." is ROOT)."""
    ops: list[LowOp] = field(default_factory=list)


def _parent_path(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else "."


def _norm(path: str) -> str:
    return "." if path in ("", ".") else str(check_relative(path))


# ----- 1. the recorder ---------------------------------------------------------------------


def snapshot(root: Path) -> Tree:
    """Every directory and regular file under `root` (symlinks are never followed)."""
    tree: Tree = {}
    for here, dirs, files in os.walk(root, followlinks=False):
        rel = os.path.relpath(here, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for d in dirs:
            if not os.path.islink(os.path.join(here, d)):
                tree[prefix + d] = None
        for f in files:
            full = os.path.join(here, f)
            if os.path.isfile(full) and not os.path.islink(full):
                tree[prefix + f] = Path(full).read_bytes()
    return tree


class PowerLossRecorder:
    """A Storage wrapper that logs each call as the low-level ops a power cut acts on.

    It keeps its own map of paths to identities (starting from `start()`'s snapshot),
    so it knows whether a write creates a file and what a recursive remove unlinks."""

    def __init__(self, inner: Storage, root: Path) -> None:
        self.inner = inner
        self.root = Path(root)
        self.log = OpLog({})
        self.ids: dict[str, int] = {".": ROOT}
        self.dirs: set[int] = {ROOT}
        self._next = 1
        self._issued = 0.0
        """When the current Storage call was issued (its ops carry this time)."""

    def start(self, before: Tree | None = None) -> None:
        """Snapshot the root (or take `before`) as the durable state and start a fresh log."""
        before = snapshot(self.root) if before is None else before
        self.ids, self.dirs, self._next = {".": ROOT}, {ROOT}, 1
        for path, content in sorted(before.items()):
            self.ids[path] = self._new(content is None)
        self.log = OpLog(before, dict(self.ids))

    def _clock(self) -> float:
        """When a Storage call is issued (a replay of ops recorded elsewhere gives their time)."""
        return time.time()

    def _new(self, is_dir: bool) -> int:
        self._next += 1
        if is_dir:
            self.dirs.add(self._next - 1)
        return self._next - 1

    def _add(self, kind: str, path: str, **fields: object) -> None:
        fields.setdefault("t", self._issued)
        self.log.ops.append(LowOp(len(self.log.ops), kind, path, **fields))  # type: ignore[arg-type]
        self._logged(self.log.ops[-1])

    def _logged(self, op: LowOp) -> None:
        """Called with every op as it is recorded (a subclass ships it off the process)."""

    def _entry(self, path: str) -> dict[str, object]:
        return {"parent": self.ids[_parent_path(path)], "name": path.rsplit("/", 1)[-1]}

    def _subtree(self, path: str) -> list[str]:
        """`path` and everything below it, deepest first (the order a remove unlinks)."""
        inside = [p for p in self.ids if p == path or p.startswith(path + "/")]
        return sorted(inside, key=lambda p: p.count("/"), reverse=True)

    # ----- the Storage protocol ----------------------------------------------------------

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def read(self, path: str, on_chunk: OnChunk | None = None, limit: int | None = None) -> bytes:
        return self.inner.read(path, on_chunk, limit)

    def list(self, path: str) -> list[str]:
        return self.inner.list(path)

    def write(self, path: str, data: bytes, durable: bool = True) -> None:
        self._issued = self._clock()
        self.inner.write(path, data, durable=durable)
        path = _norm(path)
        if path not in self.ids:
            self.ids[path] = self._new(False)
            self._add("create", path, inode=self.ids[path], **self._entry(path))
        self._add("data", path, inode=self.ids[path], data=bytes(data))
        if durable:
            self._add("fsync_file", path, inode=self.ids[path])

    def write_stream(self, path: str, produce: Produce, durable: bool = True) -> int:
        # The model needs the file's bytes (a crash state may keep them), so gather them.
        data = gather(produce)
        self.write(path, data, durable=durable)
        return len(data)

    def mkdir(self, path: str) -> None:
        self._issued = self._clock()
        self.inner.mkdir(path)
        parts = _norm(path).split("/")
        for depth in range(1, len(parts) + 1):  # mkdir -p: each missing ancestor is created
            here = "/".join(parts[:depth])
            if here not in self.ids:
                self.ids[here] = self._new(True)
                self._add("mkdir", here, inode=self.ids[here], **self._entry(here))

    def rename(self, src: str, dst: str) -> None:
        self._issued = self._clock()
        self.inner.rename(src, dst)
        src, dst = _norm(src), _norm(dst)
        if src == dst:
            return  # renaming an entry onto itself changes nothing, on disk or here
        moved = self._subtree(src)
        entry = self._entry(dst)
        self._add("rename", src, inode=self.ids[src], **self._entry(src), dst=dst,
                  dst_parent=entry["parent"], dst_name=entry["name"])
        for p in self._subtree(dst):
            del self.ids[p]
        for p in moved:
            self.ids[dst + p[len(src):]] = self.ids.pop(p)

    def fsync_dir(self, path: str) -> None:
        self._issued = self._clock()
        self.inner.fsync_dir(path)
        path = _norm(path)
        self._add("fsync_dir", path, inode=self.ids[path])

    def remove(self, path: str) -> None:
        self._issued = self._clock()
        self.inner.remove(path)
        for p in self._subtree(_norm(path)):
            self._add("unlink", p, inode=self.ids[p], **self._entry(p))
            del self.ids[p]


OPS_DIR = "powerloss"
"""RUN_DIR/powerloss/: the in-rank recording (ops-aNNN.jsonl) and the written data (blobs/SHA256)."""


def store_blob(blobs: Path, data: bytes) -> str:
    """Keep `data` once in `blobs`, named by its sha256 (returned). Written under a private
    name and renamed, so two ranks storing the same content never see half of it."""
    digest = hashlib.sha256(data).hexdigest()
    target = Path(blobs) / digest
    if not target.exists():
        scratch = target.with_name(f".{digest}.{os.getpid()}")
        scratch.write_bytes(data)
        os.replace(scratch, target)
    return digest


class ShippedRecorder(PowerLossRecorder):
    """A PowerLossRecorder that appends every op to a JSON-lines file as it happens, the
    data kept once per content in a side file: a real job's saves, all of them, recorded
    from inside the rank (through `recording_hooks`) for the power-loss sweep to replay."""

    def __init__(self, inner: Storage, root: Path, out: Path) -> None:
        super().__init__(inner, root)
        self.out = Path(out)
        self.blobs = self.out.parent / "blobs"

    def start(self) -> None:
        super().start()
        self.blobs.mkdir(parents=True, exist_ok=True)
        before = {p: (None if c is None else self._blob(c)) for p, c in self.log.before.items()}
        self._line({"before": before, "ids": self.log.ids})

    def _blob(self, data: bytes) -> str:
        return store_blob(self.blobs, data)

    def _logged(self, op: LowOp) -> None:
        fields = {k: v for k, v in vars(op).items() if k != "data"}
        fields["data"] = self._blob(op.data) if op.kind == "data" else None
        self._line(fields)

    def _line(self, record: dict[str, Any]) -> None:
        with self.out.open("a") as f:  # one line per op, written before the next op is issued
            f.write(json.dumps(record) + "\n")


class RecordingHooks(NoHooks):
    """Hooks that only record rank 0's storage ops (the writer of every checkpoint) into
    RUN_DIR/powerloss/ops-aNNN.jsonl; a JobSpec selects them with `hooks_factory`."""

    def __init__(self, plan: list[dict[str, Any]]) -> None:
        if plan:
            raise ValueError("recording_hooks records a clean run: give it an empty plan")
        self.rank, self.attempt = -1, -1
        self.run: RunDir | None = None

    def bind(self, events: Any, rank: int, world_size: int, attempt: int) -> None:
        self.rank, self.attempt, self.run = rank, attempt, RunDir.of_events_file(events.path)

    def wrap_storage(self, storage: Storage) -> Storage:
        if self.rank != 0 or self.run is None:
            return storage
        out = self.run.root / OPS_DIR / f"ops-a{self.attempt:03d}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        recorder = ShippedRecorder(storage, self.run.checkpoints, out)
        recorder.start()
        return recorder  # type: ignore[return-value]


def recording_hooks(plan: list[dict[str, Any]]) -> RecordingHooks:
    """The `hooks_factory` of the power-loss sweep's observed run."""
    return RecordingHooks(plan)


def load_oplog(path: Path) -> OpLog:
    """Read a ShippedRecorder's file back into an OpLog (data from the blobs beside it)."""
    blobs = Path(path).parent / "blobs"
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines or "before" not in lines[0]:
        raise ValueError(f"{path} is not a power-loss recording: its first line must hold 'before'")
    head = lines[0]
    before = {p: (None if h is None else (blobs / h).read_bytes()) for p, h in head["before"].items()}
    log = OpLog(before, dict(head["ids"]))
    for record in lines[1:]:
        digest = record.pop("data")
        data = (blobs / digest).read_bytes() if digest else b""
        log.ops.append(LowOp(**record, data=data))
    return log


# ----- 2. the crash states -----------------------------------------------------------------


@dataclass(frozen=True)
class CrashState:
    """What the disk holds after the power is cut once the first `point` ops were issued."""

    point: int
    ops: tuple[LowOp, ...]
    """The ops issued before the cut (the log's prefix)."""
    persisted: frozenset[int]
    """Indices of the entry ops and (last) data writes the model let persist in full."""
    torn: tuple[tuple[int, int], ...]
    """(data op index, blocks persisted) for data torn at block granularity."""
    tree: Tree
    digest: str
    damage: tuple[str, ...] = ()
    """What differs from the disk had every issued op persisted, path by path, in words."""

    @property
    def kept(self) -> list[str]:
        return [o.describe() for o in self.ops if o.index in self.persisted]

    @property
    def lost(self) -> list[str]:
        torn = {i for i, _ in self.torn}
        return [o.describe() for o in _stateful(self.ops) if o.index not in self.persisted and o.index not in torn]

    @property
    def torn_ops(self) -> list[str]:
        return [f"{self.ops[i].describe()}: {blocks} of {_blocks(self.ops[i])} blocks persisted"
                for i, blocks in self.torn]

    def describe(self) -> str:
        last = self.ops[-1].describe() if self.ops else "nothing"
        lost = "; ".join(self.lost) or "nothing"
        torn = "; ".join(self.torn_ops) or "nothing"
        return f"power cut after op {self.point} ({last}): lost {lost}; torn {torn}"

    def in_words(self) -> str:
        """The state for a reader: where the power failed and what the disk holds that the
        writer did not intend (not every lost op, only the files it changed)."""
        last = self.ops[-1].describe() if self.ops else "before the first op"
        where = f"the power failed right after op {self.point}, {last}"
        if not self.damage:
            return f"{where}; the disk holds everything issued so far"
        return f"{where}; on disk " + "; ".join(self.damage)


@dataclass
class Stats:
    crash_points: int = 0
    sampled_points: int = 0
    """Crash points with more combinations than the cap, sampled with the seed."""
    generated: int = 0
    duplicates: int = 0
    explored: int = 0

    def describe(self) -> str:
        return (f"{self.crash_points} crash points ({self.sampled_points} sampled): {self.generated} states "
                f"generated, {self.duplicates} duplicates removed, {self.explored} explored")


def _blocks(op: LowOp) -> int:
    return max(1, -(-len(op.data) // BLOCK))


def _last_data(ops: tuple[LowOp, ...]) -> dict[int, LowOp]:
    """Each file's last data write (every write replaces the file, so earlier ones do not matter)."""
    return {o.inode: o for o in ops if o.kind == "data"}


def _stateful(ops: tuple[LowOp, ...]) -> list[LowOp]:
    """The ops that change what the disk holds: entry ops and each file's last write."""
    last = {o.index for o in _last_data(ops).values()}
    return [o for o in ops if o.kind in ENTRY_KINDS or o.index in last]


def synced(ops: tuple[LowOp, ...]) -> set[int]:
    """Rule 1: the ops a later barrier in `ops` makes durable."""
    out = set()
    for op in _stateful(ops):
        later = ops[op.index + 1:]
        if op.kind == "data":
            if any(b.kind == "fsync_file" and b.inode == op.inode for b in later):
                out.add(op.index)
        elif any(b.kind == "fsync_dir" and b.inode == op.group for b in later):
            out.add(op.index)
    return out


def _unsynced_groups(ops: tuple[LowOp, ...], durable: set[int]) -> list[list[int]]:
    """Rule 3: each directory's unsynced entry ops, in order (they persist as a prefix)."""
    groups: dict[int, list[int]] = {}
    for op in ops:
        if op.kind in ENTRY_KINDS and op.index not in durable:
            groups.setdefault(op.group, []).append(op.index)
    return [groups[g] for g in sorted(groups)]


def _namespace(log: OpLog, ops: tuple[LowOp, ...], persisted: set[int]) -> dict[str, int]:
    """Rule 5: apply the persisted entry ops in order, by identity; the visible paths."""
    dirs: dict[int, dict[str, int]] = {ROOT: {}}
    for path in sorted(log.ids, key=lambda p: p.count("/")):
        if path != ".":
            dirs[log.ids[_parent_path(path)]][path.rsplit("/", 1)[-1]] = log.ids[path]
            if log.before[path] is None:
                dirs[log.ids[path]] = {}
    for op in ops:
        if op.index in persisted and op.kind == "rename" and op.parent == OUTSIDE:
            if op.dst_parent in dirs:  # moved in from outside the root: only the entry is new
                dirs[op.dst_parent][op.dst_name] = op.inode
            continue
        if op.index not in persisted or op.kind not in ENTRY_KINDS or op.parent not in dirs:
            continue  # lost, or inside a directory whose creation was lost
        children = dirs[op.parent]
        if op.kind in ("create", "mkdir"):
            children[op.name] = op.inode
            if op.kind == "mkdir":
                dirs.setdefault(op.inode, {})
        elif children.get(op.name) == op.inode and (op.kind == "unlink" or op.dst_parent in dirs):
            del children[op.name]
            if op.kind == "rename":
                dirs[op.dst_parent][op.dst_name] = op.inode
    visible: dict[str, int] = {}
    todo = [("", ROOT)]
    while todo:
        prefix, inode = todo.pop()
        for name, child in dirs[inode].items():
            visible[prefix + name] = child
            if child in dirs:
                todo.append((prefix + name + "/", child))
    return visible


def _data_options(op: LowOp, renamed_after: bool) -> list[int]:
    """Rules 2 and 4: blocks of an unsynced write that persist (-1 = all of it, 0 = none)."""
    if renamed_after:
        return [-1]
    return [-1, 0] + list(range(1, _blocks(op)))


def _content(op: LowOp, blocks: int) -> bytes:
    return op.data if blocks == -1 else op.data[: blocks * BLOCK]


def _tree(visible: dict[str, int], contents: dict[int, bytes]) -> Tree:
    dirs = {i for i in visible.values() if i not in contents}
    return {p: (None if i in dirs else contents[i]) for p, i in visible.items()}


def _damage(intended: Tree, tree: Tree) -> tuple[str, ...]:
    """Each path whose state differs from the intended tree, in words."""
    out: list[str] = []
    reported: list[str] = []  # a missing or leftover directory speaks for everything inside it
    for path in sorted(set(intended) | set(tree)):
        want, got = intended.get(path, b""), tree.get(path, b"")
        if any(path.startswith(d + "/") for d in reported):
            continue
        if (path in tree) != (path in intended):
            reported.append(path)
        if path not in tree:
            out.append(f"{path} is missing")
        elif path not in intended:
            out.append(f"{path} is still there (its unlink or rename was lost)")
        elif want is None or got is None or want == got:
            continue
        elif not got:
            out.append(f"{path} is empty (its {len(want)} bytes were never made durable)")
        elif want.startswith(got):
            out.append(f"{path} holds only its first {len(got)} of {len(want)} bytes")
        else:
            out.append(f"{path} holds content other than its last write ({len(got)} bytes)")
    return tuple(out)


def _digest(tree: Tree) -> str:
    h = hashlib.sha256()
    for path in sorted(tree):
        content = tree[path]
        h.update(path.encode() + (b"/D" if content is None else b"/F" + hashlib.sha256(content).digest()))
    return h.hexdigest()


class _Point:
    """One crash point: the choices the model leaves open, and the state each gives."""

    def __init__(self, log: OpLog, n: int) -> None:
        self.log, self.n = log, n
        self.ops = tuple(log.ops[:n])
        self.durable = synced(self.ops)
        self.groups = _unsynced_groups(self.ops, self.durable)
        self.writes = _last_data(self.ops)
        self.unsynced = [w for w in self.writes.values() if w.index not in self.durable]

    def bound(self) -> int:
        combos = 1
        for g in self.groups:
            combos *= len(g) + 1
        for w in self.unsynced:
            combos *= len(_data_options(w, False))
        return combos

    def entry_choices(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*[range(len(g) + 1) for g in self.groups])

    def persisted_entries(self, prefixes: tuple[int, ...]) -> set[int]:
        chosen = {i for i in self.durable if self.ops[i].kind in ENTRY_KINDS}
        for group, k in zip(self.groups, prefixes):
            chosen.update(group[:k])
        return chosen

    def data_dims(self, entries: set[int], visible: dict[str, int]) -> list[tuple[LowOp, list[int]]]:
        shown = set(visible.values())
        dims = []
        for w in self.unsynced:
            if w.inode in shown:
                renamed = any(self.ops[i].kind == "rename" and self.ops[i].inode == w.inode and i > w.index
                              for i in entries)
                dims.append((w, _data_options(w, renamed)))
        return dims

    def state(self, entries: set[int], visible: dict[str, int], picks: list[tuple[LowOp, int]],
              compare: bool = True) -> CrashState:
        contents = {i: c for p, i in self.log.ids.items() if (c := self.log.before.get(p)) is not None}
        persisted = set(entries)
        for w in self.writes.values():
            contents[w.inode] = w.data
            if w.index in self.durable:
                persisted.add(w.index)
        for op in self.ops:  # a created file whose data was not yet written is empty
            if op.kind == "create" and op.inode not in self.writes:
                contents[op.inode] = b""
        torn = []
        for w, blocks in picks:
            contents[w.inode] = _content(w, blocks)
            if blocks == -1:
                persisted.add(w.index)
            elif blocks > 0:
                torn.append((w.index, blocks))
        tree = _tree(visible, contents)
        return CrashState(self.n, self.ops, frozenset(persisted), tuple(torn), tree, _digest(tree),
                          _damage(self.intended(), tree) if compare else ())

    def all_entries(self) -> set[int]:
        return {o.index for o in self.ops if o.kind in ENTRY_KINDS}

    def intended(self) -> Tree:
        """The tree had every issued op persisted (what the writer meant the disk to hold)."""
        if not hasattr(self, "_intended"):
            entries = self.all_entries()
            visible = _namespace(self.log, self.ops, entries)
            full = [(w, -1) for w, _ in self.data_dims(entries, visible)]
            self._intended = self.state(entries, visible, full, compare=False).tree
        return self._intended

    def every(self) -> Iterator[CrashState]:
        for prefixes in self.entry_choices():
            entries = self.persisted_entries(prefixes)
            visible = _namespace(self.log, self.ops, entries)
            dims = self.data_dims(entries, visible)
            for blocks in itertools.product(*[options for _, options in dims]):
                yield self.state(entries, visible, [(w, b) for (w, _), b in zip(dims, blocks)])

    def sample(self, rng: random.Random, count: int) -> Iterator[CrashState]:
        for _ in range(count):
            entries = self.persisted_entries(tuple(rng.randrange(len(g) + 1) for g in self.groups))
            visible = _namespace(self.log, self.ops, entries)
            dims = self.data_dims(entries, visible)
            yield self.state(entries, visible, [(w, rng.choice(options)) for w, options in dims])


def states_at(log: OpLog, point: int, seed: int = 0, cap: int = 64) -> list[CrashState]:
    """The distinct states of one crash point (after the first `point` ops)."""
    states, _ = _explore(log, [point], seed, cap)
    return states


def issued_state(log: OpLog, point: int) -> CrashState:
    """The state of crash point `point` in which every issued op reached the disk: what a
    process crash there leaves (a control beside the states a power cut adds)."""
    at = _Point(log, point)
    entries = at.all_entries()
    visible = _namespace(log, at.ops, entries)
    return at.state(entries, visible, [(w, -1) for w, _ in at.data_dims(entries, visible)])


Epoch = Callable[[int], object]
"""crash point -> what the observer had seen by then (e.g. how many events were logged):
two states are the same only with the same tree *and* the same epoch, because one disk
judged against a log that announced a save is not the state it is against one that did not."""


def crash_states(log: OpLog, seed: int = 0, cap: int = 64,
                 epoch: Epoch | None = None) -> tuple[list[CrashState], Stats]:
    """Every state the model allows at every crash point (after 0..len(ops) ops), deduplicated
    by the materialised tree; a crash point with more than `cap` combinations is sampled
    `cap` times with `seed` instead of enumerated."""
    return _explore(log, range(len(log.ops) + 1), seed, cap, epoch)


def _explore(log: OpLog, points: Iterable[int], seed: int, cap: int,
             epoch: Epoch | None = None) -> tuple[list[CrashState], Stats]:
    if cap < 1:
        raise ValueError(f"cap={cap} explores nothing: use a cap of at least 1")
    rng = random.Random(seed)
    stats = Stats()
    seen: set[tuple[str, object]] = set()
    out: list[CrashState] = []
    for n in points:
        point = _Point(log, n)
        stats.crash_points += 1
        if point.bound() > cap:
            stats.sampled_points += 1
            states = point.sample(rng, cap)
        else:
            states = point.every()
        for state in states:
            stats.generated += 1
            key = (state.digest, epoch(state.point) if epoch else None)
            if key in seen:
                stats.duplicates += 1
                continue
            seen.add(key)
            out.append(state)
    stats.explored = len(out)
    return out, stats


# ----- 3. materialising ----------------------------------------------------------------------


def materialise(state: CrashState | Tree, root: Path) -> Path:
    """Write the state's tree into `root` (created; must be empty): the disk after the cut."""
    tree = state.tree if isinstance(state, CrashState) else state
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: materialise a crash state into a fresh directory")
    for path in sorted(tree, key=lambda p: p.count("/")):
        target = root / check_relative(path)  # a recorded path never leaves the root
        content = tree[path]
        if content is None:
            target.mkdir()
        else:
            target.write_bytes(content)
    return root


# ----- recording a writer's real save ------------------------------------------------------


def record_save(writer: str = "reference", step: int | None = None) -> OpLog:
    """The low-level ops of the writer's save at `step` (faults/sweep.py CRASH_STEP), after
    the job's earlier saves, which form the durable state before it: the same replay as the
    crash-point sweep's recording, through a PowerLossRecorder."""
    from trainwreck.faults.sweep import CRASH_STEP, replay_saves

    recorders: list[PowerLossRecorder] = []

    def wrap(inner: Storage, root: Path) -> Storage:
        recorders.append(PowerLossRecorder(inner, root))
        return recorders[-1]

    # What the earlier saves left is the durable state before the recorded one.
    replay_saves(writer, wrap, lambda storage: storage.start(), CRASH_STEP if step is None else step)  # type: ignore[attr-defined]
    return recorders[0].log


# ----- DCP's own commit, recorded through the same recorder ------------------------------

DCP_DIR = "dcp-step-00000016"
DCP_EARLIER = "dcp-step-00000008"
"""The recorded DCP save, and the earlier one already durable before it."""


def dcp_state_dict(step: int) -> dict[str, Any]:
    """A small model-and-optimizer-shaped state whose values name the step (a mix-up shows)."""
    import torch

    return {"model.weight": torch.full((64, 32), float(step)), "model.bias": torch.arange(32.0) + step,
            "step": torch.tensor(step)}


def dcp_save(storage: Storage, root: Path, name: str, step: int) -> None:
    """DCP's own save (FileSystemWriter, commit by renaming .metadata.tmp), in-process, no_dist."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    writer = FileSystemWriter(str(Path(root) / name))
    writer.fs = storage_fs(storage, Path(root), writer.sync_files)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(dcp_state_dict(step), storage_writer=writer, no_dist=True)


def record_dcp_save(root: Path) -> OpLog:
    """The ops of DCP's save of DCP_DIR, after an earlier save (DCP_EARLIER) made durable."""
    from trainwreck.trainer.storage import LocalStorage

    local = LocalStorage(Path(root))
    dcp_save(local, Path(root), DCP_EARLIER, 8)
    os.sync()  # the earlier save is the durable state the recorded one starts from
    recorder = PowerLossRecorder(local, Path(root))
    recorder.start()
    dcp_save(recorder, Path(root), DCP_DIR, 16)  # type: ignore[arg-type]
    return recorder.log


def dcp_loads(root: Path, name: str, step: int) -> str | None:
    """None when checkpoint `name` under `root` loads with step's values; else why not."""
    import torch
    import torch.distributed.checkpoint as dcp

    if not (Path(root) / name / ".metadata").is_file():
        return f"{name}/.metadata is missing"
    want = dcp_state_dict(step)
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(got, checkpoint_id=str(Path(root) / name), no_dist=True)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - any failure to load is the finding
        # (CheckpointException, DCP's wrapper of a failed read, is a BaseException)
        failures = getattr(exc, "failures", None)  # CheckpointException: rank -> (exception, traceback)
        cause = exc if not failures else next(iter(failures.values()))
        cause = cause[0] if isinstance(cause, tuple) and cause else cause
        return f"{name} does not load: {type(cause).__name__}: {(str(cause).splitlines() or [''])[0][:160]}"
    wrong = [k for k in want if not torch.equal(want[k], got[k])]
    return f"{name} loads other values for {', '.join(wrong)}" if wrong else None


def judge_dcp_state(state: CrashState, complete: bool, scratch: Path) -> tuple[bool, str]:
    """(valid, why) for one crash state of DCP's save: the earlier checkpoint always loads;
    a checkpoint whose .metadata is present loads with its own values; and once dcp.save
    returned (`complete`: the caller announces the checkpoint), the new one loads."""
    root = materialise(state, scratch)
    problem = dcp_loads(root, DCP_EARLIER, 8)
    if problem is None and (complete or (root / DCP_DIR / ".metadata").exists()):
        problem = dcp_loads(root, DCP_DIR, 16)
        if problem and complete:
            problem = f"dcp.save had returned, but {problem}"
    return problem is None, problem or "both checkpoints load as written"
