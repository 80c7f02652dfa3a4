"""The checkpoint store on its own: atomic commit, verified load, retention, bad input."""
from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path
from typing import Callable

import pytest
from blake3 import blake3

from tests.trainer.forkranks import Events
from trainwreck.trainer.checkpoint import CheckpointStore, IncompatibleCheckpoint
from trainwreck.rundir.events import EventLog
from trainwreck.trainer.hooks import NoHooks
from trainwreck.trainer.storage import LocalStorage, UnsafePathError

IDENTITY = "cfg-a"
FILES = {"model.pt": b"weights" * 100, "trainer.pt": b"cursor" * 10}


def make_store(run_dir: Path, keep_last: int = 3, storage: object | None = None) -> CheckpointStore:
    events = EventLog(run_dir / "events" / "a000-r000-p1.jsonl", attempt=0, rank=0, world_size=1)
    storage = storage or LocalStorage(run_dir / "checkpoints")
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    return CheckpointStore(storage, events, NoHooks(), keep_last)  # type: ignore[arg-type]


def save_steps(store: CheckpointStore, *steps: int) -> None:
    for step in steps:
        store.save(step, FILES, {"config_identity": IDENTITY, "digest": f"d{step}", "world_size": 1})


def rejects(run_dir: Path) -> list[tuple[str, str]]:
    return [(e["checkpoint"], e["reason"]) for e in Events.read(run_dir).of("reject")]


def test_the_newest_committed_checkpoint_is_selected_and_announced_once(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000008"
    assert chosen.files == FILES
    assert [(e["step"], e["digest"]) for e in Events.read(tmp_path).of("save")] == [(4, "d4"), (8, "d8")]
    assert json.loads((tmp_path / "checkpoints" / "latest").read_text())["step"] == 8


@pytest.mark.parametrize("damage, reason", [
    (lambda d: (d / "model.pt").write_bytes(b"X" + (d / "model.pt").read_bytes()[1:]), "fails its blake3 check"),
    (lambda d: (d / "model.pt").write_bytes((d / "model.pt").read_bytes()[:10]), "bytes"),
    (lambda d: (d / "manifest.json").unlink(), "missing"),
    (lambda d: (d / "manifest.json").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "trainer.pt").unlink(), "missing"),
])
def test_a_damaged_newest_checkpoint_is_rejected_and_the_previous_one_taken(tmp_path: Path, damage, reason) -> None:  # type: ignore[no-untyped-def]
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    damage(tmp_path / "checkpoints" / "step-00000008")
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"
    [(name, why)] = rejects(tmp_path)
    assert name == "step-00000008" and reason in why


def rewrite_entries(checkpoint: Path, entry: Callable[[bytes], dict[str, object]]) -> None:
    """Give every file of `checkpoint` the manifest entry `entry` makes of its bytes."""
    path = checkpoint / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"] = {name: entry((checkpoint / name).read_bytes()) for name in manifest["files"]}
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def sha256_entry(data: bytes) -> dict[str, object]:
    """A manifest entry as every version before BLAKE3 wrote it."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_checkpoint_written_with_sha256_before_blake3_still_loads(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    rewrite_entries(tmp_path / "checkpoints" / "step-00000008", sha256_entry)
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000008"
    assert chosen.files == FILES and rejects(tmp_path) == []


def test_a_flipped_byte_in_a_sha256_checkpoint_is_rejected_by_its_sha256(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    rewrite_entries(tmp_path / "checkpoints" / "step-00000008", sha256_entry)
    flip_a_byte(tmp_path / "checkpoints" / "step-00000008" / "model.pt")
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"
    assert rejects(tmp_path) == [("step-00000008", "step-00000008/model.pt fails its sha256 check")]


@pytest.mark.parametrize("checksums, why", [
    (lambda data: {"md5": hashlib.md5(data).hexdigest()}, "found 'md5'"),
    (lambda data: {}, "found none"),
    # Both correct, still refused: the store writes one, so two means someone else wrote it.
    (lambda data: {"blake3": blake3(data).hexdigest(), "sha256": hashlib.sha256(data).hexdigest()},
     "found 'blake3', 'sha256'"),
    (lambda data: {"blake3": 7}, "not a hex string"),
], ids=["unknown algorithm", "no checksum", "two checksums", "not a string"])
def test_a_manifest_entry_without_one_known_checksum_is_rejected_naming_the_checkpoint_and_the_previous_one_taken(
        tmp_path: Path, checksums: Callable[[bytes], dict[str, object]], why: str) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    rewrite_entries(tmp_path / "checkpoints" / "step-00000008", lambda data: {"size": len(data), **checksums(data)})
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"
    [(name, reason)] = rejects(tmp_path)
    assert name == "step-00000008" and reason.startswith("step-00000008/manifest.json gives ") and why in reason


@pytest.mark.parametrize("evil", ["../../outside.pt", "/etc/passwd", "sub/../../x"])
def test_a_manifest_naming_a_path_outside_the_checkpoint_is_rejected(tmp_path: Path, evil: str) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    manifest_path = tmp_path / "checkpoints" / "step-00000008" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][evil] = {"size": 1, "blake3": "0"}
    manifest_path.write_text(json.dumps(manifest))
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"
    assert "escapes" in rejects(tmp_path)[0][1] or "not a file of the checkpoint" in rejects(tmp_path)[0][1]


def test_a_directory_newer_than_the_commit_pointer_is_never_restored(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    # A save that renamed its directory into place but died before the pointer moved.
    (tmp_path / "checkpoints" / "latest").write_text(json.dumps({"step": 4, "checkpoint": "step-00000004"}))
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"
    assert rejects(tmp_path) == [("step-00000008", "never committed: newer than the commit pointer")]


def test_a_torn_pointer_falls_back_to_the_newest_directory_that_verifies(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    (tmp_path / "checkpoints" / "latest").write_text('{"step": 8, "chec')
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000008"
    assert rejects(tmp_path)[0][0] == "latest"


def test_with_nothing_intact_the_job_starts_fresh(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4)
    (tmp_path / "checkpoints" / "step-00000004" / "model.pt").write_bytes(b"")
    assert store.select(IDENTITY) is None
    assert [name for name, _ in rejects(tmp_path)] == ["step-00000004"]


def test_a_checkpoint_of_another_configuration_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4)
    with pytest.raises(IncompatibleCheckpoint, match="config identity cfg-a, this run has cfg-b"):
        store.select("cfg-b")


def test_retention_keeps_the_newest_k_emits_prune_and_clears_stale_temporaries(tmp_path: Path) -> None:
    store = make_store(tmp_path, keep_last=2)
    (tmp_path / "checkpoints" / ".tmp-step-00000099-123").mkdir()
    save_steps(store, 4, 8, 12)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-00000008", "step-00000012"]
    assert [e["checkpoint"] for e in Events.read(tmp_path).of("prune")] == ["step-00000004"]


class FullDisk(LocalStorage):
    """Fails the Nth write with ENOSPC, as a full disk would."""

    def __init__(self, root: Path, fail_at: int) -> None:
        super().__init__(root)
        self.writes, self.fail_at = 0, fail_at

    def write(self, path: str, data: bytes) -> None:
        self.writes += 1
        if self.writes == self.fail_at:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        super().write(path, data)


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4])
def test_a_save_that_fails_midway_loses_nothing_already_committed(tmp_path: Path, fail_at: int) -> None:
    save_steps(make_store(tmp_path), 4)
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints" / "step-00000004").iterdir()}
    failing = make_store(tmp_path, storage=FullDisk(tmp_path / "checkpoints", fail_at))
    with pytest.raises(OSError, match="No space"):
        save_steps(failing, 8)
    fresh = make_store(tmp_path)
    chosen = fresh.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"
    assert {p.name: p.read_bytes() for p in (tmp_path / "checkpoints" / "step-00000004").iterdir()} == before


def test_storage_refuses_paths_that_escape_its_root(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "ckpt")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "link").symlink_to(tmp_path)
    for evil in ("../x", "/abs", "link/x", "a\\..\\b"):
        with pytest.raises(UnsafePathError):
            storage.write(evil, b"")


@pytest.mark.parametrize("pointer, expected", [
    ('{"step": 8, "checkpoint": "step-00000008"}', ["step-00000008", "step-00000004"]),
    ('{"step": 4, "checkpoint": "step-00000004"}', ["step-00000004"]),  # step 8 never committed
    (None, ["step-00000008", "step-00000004"]),  # lost pointer: the older one proves commits happened
    ('{"step": 2, "checkpoint": "step-00000002"}', ["step-00000008", "step-00000004"]),  # names a missing dir
    ('{"step": 8, "chec', ["step-00000008", "step-00000004"]),  # torn
])
def test_the_store_and_the_corruptor_count_the_same_checkpoints_as_committed(
        tmp_path: Path, pointer: str | None, expected: list[str]) -> None:
    from trainwreck.faults.corrupt import committed

    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    latest = tmp_path / "checkpoints" / "latest"
    latest.unlink()
    if pointer is not None:
        latest.write_text(pointer)
    assert store.committed_names() == expected
    assert committed(store.storage) == expected


def test_without_a_pointer_a_lone_directory_is_a_first_save_that_never_committed(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4)
    (tmp_path / "checkpoints" / "latest").unlink()
    assert store.select(IDENTITY) is None
    assert rejects(tmp_path) == [("step-00000004", "never committed: no commit pointer, and no older checkpoint proves a commit happened")]
