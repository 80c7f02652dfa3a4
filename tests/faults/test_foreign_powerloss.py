"""Power loss for the framework writers (faults/foreign_record.py): a foreign save's file
operations, recorded in its own process with their data and fsync barriers, read back as
the op log the crash-state generator of faults/powerloss.py takes unchanged."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainwreck.faults.foreign_record import load_foreign_oplog, raw_file
from trainwreck.faults.powerloss import OPS_DIR, OpLog, crash_states, issued_state, states_at

# A save written by hand the ways frameworks write theirs, in a process of its own (an audit
# hook cannot be removed, so it must not be installed in the test process).
HAND_SAVE = textwrap.dedent("""
    import os, shutil, sys, torch
    from pathlib import Path
    from trainwreck.faults.foreign_record import install
    root, out, tmp = (Path(a) for a in sys.argv[1:4])
    install(root, out)
    os.makedirs(root / "ck", exist_ok=True)
    os.makedirs(root / "ck", exist_ok=True)                 # exists already: changes nothing
    with open(root / "ck" / "a.bin", "wb") as f:            # data, fsynced
        f.write(b"A" * 5000)
        f.flush()
        os.fsync(f.fileno())
    torch.save({"w": torch.arange(4.0)}, root / "ck" / "b.pt")  # a C++ writer: no audit event of its own
    fd = os.open(root / "ck", os.O_RDONLY)
    os.fsync(fd)                                             # a directory barrier
    os.close(fd)
    (tmp / "staged").write_bytes(b"S" * 9000)                # written outside the root, moved in
    os.replace(tmp / "staged", root / "last.ckpt")
    shutil.rmtree(root / "old")                              # one recursive unlink
    with open(root / "ck" / "late.txt", "w") as f:           # captured only at exit
        f.write("late")
    os._exit(0)
""")


def hand_save(tmp_path: Path) -> Path:
    run_dir, tmp = tmp_path / "run", tmp_path / "elsewhere"
    root = run_dir / "checkpoints"
    (root / "old").mkdir(parents=True)
    (root / "old" / "x").write_bytes(b"old")
    tmp.mkdir()
    script = tmp_path / "save.py"
    script.write_text(HAND_SAVE)
    out = raw_file(run_dir, 0, 0)
    subprocess.run([sys.executable, str(script), str(root), str(out), str(tmp)], check=True, timeout=120)
    return run_dir


@pytest.fixture(scope="module")
def hand_log(tmp_path_factory: pytest.TempPathFactory) -> OpLog:
    """One hand-driven save, recorded once for the module (a subprocess importing torch)."""
    return load_foreign_oplog(hand_save(tmp_path_factory.mktemp("hand")) / OPS_DIR)


def test_a_hand_driven_foreign_save_is_recorded_with_its_data_and_barriers(hand_log: OpLog) -> None:
    import torch

    log = hand_log
    assert log.before == {"old": None, "old/x": b"old"}
    assert [op.describe() for op in log.ops] == [
        "mkdir(ck)", "create(ck/a.bin)", "data(ck/a.bin) [5000 bytes]", "fsync_file(ck/a.bin)",
        "create(ck/b.pt)", f"data(ck/b.pt) [{len(log.ops[5].data)} bytes]", "fsync_dir(ck)",
        "data(<outside the root>/last.ckpt) [9000 bytes]", "rename(<outside the root> -> last.ckpt)",
        "unlink(old/x)", "unlink(old)", "create(ck/late.txt)", "data(ck/late.txt) [4 bytes]"]
    saved = log.ops[5].data
    assert torch.load(__import__("io").BytesIO(saved), weights_only=True)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    times = [op.t for op in log.ops]
    assert times == sorted(times) and times[0] > 0, "every op carries the time it was issued"


def test_the_crash_states_of_a_recorded_foreign_save_keep_what_its_barriers_made_durable(hand_log: OpLog) -> None:
    log = hand_log
    states, stats = crash_states(log, seed=0, cap=64)
    assert stats.explored == len(states) > 10
    # ck/a.bin's data was fsynced (op 3): whenever a later cut leaves it visible, it is whole.
    seen = [s for s in states if s.point >= 4 and "ck/a.bin" in s.tree]
    assert seen and all(s.tree["ck/a.bin"] == b"A" * 5000 for s in seen)
    # ...but nobody fsynced the root, so ck itself (and a.bin with it) can still vanish.
    assert any("ck" not in s.tree for s in states_at(log, len(log.ops), cap=256))
    # ck's own entries were fsynced (op 6): where ck survives, b.pt is there, its unsynced bytes maybe not.
    with_ck = [s for s in states if s.point >= 7 and "ck" in s.tree]
    assert with_ck and all("ck/b.pt" in s.tree for s in with_ck)
    assert any(s.tree["ck/b.pt"] == b"" for s in with_ck)
    # The file moved in from outside: whenever its entry survived, all its bytes did (rule 4).
    moved = [s for s in states if "last.ckpt" in s.tree]
    assert moved and all(s.tree["last.ckpt"] == b"S" * 9000 for s in moved)
    assert any(s.point >= 9 and "last.ckpt" not in s.tree for s in states), "an unsynced rename-in can be lost"
    # The late file was never synced: some state has it empty.
    assert any(s.tree.get("ck/late.txt") == b"" for s in states)


def raw(path: Path, rank: int, records: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"before": {}, "rank": rank, "root": "/r"}] + [{"seq": i, **r} for i, r in enumerate(records)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_two_ranks_records_merge_by_time_and_a_folder_made_twice_is_made_once(tmp_path: Path) -> None:
    blobs = tmp_path / OPS_DIR / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "d0").write_bytes(b"rank0")
    (blobs / "d1").write_bytes(b"rank1")
    raw(raw_file(tmp_path, 0, 0), 0, [{"op": "mkdir", "path": "c", "t": 1.0},
                                       {"op": "open", "path": "c/m", "t": 3.0},
                                       {"op": "data", "path": "c/m", "t": 3.0, "blob": "d0"},
                                       {"op": "fsync", "path": "c/m", "t": 5.0}])
    raw(raw_file(tmp_path, 0, 1), 1, [{"op": "mkdir", "path": "c", "t": 1.5},
                                       {"op": "open", "path": "c/r1", "t": 2.0},
                                       {"op": "data", "path": "c/r1", "t": 2.0, "blob": "d1"},
                                       {"op": "remove", "path": "never-there", "t": 4.0}])
    log = load_foreign_oplog(tmp_path / OPS_DIR)
    assert [op.describe() for op in log.ops] == [
        "mkdir(c)", "create(c/r1)", "data(c/r1) [5 bytes]", "create(c/m)", "data(c/m) [5 bytes]", "fsync_file(c/m)"]
    assert log.ops[1].parent == log.ops[3].parent == log.ops[0].inode


def test_a_directory_without_a_recording_is_refused_with_the_fix(tmp_path: Path) -> None:
    try:
        load_foreign_oplog(tmp_path)
    except ValueError as exc:
        assert "foreign_record --record" in str(exc)
    else:
        raise AssertionError("an empty directory was read as a recording")


def test_the_issued_state_of_a_crash_point_is_the_one_a_process_crash_leaves(hand_log: OpLog) -> None:
    log = hand_log
    for point in range(len(log.ops) + 1):
        state = issued_state(log, point)
        assert state.damage == () and state.point == point
        assert state.digest in {s.digest for s in states_at(log, point, cap=4096)}
    assert issued_state(log, len(log.ops)).tree["last.ckpt"] == b"S" * 9000
