"""torch's compile cache, kept out of $TMPDIR.

Importing torch._dynamo (an optimizer's first step does) creates torch's inductor cache,
by default `$TMPDIR/torchinductor_<user>`, whether or not anything is compiled: every run
left that folder behind although nothing of a run belongs in $TMPDIR. The harness points
`TORCHINDUCTOR_CACHE_DIR` at the user's cache instead (beside the golden runs, by the same
XDG rule) before anything imports torch; ranks, the fork server and --cmd commands inherit
it. A value the user set is kept.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "TORCHINDUCTOR_CACHE_DIR"


def user_cache_dir(name: str) -> Path | None:
    """$XDG_CACHE_HOME/trainwreck/NAME, else ~/.cache/trainwreck/NAME (the golden runs' cache and
    torch's compile cache alike). Only absolute folders count (the XDG rule): an empty or relative
    $HOME must not put a cache at /.cache or under whatever folder a command runs in; None when
    neither $HOME nor the password database gives one."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "trainwreck" / name
    home = os.environ.get("HOME", "")
    if not os.path.isabs(home) or home == "/":
        home = _account_home()
    return Path(home) / ".cache" / "trainwreck" / name if home else None


def torch_cache_dir() -> Path | None:
    """Where torch's inductor cache goes (None: torch's default stands)."""
    return user_cache_dir("torchinductor")


def _account_home() -> str:
    import pwd

    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return ""
    return home if os.path.isabs(home) and home != "/" else ""


def keep_torch_cache_out_of_tmp() -> None:
    """Set TORCHINDUCTOR_CACHE_DIR for this process and its children unless it is set."""
    if not os.environ.get(ENV):
        path = torch_cache_dir()
        if path is not None:
            os.environ[ENV] = str(path)
