"""A damaged checkpoint is rejected with its reason and the previous intact one restored,
never a traceback, never code run, nothing changed outside the run directory. Real store,
real forked ranks: attempt 0 commits step 4 and step 8 and dies at step 10; each case
damages a copy of that run directory and runs attempt 1."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from blake3 import blake3

from tests.trainer.forkranks import CRASH_CODE, CrashAt, Events, run_attempt, write_run_json
from trainwreck.trainer.config import TrainConfig

CFG = TrainConfig.tiny(total_steps=12, ckpt_interval=4)
NEWEST, OLDER = "step-00000008", "step-00000004"


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("base") / "run"
    write_run_json(run_dir, CFG, [1, 2])
    codes = run_attempt(run_dir, CFG, 1, attempt=0, hooks=lambda: CrashAt(10))
    assert codes[0] == CRASH_CODE, "the planted crash did not fire"
    assert json.loads((run_dir / "checkpoints" / "latest").read_text())["checkpoint"] == NEWEST
    return run_dir


class Case:
    """A copy of the crashed run, a sibling directory outside it, and how it was damaged."""

    def __init__(self, base: Path, tmp_path: Path) -> None:
        self.run_dir = tmp_path / "run"
        shutil.copytree(base, self.run_dir, symlinks=True)
        self.ckpt = self.run_dir / "checkpoints"
        self.outside = tmp_path / "outside"
        shutil.copytree(self.ckpt / OLDER, self.outside / "stolen")  # a plausible target for a link
        (self.outside / "victim.txt").write_text("must survive")

    def snapshot(self) -> dict[str, str]:
        return {str(p.relative_to(self.outside)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
                for p in sorted(self.outside.rglob("*"))}

    def rewrite_manifest(self, edit: Callable[[dict], None]) -> None:
        path = self.ckpt / NEWEST / "manifest.json"
        manifest = json.loads(path.read_text())
        edit(manifest)
        path.write_text(json.dumps(manifest))

    def replace_file(self, name: str, data: bytes) -> None:
        """Replace a file and fix its manifest entry: the checksum matches, the content is bad."""
        (self.ckpt / NEWEST / name).write_bytes(data)
        self.rewrite_manifest(lambda m: m["files"].__setitem__(
            name, {"size": len(data), "blake3": blake3(data).hexdigest()}))

    def resume(self, world_size: int) -> Events:
        before = self.snapshot()
        # A bounded wait: a FIFO opened blocking would otherwise hang the attempt forever.
        codes = run_attempt(self.run_dir, CFG, world_size, attempt=1, timeout_s=60)
        assert codes == {r: 0 for r in range(world_size)}, "the resume failed instead of falling back"
        assert self.snapshot() == before, "something outside the run directory changed"
        return Events.read(self.run_dir)


def restored(events: Events) -> set[str]:
    return {e["checkpoint"] for e in events.of("restore", attempt=1)}


def rejected(events: Events) -> dict[str, str]:
    return {e["checkpoint"]: e["reason"] for e in events.of("reject", attempt=1)}


def symlink_dir_out(c: Case) -> None:
    shutil.rmtree(c.ckpt / NEWEST)
    (c.ckpt / NEWEST).symlink_to(c.outside / "stolen")


def symlink_file_out(c: Case) -> None:
    shutil.copy(c.ckpt / NEWEST / "model.pt", c.outside / "model.pt")  # same bytes: the checksum would match
    (c.ckpt / NEWEST / "model.pt").unlink()
    (c.ckpt / NEWEST / "model.pt").symlink_to(c.outside / "model.pt")


def name_is_a_file(c: Case) -> None:
    shutil.rmtree(c.ckpt / NEWEST)
    (c.ckpt / NEWEST).write_text("not a directory")


def nul_in_manifest(c: Case) -> None:
    c.rewrite_manifest(lambda m: m["files"].__setitem__("model.pt\u0000x", m["files"]["model.pt"]))


def deep_manifest(c: Case) -> None:
    (c.ckpt / NEWEST / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)


def lacks_a_required_file(c: Case) -> None:
    (c.ckpt / NEWEST / "optimizer.pt").unlink()
    c.rewrite_manifest(lambda m: m["files"].pop("optimizer.pt"))


def not_a_weights_payload(c: Case) -> None:
    c.replace_file("trainer.pt", b"PK\x03\x04 this is not a torch zip")


def fifo_in_place_of_a_file(c: Case) -> None:
    (c.ckpt / NEWEST / "model.pt").unlink()
    os.mkfifo(c.ckpt / NEWEST / "model.pt")


def sparse_giant_optimizer(c: Case) -> None:
    with open(c.ckpt / NEWEST / "optimizer.pt", "r+b") as file:
        file.truncate(2 << 30)  # 2 GiB, sparse: refused by its size against the manifest, unread


DAMAGE = {  # damage -> the words its reject reason must hold
    "symlink_dir_out": (symlink_dir_out, "outside"),
    "symlink_file_out": (symlink_file_out, "outside"),
    "name_is_a_file": (name_is_a_file, "NotADirectoryError"),
    "nul_in_manifest": (nul_in_manifest, "null"),
    "deep_manifest": (deep_manifest, "RecursionError"),
    "lacks_a_required_file": (lacks_a_required_file, "lacks optimizer.pt"),
    "not_a_weights_payload": (not_a_weights_payload, "not a loadable weights-only payload"),
    "fifo_in_place_of_a_file": (fifo_in_place_of_a_file, "is not a regular file (a FIFO)"),
    "sparse_giant_optimizer": (sparse_giant_optimizer, "2147483648 bytes, more than the"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_rejected_and_the_previous_one_restored(
        crashed_run: Path, tmp_path: Path, damage: str) -> None:
    case = Case(crashed_run, tmp_path)
    apply, reason = DAMAGE[damage]
    apply(case)
    events = case.resume(world_size=1)
    assert restored(events) == {OLDER}
    assert reason in rejected(events).get(NEWEST, ""), rejected(events)


class ArmedPayload:
    """Unpickling this without weights_only creates `marker`: code would have run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.marker),))


def test_a_crafted_pickle_with_a_matching_checksum_is_rejected_without_running_on_every_rank(
        crashed_run: Path, tmp_path: Path) -> None:
    world_size = 2
    case = Case(crashed_run, tmp_path)
    marker = tmp_path / "code-ran"
    buffer = io.BytesIO()
    torch.save({"model": ArmedPayload(marker)}, buffer)
    case.replace_file("model.pt", buffer.getvalue())
    events = case.resume(world_size)
    assert not marker.exists(), "loading the checkpoint ran code"
    assert {e["rank"] for e in events.of("restore", attempt=1)} == set(range(world_size))
    assert restored(events) == {OLDER}
    assert "not a loadable weights-only payload" in rejected(events)[NEWEST]
    # The payload is armed: a loader without weights_only would have run it.
    # (The resumed job has since saved a fresh step 8, so load the planted bytes.)
    torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert marker.exists()


def test_a_checkpoint_symlinked_outside_is_rejected_by_a_two_rank_job(crashed_run: Path, tmp_path: Path) -> None:
    case = Case(crashed_run, tmp_path)
    symlink_dir_out(case)
    events = case.resume(world_size=2)
    assert {(e["rank"], e["checkpoint"]) for e in events.of("restore", attempt=1)} == {(0, OLDER), (1, OLDER)}
    assert "outside" in rejected(events)[NEWEST]


def pointer_is_a_directory(c: Case) -> None:
    (c.ckpt / "latest").unlink()
    (c.ckpt / "latest").mkdir()


def nul_in_pointer(c: Case) -> None:
    (c.ckpt / "latest").write_text('{"step": 8, "checkpoint": "step-00000008\\u0000"}')


def deep_pointer(c: Case) -> None:
    (c.ckpt / "latest").write_text("{\"a\":" * 100_000 + "1" + "}" * 100_000)


def pointer_is_a_fifo(c: Case) -> None:
    (c.ckpt / "latest").unlink()
    os.mkfifo(c.ckpt / "latest")


@pytest.mark.parametrize("damage", [pointer_is_a_directory, nul_in_pointer, deep_pointer, pointer_is_a_fifo])
def test_a_damaged_pointer_is_rejected_and_the_newest_intact_checkpoint_restored(
        crashed_run: Path, tmp_path: Path, damage: Callable[[Case], None]) -> None:
    case = Case(crashed_run, tmp_path)
    damage(case)
    events = case.resume(world_size=1)
    assert "latest" in rejected(events)
    assert restored(events) == {NEWEST}


def test_stale_temporaries_that_are_symlinks_are_unlinked_and_their_targets_kept(
        crashed_run: Path, tmp_path: Path) -> None:
    case = Case(crashed_run, tmp_path)
    (case.ckpt / ".tmp-step-00000012-999999").symlink_to(case.outside / "stolen")
    (case.ckpt / "latest.tmp").symlink_to(case.outside / "victim.txt")
    events = case.resume(world_size=1)  # asserts the outside snapshot is unchanged
    assert restored(events) == {NEWEST}
    assert not os.path.lexists(case.ckpt / ".tmp-step-00000012-999999")
    assert not os.path.lexists(case.ckpt / "latest.tmp")
    assert (case.outside / "victim.txt").read_text() == "must survive"


@pytest.mark.parametrize("pointer", [None, '{"step": 2, "checkpoint": "step-00000002"}'])
def test_a_lost_pointer_does_not_make_committed_checkpoints_vanish(
        crashed_run: Path, tmp_path: Path, pointer: str | None) -> None:
    case = Case(crashed_run, tmp_path)
    if pointer is None:
        (case.ckpt / "latest").unlink()
    else:
        (case.ckpt / "latest").write_text(pointer)
    events = case.resume(world_size=1)
    assert restored(events) == {NEWEST}, "the job started over and would overwrite committed work"


def test_a_checkpoints_folder_linked_out_of_the_run_directory_is_never_cleaned_or_read(
        crashed_run: Path, tmp_path: Path) -> None:
    case = Case(crashed_run, tmp_path)
    shutil.move(case.ckpt, case.outside / "checkpoints")
    for name in (".tmp-step-00000012-999999", ".trash-step-00000004-999999"):
        (case.outside / "checkpoints" / name).mkdir()
    (case.outside / "checkpoints" / "latest.tmp").write_text("must survive")
    case.ckpt.symlink_to(case.outside / "checkpoints")
    before = case.snapshot()
    codes = run_attempt(case.run_dir, CFG, 1, attempt=1, timeout_s=60)
    assert case.snapshot() == before, "the trainer cleaned up or wrote in the folder the link names"
    assert codes[0] != 0, "the attempt used a checkpoint store outside its run directory"
