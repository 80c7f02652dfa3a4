"""Process helpers every launcher and supervisor shares: the environment and process group a
child starts with, signalling what we started, and tying a child's life to its parent's.

Kept free of torch and of the rest of the harness, so a rank, the fork server and an
elastic agent's pre-exec hook can all use it."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when its parent dies."""
REPO_ROOT = str(Path(__file__).resolve().parents[2])
"""This checkout: put on a child's PYTHONPATH so its ranks import the same trainwreck."""


def child_env() -> dict[str, str]:
    """The environment of every process the harness starts (ranks, the fork server, torchrun's
    agent, torchft's lighthouse): the harness's own, with this checkout importable, one
    OpenMP thread (ranks share a few cores) and gloo on loopback."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if REPO_ROOT not in paths:
        env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, *paths])
    env.setdefault("OMP_NUM_THREADS", "1")
    # Every job the harness starts is single-host: gloo's pair listeners would otherwise
    # bind the address the hostname resolves to (often a routable one). setdefault keeps
    # an explicit choice (multi-host: the routable interface) working.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def process_group_kwargs(pgid: int, preexec: Callable[[], None] | None = None) -> dict[str, Any]:
    """`subprocess.Popen` arguments that put the child into process group `pgid` (0: a new group
    it leads), so one killpg ends an attempt or a replica group, and run `preexec` in the child
    before exec. Python < 3.11 has no `process_group` argument, so there one `preexec_fn` does
    both: a caller passing its own `preexec_fn` too would get "multiple values" there."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid, **({"preexec_fn": preexec} if preexec else {})}

    def join_then_run() -> None:
        os.setpgid(0, pgid)
        if preexec is not None:
            preexec()
    return {"preexec_fn": join_then_run}


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


def thread_count() -> int:
    """Threads of this process (any library thread, not only Python's): more than one makes a fork unsafe."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def one_openmp_thread() -> None:
    """OMP_NUM_THREADS=1 for this process, before it imports torch (the CLI's dispatcher): unset,
    torch's import (and numpy's OpenBLAS) starts a second thread, which makes forking a server
    from this process unsafe (`forkable_here`). The harness trains nothing itself, and every
    child gets this value anyway (`child_env`); a value the user set is kept."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def forkable_here() -> bool:
    """Whether this process may fork a server from itself: Linux (elsewhere no /proc counts a
    library's threads, and no pidfd waits for the child) and one thread (a fork copies every lock
    another thread holds at that moment, held forever)."""
    return sys.platform.startswith("linux") and thread_count() == 1


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


def descendants(pids: list[int]) -> list[int]:
    """Every live descendant of `pids` (a `setsid` child keeps its parent, so it is found
    here for as long as the rank that started it lives)."""
    import psutil

    found = []
    for pid in pids:
        try:
            found += [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
    return found


def marked_processes(marker: dict[str, str], exclude: set[int]) -> list[int]:
    """Live processes whose environment holds every variable of `marker` (a rank's children
    inherit its environment, whichever session or group they move to, and whoever reparents
    them after the rank dies). Only processes of this user are readable, which are the only
    ones we could have started."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        if proc.pid in exclude or proc.pid == os.getpid():
            continue
        try:
            environ = proc.environ()
        except (psutil.Error, OSError):
            continue
        if all(environ.get(key) == value for key, value in marker.items()):
            found.append(proc.pid)
    return found


def end_processes(pids: list[int], timeout_s: float = 5.0) -> list[dict[str, object]]:
    """SIGKILL each of `pids` and wait for it; what each was, for the report (pid, session,
    command line). A pid already gone is skipped."""
    import psutil

    ended, procs = [], []
    for pid in dict.fromkeys(pids):
        try:
            proc = psutil.Process(pid)
            ended.append({"pid": pid, "sid": os.getsid(pid), "cmdline": " ".join(proc.cmdline())[:200]})
            proc.kill()
            procs.append(proc)
        except (psutil.Error, OSError):
            continue
    psutil.wait_procs(procs, timeout=timeout_s)
    return ended
