"""Process helpers every launcher and supervisor shares: signalling what we started, and
tying a child's life to its parent's.

Kept free of torch and of the rest of the harness, so a rank, the fork server and an
elastic agent's pre-exec hook can all use it."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when its parent dies."""


def set_parent_death_signal(expected_parent: int | None = None) -> None:
    """Die with SIGKILL when the parent dies, so a killed harness leaves no orphans (Linux).

    Also safe as a `preexec_fn` (between fork and exec): the setting survives exec."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # The parent may have died before prctl took effect; then nobody would kill us.
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def signal_pid(pid: int, sig: int) -> None:
    """Send `sig` to a pid we started; one that already exited is not an error."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to a process group we created; a group that is already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # PermissionError: the group id was reused
        pass
