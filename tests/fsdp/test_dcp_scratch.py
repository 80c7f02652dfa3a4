"""DCP's streams through the Storage seam leave nothing in $TMPDIR when the rank writing
them is killed mid-write (issue 24, item 1: `fsdp-torn-shard` left a 64 KB copy of the
killed rank's shard in $TMPDIR on every run)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainwreck.trainer.storage import LocalStorage, storage_fs


def test_a_rank_killed_while_dcp_writes_a_stream_leaves_nothing_in_tmpdir(tmp_path: Path) -> None:
    scratch_dir = tmp_path / "tmpdir"
    scratch_dir.mkdir()
    root = tmp_path / "checkpoints"
    root.mkdir()
    pid = os.fork()
    if pid == 0:  # the rank: point tempfile at our folder, start a shard, die mid-write
        try:
            tempfile.tempdir = str(scratch_dir)
            fs = storage_fs(LocalStorage(root), root)
            with fs.create_stream(root / "__1_0.distcp", "wb") as stream:
                stream.write(b"\x01" * (64 << 10))
                stream.flush()
                os._exit(9)  # killed: no finally, no cleanup
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9, "the child did not reach the write"
    assert list(scratch_dir.iterdir()) == [], "a killed rank left a scratch copy in $TMPDIR"
    assert list(root.iterdir()) == [], "the half-written stream reached the store"


def test_a_stream_written_through_the_seam_arrives_whole(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    root.mkdir()
    fs = storage_fs(LocalStorage(root), root)
    with fs.create_stream(root / "a.distcp", "wb") as stream:
        stream.write(b"shard" * 1000)
        os.fsync(stream.fileno())
        stream.close()  # DCP closes its stream itself
    assert (root / "a.distcp").read_bytes() == b"shard" * 1000
