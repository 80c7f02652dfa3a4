"""Golden runs: an uninterrupted run of a spec, cached by a hash of what shapes it.

The job's target (harness/supervise/spec.py) names the entry and builds the uninterrupted job:
for the reference trainer the key covers the trainer config, the world size and the
trainer's source code; for a user's command, the command line, the files it names and
imports, and the installed versions (harness/supervise/command/golden_key.py). So
a cached golden run is reused across scenarios, test sessions and CLI calls, and is
recomputed as soon as anything that could change its digests changes.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil

from trainwreck.harness.errors import GoldenFailed, SpecError
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.rundir import files
from trainwreck.trainer.config import TrainConfig
from trainwreck.rundir.layout import RunDir, iter_events
from trainwreck.harness.judge.cache_dir import CACHE_ENV, default_cache_dir, ensure_cache_dir

MANIFEST = "golden.json"
"""sha256 of every file the judge reads (run.json, events/*.jsonl), written last before publishing."""
BUILD_PREFIX = ".build-"


def golden_run(cfg: TrainConfig, world_size: int, cache_dir: Path | None = None) -> Path:
    """The run directory of an uninterrupted run of the reference trainer with `cfg` on
    `world_size` ranks (cached; the default launcher, as every golden run)."""
    return golden_for(JobSpec(config=cfg, world_sizes=(world_size,)), cache_dir)


def golden_for(spec: JobSpec, cache_dir: Path | None = None, fresh: bool = False) -> Path:
    """The run directory of the uninterrupted run `spec` is judged against (cached);
    GoldenFailed (a RuntimeError) when that run fails. `fresh`: rebuilt even when intact.

    An entry whose files no longer match its manifest (truncated, deleted, edited) is
    rebuilt and replaced: returning it would judge every later run against damage.
    """
    cache_dir = cache_dir or default_cache_dir()
    final = cache_dir / spec.target.golden_name(spec)
    if not fresh and _intact(final):
        return final
    ensure_cache_dir(cache_dir)
    remove_stale_builds(cache_dir)
    # Build beside the cache entry, then rename: concurrent xdist workers racing for the
    # same key each build their own and the first to publish wins; nobody reads a half run.
    scratch = cache_dir / _build_name(final.name)
    try:
        record = run_job(spec.target.golden_spec(spec, scratch))
        failure = spec.target.golden_failure(record)
        if failure is not None:
            raise GoldenFailed(failure)
        _repeat(spec, scratch, final, record.wall_s)
        _write_manifest(scratch)
        if fresh:
            discard(final)
        _publish(scratch, final)
    except OSError as exc:  # the disk filled or the folder turned read-only while the entry was written
        if not files.is_environment_failure(exc):
            raise
        shutil.rmtree(scratch, ignore_errors=True)
        raise SpecError(f"the golden cache could not be written: {files.describe(exc)}; "
                        f"or set {CACHE_ENV} to another folder") from None
    return final


def adopt(unpack: Callable[[Path], None], cache_dir: Path, key: str) -> Path:
    """The cache entry `key`, installed from a golden run built elsewhere (another node of
    a Ray campaign) unless an intact one is already here: `unpack(scratch)` writes its
    files, which must match their own manifest, and it is published like a local build."""
    final = cache_dir / key
    if _intact(final):
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = cache_dir / _build_name(key)
    unpack(scratch)
    if not _intact(scratch):
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(f"the golden run {key} received from another node does not match its manifest")
    _publish(scratch, final)
    return final


def _repeat(spec: JobSpec, scratch: Path, final: Path, golden_s: float) -> None:
    """The target's repeat job (a user's command: its first updates once more), compared with the
    golden run just built; the finding is stored beside it (harness/supervise/command/repeat.py)."""
    from trainwreck.harness.supervise.command.repeat import record_repeat

    repeat = spec.target.repeat_spec(spec, final.parent / _build_name(f"{final.name}-repeat"))
    if repeat is None:
        return
    started = time.monotonic()
    try:
        run_job(repeat)
        record_repeat(scratch, Path(repeat.run_dir), golden_s, time.monotonic() - started)
    finally:
        shutil.rmtree(repeat.run_dir, ignore_errors=True)


def discard(entry: Path) -> None:
    """Remove a cached golden run (`--fresh-golden`): renamed aside under the cache's lock first,
    so a concurrent reader never sees half of it, and never followed if it is a link."""
    if not entry.exists() and not entry.is_symlink():
        return
    with open(entry.parent / f".lock-{entry.name}", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not entry.exists() and not entry.is_symlink():
            return
        doomed = entry.parent / _build_name(entry.name)
        os.rename(entry, doomed)
    if doomed.is_symlink():
        doomed.unlink()
    else:
        shutil.rmtree(doomed, ignore_errors=True)


def _publish(scratch: Path, final: Path) -> None:
    """Move `scratch` to `final`, replacing a damaged entry but never an intact one."""
    with open(final.parent / f".lock-{final.name}", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # check-and-replace is one step for concurrent builders
        if _intact(final):  # another process published meanwhile
            shutil.rmtree(scratch, ignore_errors=True)
            return
        if final.exists():
            # Renamed aside under a build name first, so a kill mid-replace leaves only
            # something remove_stale_builds sweeps up.
            doomed = final.parent / _build_name(final.name)
            os.rename(final, doomed)
            if doomed.is_symlink():
                doomed.unlink()  # never follow a link out of the cache
            else:
                shutil.rmtree(doomed, ignore_errors=True)
        os.rename(scratch, final)


def _build_name(key: str) -> str:
    # Owner pid and its start time: a dead owner's build is garbage, and a reused pid
    # (a different start time) does not keep it alive.
    me = psutil.Process()
    return f"{BUILD_PREFIX}{key}-{me.pid}-{int(me.create_time() * 1000)}-{uuid.uuid4().hex[:6]}"


def _owner_alive(name: str) -> bool:
    parts = name.split("-")
    try:
        if len(parts) == 3:  # `.build-KEY-PID` from before start times were recorded
            return psutil.pid_exists(int(parts[2]))
        pid, started_ms = int(parts[-3]), int(parts[-2])
        return int(psutil.Process(pid).create_time() * 1000) == started_ms
    except (IndexError, ValueError):
        return True  # not a name we made: leave it alone
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def remove_stale_builds(cache_dir: Path) -> list[str]:
    """Delete `.build-*` directories whose owner process is gone (a harness killed mid-build).

    A live owner's build is never touched: concurrent sessions share the cache.
    """
    removed = []
    for path in cache_dir.glob(f"{BUILD_PREFIX}*"):
        if path.is_dir() and not path.is_symlink() and not _owner_alive(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def _judged_files(run_dir: Path) -> list[Path]:
    paths = RunDir(run_dir)
    return [paths.run_json, *sorted(paths.events.glob("*.jsonl"))]


def _digest(path: Path) -> str:
    """sha256 of a judged file: a regular file inside its entry, bounded, never a blocking open."""
    return hashlib.sha256(files.read_bytes(path, files.EVENTS_LIMIT, root=path.parent)).hexdigest()


def _write_manifest(run_dir: Path) -> None:
    digests = {str(p.relative_to(run_dir)): _digest(p) for p in _judged_files(run_dir)}
    files.write_atomic(run_dir / MANIFEST, json.dumps(digests, sort_keys=True, indent=1), root=run_dir)


def _intact(run_dir: Path) -> bool:
    """A completed entry whose judged files are exactly those its manifest lists, unchanged."""
    try:
        if run_dir.is_symlink() or not run_dir.is_dir():
            return False
        manifest = files.read_json(run_dir / MANIFEST, files.SMALL_LIMIT, root=run_dir)
        present = {str(p.relative_to(run_dir)): p for p in _judged_files(run_dir) if p.is_file()}
        if not isinstance(manifest, dict) or set(manifest) != set(present):
            return False
        if any(p.is_symlink() or _digest(p) != manifest[name] for name, p in present.items()):
            return False
    except (OSError, ValueError, RecursionError):
        return False  # damaged (a FIFO, a giant, bad JSON): rebuilt, never waited on
    return _completed(run_dir)


def _completed(run_dir: Path) -> bool:
    return any(e.get("kind") == "end" and e.get("status") == "completed" for e in iter_events(run_dir, batches=False))
