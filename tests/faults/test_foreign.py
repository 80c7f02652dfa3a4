"""Crashes inside a foreign save (faults/foreign.py), on a plain Python writer: no framework.

The unit tests replace the SIGKILL by an exception (so the test process lives on to look at
the disk); one test runs the real SIGKILL in a child process."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from trainwreck.faults.foreign import ForeignSave, crash_plan, crash_points, record_ops, torn_size
from trainwreck.faults.plan import PlanError, parse_plan

try:  # bound at import, before any save starts, as frameworks do (accelerate)
    from safetensors.torch import save_file as bound_save_file
except ImportError:
    bound_save_file = None


class Crashed(Exception):
    """Stands in for SIGKILL in the unit tests."""


def crash() -> None:
    raise Crashed


def armed(root: Path, op_index: int, when: str, step: int = 4) -> tuple[ForeignSave, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []
    save = ForeignSave(crash_plan(step, op_index, when), rank=0, attempt=0,
                       record=lambda fault, detail, **extra: events.append((fault["id"], detail)),
                       root=root, crash=crash)
    return save, events


def run_armed(save: ForeignSave, writer: Callable[[], None], step: int = 4) -> bool:
    """True when the save crashed."""
    try:
        with save.saving(step):
            writer()
    except Crashed:
        return True
    return False


# One writer per operation kind: (what it does, the op recorded). Each writes under root.
def w_open(root: Path) -> None:
    (root / "model.bin").write_bytes(b"x" * 4096)


def w_rename(root: Path) -> None:
    (root / "a.tmp").touch()  # set up outside the armed op index: op 0 is the open
    os.rename(root / "a.tmp", root / "a")


def w_replace(root: Path) -> None:
    (root / "b.tmp").touch()
    os.replace(root / "b.tmp", root / "b")


def w_remove(root: Path) -> None:
    (root / "old").touch()
    os.remove(root / "old")


def w_unlink(root: Path) -> None:
    (root / "old").touch()
    os.unlink(root / "old")


def w_mkdir(root: Path) -> None:
    os.mkdir(root / "step-4")


def w_rmtree(root: Path) -> None:
    os.mkdir(root / "step-0")
    shutil.rmtree(root / "step-0")


def w_torch_save(root: Path) -> None:
    torch.save({"w": torch.zeros(4)}, root / "model.pt")


def w_safetensors(root: Path) -> None:
    if bound_save_file is None:
        pytest.skip("pip install safetensors")
    bound_save_file({"w": torch.zeros(4)}, str(root / "model.safetensors"))


WRITERS = {  # writer, its ops' names in order, the index of the op of interest
    "open": (w_open, ["open"], 0), "rename": (w_rename, ["open", "rename"], 1),
    "replace": (w_replace, ["open", "rename"], 1), "remove": (w_remove, ["open", "remove"], 1),
    "unlink": (w_unlink, ["open", "remove"], 1), "mkdir": (w_mkdir, ["mkdir"], 0),
    "rmtree": (w_rmtree, ["mkdir", "rmtree"], 1), "torch.save": (w_torch_save, ["torch.save"], 0),
    "safetensors": (w_safetensors, ["save_file"], 0),
}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_each_kind_of_file_operation_is_recorded_and_a_kill_before_it_leaves_it_undone(kind, tmp_path):
    writer, names, index = WRITERS[kind]
    ops = record_ops(lambda: writer(tmp_path), tmp_path)
    assert [op.name for op in ops] == names
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    before_files = sorted(p.name for p in tmp_path.rglob("*"))
    save, events = armed(tmp_path, index, "before")
    assert run_armed(save, lambda: writer(tmp_path))
    assert len(events) == 1 and events[0][1].startswith(f"SIGKILL before op {index} {ops[index].name}(")
    # The op of interest did not happen: its effect is absent from the disk.
    after = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")}
    effect = {"open": "model.bin", "rename": "a", "replace": "b", "mkdir": "step-4",
              "torch.save": "model.pt", "safetensors": "model.safetensors"}
    if kind in effect:
        assert effect[kind] not in after
    else:  # remove / unlink / rmtree: what it would delete is still there
        assert {"remove": "old", "unlink": "old", "rmtree": "step-0"}[kind] in after
    assert before_files == []


def test_a_kill_after_an_op_leaves_it_done_and_nothing_later(tmp_path):
    def writer() -> None:
        (tmp_path / "m.tmp").write_bytes(b"1" * 100)
        os.replace(tmp_path / "m.tmp", tmp_path / "m")
        (tmp_path / "latest").write_text("m")

    save, events = armed(tmp_path, 1, "after")
    assert run_armed(save, writer)
    assert events == [("foreign-after-op1", "SIGKILL after op 1 rename(m.tmp, m) of the save at step 4")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # renamed, pointer never written


def test_a_kill_after_the_last_op_fires_when_the_save_ends(tmp_path):
    save, events = armed(tmp_path, 0, "after")
    assert run_armed(save, lambda: w_open(tmp_path))
    assert [e[0] for e in events] == ["foreign-after-op0"]
    assert (tmp_path / "model.bin").stat().st_size == 4096


@pytest.mark.parametrize("writer,name", [(w_open, "model.bin"), (w_torch_save, "model.pt")])
def test_a_torn_write_keeps_whole_blocks_of_the_file_then_kills(writer, name, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    writer(full)
    size = (full / name).stat().st_size
    shutil.rmtree(full)
    save, events = armed(tmp_path, 0, "torn")
    assert run_armed(save, lambda: writer(tmp_path))
    kept = (tmp_path / name).stat().st_size
    assert kept == torn_size(size) and kept % 512 == 0 and kept < size
    assert events[0][1].startswith("tore op 0") and f"{kept} of {size} bytes kept" in events[0][1]


def test_a_torn_point_on_a_rename_crashes_before_it(tmp_path):
    save, events = armed(tmp_path, 1, "torn")
    assert run_armed(save, lambda: w_rename(tmp_path))
    assert "not a write" in events[0][1]
    assert not (tmp_path / "a").exists()


def test_nothing_is_intercepted_outside_a_save(tmp_path):
    save, events = armed(tmp_path, 0, "before")
    w_open(tmp_path)  # op 0 would crash inside a save
    w_torch_save(tmp_path)
    with save.saving(step=5):  # a save at another step: counted, not faulted
        w_mkdir(tmp_path)
    assert [op.name for op in save.recorded] == ["mkdir"]
    w_rename(tmp_path)  # after the save: not counted any more
    assert [op.name for op in save.recorded] == ["mkdir"] and events == []
    assert torch.save.__module__ == "torch.serialization"  # the wrapper is gone


def test_operations_outside_the_root_and_reads_are_not_counted(tmp_path):
    root, elsewhere = tmp_path / "ckpt", tmp_path / "logs"
    root.mkdir(), elsewhere.mkdir()
    (root / "r").write_text("x")

    def writer() -> None:
        (elsewhere / "log").write_text("x")
        (root / "r").read_text()
        (root / "w").write_text("x")

    assert [op.describe() for op in record_ops(writer, root)] == ["open(w)"]


def test_the_crash_points_of_a_recorded_save_are_before_after_and_torn_for_writes(tmp_path):
    ops = record_ops(lambda: w_rename(tmp_path), tmp_path)
    assert crash_points(ops) == [(0, "open(a.tmp)", "before"), (0, "open(a.tmp)", "after"),
                                 (0, "open(a.tmp)", "torn"), (1, "rename(a.tmp, a)", "before"),
                                 (1, "rename(a.tmp, a)", "after")]


def test_a_foreign_crash_fault_is_checked_like_every_other_kind():
    assert parse_plan(crash_plan(8, 2, "torn")).kinds() == {"foreign_crash"}
    with pytest.raises(PlanError, match="'when'='sideways' must be one of"):
        parse_plan([{"id": "f", "kind": "foreign_crash", "step": 8, "op_index": 0, "when": "sideways"}])
    with pytest.raises(PlanError, match="needs field 'op_index'"):
        parse_plan([{"id": "f", "kind": "foreign_crash", "step": 8}])


CHILD = """
import json, sys
from pathlib import Path
from trainwreck.faults.foreign import ForeignSave, crash_plan
root, log = Path(sys.argv[1]), open(sys.argv[2], "a")
def record(fault, detail, **extra):
    log.write(json.dumps({"kind": "fault", "fault_id": fault["id"], "detail": detail}) + "\\n"); log.flush()
save = ForeignSave(crash_plan(3, 1, "before"), rank=0, attempt=0, record=record, root=root)
with save.saving(3):
    (root / "model.tmp").write_bytes(b"m")
    (root / "model.tmp").rename(root / "model")
print("survived")
"""


def test_a_real_kill_ends_the_process_with_sigkill_after_writing_its_fault_event(tmp_path):
    log = tmp_path / "events.jsonl"
    (tmp_path / "ckpt").mkdir()
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "ckpt"), str(log)],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "survived" not in child.stdout
    events: list[dict[str, Any]] = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["fault_id"] for e in events] == ["foreign-before-op1"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["model.tmp"]


def test_a_file_written_elsewhere_and_moved_into_the_root_is_counted_as_a_rename(tmp_path):
    root, tmpdir = tmp_path / "ckpt", tmp_path / "tmp"
    root.mkdir(), tmpdir.mkdir()

    def writer() -> None:  # how fsspec's transaction writes: a temporary file, then a move
        (tmpdir / "tmpab12").write_bytes(b"x")
        shutil.move(str(tmpdir / "tmpab12"), str(root / "last.ckpt"))

    assert [op.describe() for op in record_ops(writer, root)] == ["rename(<outside the root>, last.ckpt)"]
    (root / "last.ckpt").unlink()
    save, events = armed(root, 0, "before")
    assert run_armed(save, writer)
    assert not (root / "last.ckpt").exists() and len(events) == 1
