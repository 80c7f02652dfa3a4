"""The harness-owned rendezvous store: one TCPStore per job, a fresh prefix per attempt.

Bound to 127.0.0.1 on port 0 so the kernel picks a free port atomically; the real
port is read back and handed to the ranks. No fixed port and no probe-then-bind
race, so any number of jobs (e.g. under ``pytest -n auto``) can run side by side.

A TCPStore server ignores its host argument and listens on every interface, so
anyone reaching the machine could read and write rendezvous keys. We bind the
socket ourselves and hand it over: see `trainwreck.trainer.launch.loopback_store`.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Rendezvous:
    host: str
    """Address the ranks connect to."""
    port: int
    """The port the kernel gave the store."""
    prefix: str
    """Namespace of one attempt inside the store."""


class HarnessStore:
    """A TCPStore server living in the harness process for the duration of one job."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        # Imported here: the harness only pays for torch when it owns a store.
        from trainwreck.trainer.launch import loopback_store

        self._store = loopback_store(0, None, timedelta(seconds=timeout_s), HOST)
        self.port = int(self._store.port)
        # A job-unique root: two jobs never share keys even if a store object were reused.
        self._root = uuid.uuid4().hex

    def rendezvous(self, attempt: int) -> Rendezvous:
        # Every attempt gets fresh keys: a second attempt reading the first one's keys
        # would join a process group that no longer exists.
        return Rendezvous(HOST, self.port, f"{self._root}/attempt-{attempt}")

    def close(self) -> None:
        self._store = None  # type: ignore[assignment]  # dropping the last reference stops the server
