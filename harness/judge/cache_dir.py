"""Where golden runs are cached, and whether that folder can be used: torch-free, so that a command
line refuses a cache it cannot write (a file in its place, a read-only mount) before it imports
torch or starts a fork server (5-6 s here), as it refuses any other bad input."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainwreck.harness.errors import SpecError
from trainwreck.harness.launch.torchcache import user_cache_dir

CACHE_ENV = "TRAINWRECK_GOLDEN_CACHE"


def default_cache_dir() -> Path:
    """$TRAINWRECK_GOLDEN_CACHE, else the user's cache folder by the XDG rule
    ($XDG_CACHE_HOME/trainwreck/golden, else ~/.cache/trainwreck/golden: `user_cache_dir`)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    path = user_cache_dir("golden")
    if path is None:
        raise SpecError(f"$HOME is {os.environ.get('HOME', '')!r} and the account has no home folder, so the golden "
                        f"cache has no place: set {CACHE_ENV} to a writable folder")
    return path


def ensure_cache_dir(cache_dir: Path) -> None:
    """Create the cache folder and prove it writable with a real write (root passes every
    permission check, a read-only mount or a file in its place does not); SpecError (exit 2,
    one line) when it cannot be used, before any golden run starts."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=cache_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise SpecError(f"the golden cache {cache_dir} cannot be used ({exc.strerror or exc}): free or fix it, "
                        f"or set {CACHE_ENV} to a writable folder") from None


def usable_cache_dir() -> Path:
    """The default cache folder, made and proven writable: what a command line that judges against
    golden runs checks first (SpecError, exit 2, naming the folder and the fix)."""
    folder = default_cache_dir()
    ensure_cache_dir(folder)
    return folder
