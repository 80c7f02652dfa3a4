"""The checksum of every checkpoint file: one rule for the save, the manifest and the load.

A manifest entry records a file's digest under the name of the hash that made it
(``{"size": N, "blake3": HEX}``). New saves write BLAKE3: a verified load hashes every
byte it reads, and sha256 of 100 MB took as long as the ``torch.load`` beside it (87 ms
of CPU against BLAKE3's 19 ms, single-threaded, measured 2026-11-26), so the hash, not
the disk, bounded the load. Entries written under ``sha256`` by earlier versions still
verify, so no committed checkpoint is lost. An entry that names neither, or both, is a
damaged manifest: the loader rejects the checkpoint and falls back to an older one.

Both hashes release the GIL for updates of 2 KiB and more (hashlib's HASHLIB_GIL_MINSIZE;
blake3-py's GIL_MINSIZE is the same 2048 bytes), which the save and the load rely on to
hash on a second thread while the first one writes or reads.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Protocol

from blake3 import blake3

ALGORITHM = "blake3"
"""The hash every new save uses, and the key its digest is written under."""


class Hasher(Protocol):
    """What hashlib's objects and blake3's share: the streaming half of the interface."""

    def update(self, data: Any, /) -> Any: ...

    def hexdigest(self) -> str: ...


_HASHERS: dict[str, Callable[[], Hasher]] = {
    "blake3": blake3,  # single-threaded (max_threads=1): the second thread is the save's or the load's own
    "sha256": hashlib.sha256,  # read only: manifests written before BLAKE3, never written now
}


class UnknownChecksum(ValueError):
    """A manifest entry records no digest this version can check."""


def new_hasher(algorithm: str = ALGORITHM) -> Hasher:
    return _HASHERS[algorithm]()


def digest(data: bytes | memoryview) -> str:
    """The hex digest a new manifest entry records for `data`."""
    hasher = new_hasher()
    hasher.update(data)
    return hasher.hexdigest()


def entry(size: int, hexdigest: str) -> dict[str, Any]:
    """A new manifest entry: the file's size and its digest under `ALGORITHM`."""
    return {"size": size, ALGORITHM: hexdigest}


def entry_of(data: bytes | memoryview) -> dict[str, Any]:
    """The manifest entry of a file held whole in memory: its size and digest."""
    return entry(len(data), digest(data))


def expected(recorded: dict[str, Any]) -> tuple[str, str]:
    """(algorithm, hex digest) that the manifest entry `recorded` holds, chosen by its key;
    UnknownChecksum when it holds none this version reads, or more than one (the store never
    writes two, so two means the manifest was written by someone else)."""
    found = [name for name in _HASHERS if name in recorded]
    if len(found) != 1:
        keys = ", ".join(repr(k) for k in recorded if k != "size") or "none"
        raise UnknownChecksum(f"no single checksum ({' or '.join(_HASHERS)}) among its keys (found {keys:.200})")
    algorithm = found[0]
    value = recorded[algorithm]
    if not isinstance(value, str):
        raise UnknownChecksum(f"a {algorithm} that is not a hex string (found {value!r:.200})")
    return algorithm, value
