"""The harness-owned rendezvous store: one TCPStore per job, a fresh prefix per attempt.

Bound to 127.0.0.1 on port 0 so the kernel picks a free port atomically; the real
port is read back and handed to the ranks. No fixed port and no probe-then-bind
race, so any number of jobs (e.g. under ``pytest -n auto``) can run side by side.

A TCPStore server ignores its host argument and listens on every interface, so
anyone reaching the machine could read and write rendezvous keys. We bind the
socket ourselves and hand it over (``master_listen_fd``): see `loopback_store`.
"""
from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Rendezvous:
    host: str
    """Address the ranks connect to."""
    port: int
    """The port the kernel gave the store."""
    prefix: str
    """Namespace of one attempt inside the store."""


def _bound_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def loopback_store(port: int, world_size: int | None, timeout: timedelta, host: str = HOST) -> Any:
    """A TCPStore server listening on `host`:`port` only (port 0: the kernel picks one).

    The store takes ownership of the descriptor (it closes it), hence ``detach``.
    torch 2.13's default libuv backend adopts the socket (checked: it then listens on
    127.0.0.1 only); should an older libuv backend refuse the descriptor, the classic
    backend (``use_libuv=False``), which has honoured ``master_listen_fd`` since it was
    added, takes a freshly bound socket instead.
    """
    import torch.distributed as dist  # only processes that own a store pay for torch

    last: Exception | None = None
    for use_libuv in (True, False):
        sock = _bound_socket(host, port)
        bound_port = sock.getsockname()[1]
        fd = sock.detach()
        try:
            return dist.TCPStore(host, bound_port, world_size, is_master=True, wait_for_workers=False,
                                 timeout=timeout, master_listen_fd=fd, use_libuv=use_libuv)
        except (RuntimeError, ValueError, OSError) as exc:
            # Not closed here: the store may already own (and have closed) the descriptor,
            # and closing a reused number would hit an unrelated file.
            last = exc
    raise RuntimeError(f"could not start a TCPStore on {host}:{port}: {last}")


class HarnessStore:
    """A TCPStore server living in the harness process for the duration of one job."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        self._store = loopback_store(0, None, timedelta(seconds=timeout_s))
        self.port = int(self._store.port)
        # A job-unique root: two jobs never share keys even if a store object were reused.
        self._root = uuid.uuid4().hex

    def rendezvous(self, attempt: int) -> Rendezvous:
        # Every attempt gets fresh keys: a second attempt reading the first one's keys
        # would join a process group that no longer exists.
        return Rendezvous(HOST, self.port, f"{self._root}/attempt-{attempt}")

    def close(self) -> None:
        self._store = None  # type: ignore[assignment]  # dropping the last reference stops the server
