"""Hostile files where the trainer expects its own (issue 24): a FIFO, a device, a sparse
giant, a symlink out, a leftover it may not delete. Each is rejected like any damaged
file, at once (never a blocked open), and nothing outside the root is read or written.

The checks that can hang on a broken build run in a worker thread with a deadline, so a
regression fails the test instead of stalling the suite."""
from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from tests.hostile import mkfifo, within_deadline
from tests.trainer.test_checkpoint_store import FILES, IDENTITY, make_store, rejects, save_steps
from trainwreck.trainer.storage import LocalStorage
from tests.trainer.forkranks import Events

# ----- the layer on its own ---------------------------------------------------------------


def test_a_fifo_is_refused_as_not_a_regular_file_without_blocking(tmp_path: Path) -> None:
    from trainwreck.rundir import files  # here, not above: the store tests must run without it
    fifo = mkfifo(tmp_path / "run.json")
    with pytest.raises(files.NotRegularFile, match="a FIFO"):
        within_deadline(lambda: files.read_bytes(fifo, files.SMALL_LIMIT))


def test_an_endless_device_is_refused_before_a_byte_is_read() -> None:
    from trainwreck.rundir import files  # here, not above: the store tests must run without it
    with pytest.raises(files.NotRegularFile, match="character device"):
        within_deadline(lambda: files.read_bytes("/dev/zero", files.SMALL_LIMIT))


def test_a_file_over_its_bound_is_refused_by_its_size_unread(tmp_path: Path) -> None:
    from trainwreck.rundir import files  # here, not above: the store tests must run without it
    sparse = tmp_path / "big"
    with open(sparse, "wb") as file:
        file.truncate(2 << 30)  # 2 GiB, no blocks on disk
    with pytest.raises(files.TooLarge, match="more than the 1024 allowed"):
        files.read_bytes(sparse, 1024)


def test_a_symlink_is_never_followed_and_a_folder_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    from trainwreck.rundir import files  # here, not above: the store tests must run without it
    (tmp_path / "outside.txt").write_text("secret")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path / "outside.txt")
    (root / "dir").symlink_to(tmp_path)
    with pytest.raises(files.OutsideRoot):
        files.read_bytes(root / "link", 100, root=root)
    with pytest.raises(files.OutsideRoot):
        files.read_bytes(root / "dir" / "outside.txt", 100, root=root)
    with pytest.raises(files.OutsideRoot):
        files.read_bytes(root / "link", 100)  # even without a root: O_NOFOLLOW


def test_an_atomic_write_replaces_a_planted_link_and_never_writes_through_it(tmp_path: Path) -> None:
    from trainwreck.rundir import files  # here, not above: the store tests must run without it
    victim = tmp_path / "victim.txt"
    victim.write_text("must survive")
    root = tmp_path / "root"
    root.mkdir()
    (root / "report.md").symlink_to(victim)
    (root / "report.md.tmp").symlink_to(victim)
    files.write_atomic(root / "report.md", "report", root=root)
    assert victim.read_text() == "must survive"
    assert (root / "report.md").read_text() == "report" and not (root / "report.md").is_symlink()
    assert sorted(p.name for p in root.iterdir()) == ["report.md", "report.md.tmp"]  # only ours replaced


def test_an_atomic_write_into_a_folder_linked_out_of_the_root_is_refused(tmp_path: Path) -> None:
    from trainwreck.rundir import files  # here, not above: the store tests must run without it
    (tmp_path / "elsewhere").mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "report").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(files.OutsideRoot):
        files.write_atomic(root / "report" / "report.md", "x", root=root)
    assert list((tmp_path / "elsewhere").iterdir()) == []


# ----- the checkpoint store (items 3, 4, 5) -----------------------------------------------------


def test_a_fifo_as_the_commit_pointer_is_rejected_and_the_newest_checkpoint_found(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    (tmp_path / "checkpoints" / "latest").unlink()
    mkfifo(tmp_path / "checkpoints" / "latest")
    chosen = within_deadline(lambda: store.select(IDENTITY))
    assert chosen is not None and chosen.name == "step-00000008"
    assert any(name == "latest" and "FIFO" in reason for name, reason in rejects(tmp_path)), rejects(tmp_path)


def test_a_fifo_in_place_of_a_checkpoint_file_is_rejected_and_the_previous_one_taken(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    (tmp_path / "checkpoints" / "step-00000008" / "model.pt").unlink()
    mkfifo(tmp_path / "checkpoints" / "step-00000008" / "model.pt")
    chosen = within_deadline(lambda: store.select(IDENTITY))
    assert chosen is not None and chosen.name == "step-00000004"
    assert ("step-00000008", "step-00000008/model.pt is not a regular file (a FIFO)") in rejects(tmp_path)


def test_a_sparse_giant_file_is_rejected_by_its_manifest_size_before_it_is_read(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    with open(tmp_path / "checkpoints" / "step-00000008" / "model.pt", "r+b") as file:
        file.truncate(2 << 30)
    reads: list[int] = []
    inner = store.storage
    store.storage = _CountingBytes(inner, reads)  # type: ignore[assignment]
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"
    reason = dict(rejects(tmp_path))["step-00000008"]
    assert f"more than the {len(FILES['model.pt'])} allowed" in reason, reason
    assert max(reads) < 1 << 20, "the 2 GiB file was read before its size was compared"


class _CountingBytes:
    """A storage that records how many bytes each read returned."""

    def __init__(self, inner: Any, reads: list[int]) -> None:
        self.inner, self.reads = inner, reads

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, path: str, on_chunk: Any = None, limit: int | None = None) -> bytes:
        data = self.inner.read(path, on_chunk, limit)
        self.reads.append(len(data))
        return data


class Undeletable(LocalStorage):
    """A file system that refuses to remove anything under `protected` (no permission);
    the tests run as root here, where permission bits would not stop a removal."""

    def __init__(self, root: Path, protected: str) -> None:
        super().__init__(root)
        self.protected = protected

    def remove(self, path: str) -> None:
        if path.startswith(self.protected) or (self.root / path).resolve().name.startswith(self.protected):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        super().remove(path)


def test_an_undeletable_leftover_is_left_in_place_named_once_and_never_fatal(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    save_steps(store, 4, 8)
    (tmp_path / "checkpoints" / "step-00000008" / "model.pt").write_bytes(b"damaged")
    (tmp_path / "checkpoints" / ".trash-step-00000002-1").mkdir()
    store.storage = Undeletable(tmp_path / "checkpoints", ".trash-")
    for _ in range(2):  # a second attempt must get as far as the first
        chosen = store.select(IDENTITY)
        store.remove_stale()
        assert chosen is not None and chosen.name == "step-00000004"
    save_steps(store, 8)  # moves the rejected step 8 aside, then cannot delete it
    left = [name for name, reason in rejects(tmp_path) if "left in place" in reason]
    assert ".trash-step-00000002-1" in left and left.count(".trash-step-00000002-1") == 1, left
    assert any(name.startswith(".trash-step-00000008-") for name in left), left
    assert store.select(IDENTITY).name == "step-00000008"


class Immovable(Undeletable):
    """A file system on which the entry `protected` can be neither removed nor renamed
    (an immutable folder, a rename refused with EPERM)."""

    def rename(self, src: str, dst: str) -> None:
        if src == self.protected:
            raise PermissionError(errno.EPERM, "Operation not permitted", src)
        super().rename(src, dst)


def test_a_rejected_step_folder_that_cannot_be_moved_is_left_in_place_and_its_step_saved_afresh(tmp_path: Path) -> None:
    store = make_store(tmp_path, keep_last=2)
    save_steps(store, 4, 8)
    (tmp_path / "checkpoints" / "step-00000008" / "model.pt").write_bytes(b"damaged")
    storage = Immovable(tmp_path / "checkpoints", "step-00000008")
    store.storage = storage
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"
    save_steps(store, 8)  # before: PermissionError here, in every attempt
    left = [name for name, reason in rejects(tmp_path) if "left in place" in reason]
    assert left == ["step-00000008"], left  # named once, though both the save and retention met it
    assert json.loads((tmp_path / "checkpoints" / "latest").read_text())["checkpoint"] == "step-00000008.1"
    store = make_store(tmp_path, keep_last=2, storage=storage)  # the next attempt
    assert store.select(IDENTITY).name == "step-00000008.1"
    save_steps(store, 12, 16)  # retention keeps two intact ones; the immovable one takes no slot
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert names == ["step-00000008", "step-00000012", "step-00000016"], names
    assert [e["checkpoint"] for e in Events.read(tmp_path).of("prune")] == ["step-00000004", "step-00000008.1"]


def test_a_symlinked_checkpoints_folder_never_has_its_target_cleaned(tmp_path: Path) -> None:
    from trainwreck.rundir import files  # here, not above: the store tests must run without it
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in (".tmp-step-00000004-1", ".trash-step-00000004-1"):
        (outside / name).mkdir()
    (outside / "latest.tmp").write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(outside)
    with pytest.raises(files.OutsideRoot):
        make_store(run, storage=LocalStorage(run / "checkpoints", within=run)).remove_stale()
    assert sorted(p.name for p in outside.iterdir()) == [".tmp-step-00000004-1", ".trash-step-00000004-1", "latest.tmp"]

