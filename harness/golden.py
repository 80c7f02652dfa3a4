"""Golden runs: an uninterrupted run of a spec, cached by a hash of what shapes it.

The key covers the trainer config, the world size and the trainer's source code, so
a cached golden run is reused across scenarios, test sessions and CLI calls, and is
recomputed as soon as anything that could change its digests changes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from trainwreck import trainer
from trainwreck.harness.spec import JobSpec
from trainwreck.harness.restarts import iter_events
from trainwreck.harness.supervisor import run_job
from trainwreck.trainer.config import TrainConfig

CACHE_ENV = "TRAINWRECK_GOLDEN_CACHE"


def default_cache_dir() -> Path:
    if CACHE_ENV in os.environ:
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "trainwreck" / "golden"


def _trainer_source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(Path(trainer.__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def golden_key(cfg: TrainConfig, world_size: int) -> str:
    payload = json.dumps({"config": cfg.to_dict(), "world_size": world_size,
                          "trainer": _trainer_source_hash()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def golden_run(cfg: TrainConfig, world_size: int, cache_dir: Path | None = None,
               launcher: str = "warm") -> Path:
    """The run directory of an uninterrupted run of `cfg` on `world_size` ranks (cached)."""
    cache_dir = cache_dir or default_cache_dir()
    final = cache_dir / golden_key(cfg, world_size)
    if (final / "run.json").exists() and _completed(final):
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Build beside the cache entry, then rename: concurrent xdist workers racing for the
    # same key each build their own and the first rename wins; nobody reads a half run.
    scratch = cache_dir / f".build-{final.name}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    record = run_job(JobSpec(config=cfg, world_sizes=(world_size,), run_dir=scratch, keep=True,
                             launcher=launcher, max_restarts=0))
    if record.status != "completed":
        raise RuntimeError(f"the golden run failed ({record.outcome}); see {scratch}")
    try:
        os.rename(scratch, final)
    except OSError:  # another process published the same key first
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def _completed(run_dir: Path) -> bool:
    return any(e.get("kind") == "end" and e.get("status") == "completed" for e in iter_events(run_dir))
