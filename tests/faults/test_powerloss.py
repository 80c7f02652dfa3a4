"""The power-loss model (faults/powerloss.py): one test per rule, on hand-written logs,
then the real reference and rename_no_fsync saves."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwreck.faults.powerloss import BLOCK, CrashState, OpLog, PowerLossRecorder, crash_states, materialise, \
    record_save, states_at, synced
from trainwreck.faults.sweep import SWEEP_CONFIG
from trainwreck.invariants import History
from tests.faults.conftest import CFG, run_plan
from trainwreck.trainer.checkpoint import CheckpointStore, checkpoint_name
from trainwreck.trainer.config import TrainConfig
from trainwreck.rundir.events import EventLog
from trainwreck.trainer.hooks import NoHooks
from trainwreck.trainer.storage import LocalStorage, UnsafePathError

Script = Callable[[PowerLossRecorder], None]


def log_of(root: Path, script: Script, before: dict[str, bytes | None] | None = None) -> OpLog:
    """Materialise `before` under root, then record the calls `script` makes."""
    materialise(before or {}, root)
    recorder = PowerLossRecorder(LocalStorage(root), root)
    recorder.start()
    script(recorder)
    return recorder.log


def final_trees(log: OpLog, cap: int = 10_000) -> list[dict[str, bytes | None]]:
    """Every state the model allows once every op of the log was issued."""
    return [s.tree for s in states_at(log, len(log.ops), seed=0, cap=cap)]


def all_trees(log: OpLog) -> list[dict[str, bytes | None]]:
    return [s.tree for s in crash_states(log, seed=0, cap=10_000)[0]]


# ----- rule 2: unsynced data ---------------------------------------------------------------


def test_unsynced_file_data_can_be_lost_entirely_and_synced_data_cannot(tmp_path: Path) -> None:
    def script(durable: bool) -> Script:
        return lambda s: (s.write("f", b"x" * 100, durable=durable), s.fsync_dir("."))

    unsynced = final_trees(log_of(tmp_path / "a", script(False)))
    assert {t["f"] for t in unsynced} == {b"", b"x" * 100}
    synced_trees = final_trees(log_of(tmp_path / "b", script(True)))
    assert {t["f"] for t in synced_trees} == {b"x" * 100}


def test_unsynced_data_tears_at_block_granularity(tmp_path: Path) -> None:
    data = bytes(range(256)) * (3 * BLOCK // 256) + b"tail"
    log = log_of(tmp_path, lambda s: (s.write("f", data, durable=False), s.fsync_dir(".")))
    assert {t["f"] for t in final_trees(log)} == {b"", data[:BLOCK], data[:2 * BLOCK], data[:3 * BLOCK], data}


# ----- rule 3: unsynced directory entries ----------------------------------------------------


def test_an_unsynced_create_can_be_lost_and_a_synced_one_cannot(tmp_path: Path) -> None:
    unsynced = final_trees(log_of(tmp_path / "a", lambda s: s.write("f", b"1")))
    assert any("f" not in t for t in unsynced) and any("f" in t for t in unsynced)
    synced_trees = final_trees(log_of(tmp_path / "b", lambda s: (s.write("f", b"1"), s.fsync_dir("."))))
    assert all(t.get("f") == b"1" for t in synced_trees)


def test_an_unsynced_rename_can_be_lost_but_is_never_half_done(tmp_path: Path) -> None:
    trees = final_trees(log_of(tmp_path, lambda s: s.rename("a", "b"), before={"a": b"old"}))
    assert {tuple(sorted(t)) for t in trees} == {("a",), ("b",)}


def test_an_unsynced_unlink_can_be_undone(tmp_path: Path) -> None:
    trees = final_trees(log_of(tmp_path, lambda s: s.remove("d"), before={"d": None, "d/f": b"kept"}))
    assert {"d": None, "d/f": b"kept"} in trees and {} in trees


def test_a_directory_rename_can_persist_while_an_earlier_create_in_another_directory_is_lost(tmp_path: Path) -> None:
    log = log_of(tmp_path, lambda s: (s.write("d/new", b"n"), s.rename("a", "b")),
                 before={"d": None, "a": b"1"})
    assert {"d": None, "b": b"1"} in final_trees(log)


def test_ops_of_one_directory_never_persist_out_of_order(tmp_path: Path) -> None:
    log = log_of(tmp_path, lambda s: (s.write("x", b"1"), s.write("y", b"2")))
    trees = all_trees(log)
    assert any("x" in t and "y" not in t for t in trees)  # the check below can see a difference
    assert not any("y" in t and "x" not in t for t in trees)


def test_data_written_before_a_rename_persists_whenever_the_rename_does(tmp_path: Path) -> None:
    data = b"p" * (2 * BLOCK)
    renamed = final_trees(log_of(tmp_path / "a", lambda s: (s.write("t", data, durable=False), s.rename("t", "p"))))
    assert all(t["p"] == data for t in renamed if "p" in t) and any("p" in t for t in renamed)
    # Without the rename the same unsynced write is lost or torn: the rule is what forbids it.
    kept = final_trees(log_of(tmp_path / "b", lambda s: s.write("t", data, durable=False)))
    assert any(t.get("t") not in (None, data) for t in kept)


# ----- rule 1 as a property: synced ops are never lost ---------------------------------------

NAMES = ("a", "b", "d/a", "d/b")
CALLS = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMES), st.integers(0, 3 * BLOCK), st.booleans()),
    st.tuples(st.just("mkdir"), st.just("d")),
    st.tuples(st.just("rename"), st.sampled_from(NAMES + ("d",)), st.sampled_from(NAMES)),
    st.tuples(st.just("remove"), st.sampled_from(NAMES + ("d",))),
    st.tuples(st.just("fsync_dir"), st.sampled_from((".", "d"))),
)


def _play(storage: PowerLossRecorder, calls: list[tuple]) -> None:  # type: ignore[type-arg]
    for call in calls:
        try:
            if call[0] == "write":
                storage.write(call[1], b"w" * call[2], durable=call[3])
            else:
                getattr(storage, call[0])(*call[1:])
        except OSError:
            pass  # an impossible call (a missing source, a file over a directory) changes nothing


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CALLS, max_size=10))
def test_every_crash_state_keeps_every_op_a_later_barrier_covers(calls: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory(prefix="trainwreck-powerloss-prop-") as tmp:
        log = log_of(Path(tmp) / "root", lambda s: _play(s, calls))
    for state in crash_states(log, seed=0, cap=32)[0]:
        assert synced(state.ops) <= state.persisted, state.describe()


def test_the_synced_set_is_not_trivially_empty(tmp_path: Path) -> None:
    """The property above would hold vacuously if `synced` never found anything."""
    log = log_of(tmp_path, lambda s: (s.write("a", b"1"), s.fsync_dir(".")))
    assert {o.describe() for o in log.ops if o.index in synced(tuple(log.ops))} == {"create(a)", "data(a) [1 bytes]"}


# ----- bounds --------------------------------------------------------------------------------


def test_identical_states_are_counted_once_and_the_counts_add_up(tmp_path: Path) -> None:
    states, stats = crash_states(log_of(tmp_path, lambda s: s.write("f", b"1", durable=False)))
    # point 0: {}; point 1 (create): {}, {f: ''}; point 2 (data): {}, {f: ''}, {f: '1'}
    assert (stats.crash_points, stats.generated, stats.duplicates, stats.explored) == (3, 6, 3, 3)
    assert sorted(str(s.tree) for s in states) == sorted(["{}", "{'f': b''}", "{'f': b'1'}"])


def test_a_crash_point_past_the_cap_is_sampled_reproducibly_with_the_seed(tmp_path: Path) -> None:
    log = log_of(tmp_path, lambda s: [s.write(f"f{i}", b"z" * (2 * BLOCK), durable=False) for i in range(6)])
    one, stats = crash_states(log, seed=7, cap=5)
    assert stats.sampled_points > 0 and stats.generated <= 5 * stats.crash_points
    assert stats.generated == stats.duplicates + stats.explored == stats.duplicates + len(one)
    again, _ = crash_states(log, seed=7, cap=5)
    assert [s.digest for s in one] == [s.digest for s in again]
    with pytest.raises(ValueError, match="cap of at least 1"):
        crash_states(log, cap=0)


def test_materialising_refuses_a_path_out_of_the_root(tmp_path: Path) -> None:
    with pytest.raises(UnsafePathError):
        materialise({"../escape": b"x"}, tmp_path / "root")
    assert not (tmp_path / "escape").exists()


# ----- the real writers ----------------------------------------------------------------------


def _select(state: CrashState, root: Path, writer: str) -> tuple[str | None, int | None | str]:
    """Which checkpoint a resume picks on the materialised state, and the commit pointer."""
    materialise(state, root / "checkpoints")
    identity = TrainConfig.from_dict({**SWEEP_CONFIG.to_dict(), "variant": writer}).identity()
    storage = LocalStorage(root / "checkpoints")
    events = EventLog(root / "events" / "a000-r0.jsonl", attempt=0, rank=0, world_size=1)
    store = CheckpointStore(storage, events, NoHooks(), SWEEP_CONFIG.keep_last)
    try:
        chosen = store.select(identity)
    finally:
        events.close()
    return (chosen.name if chosen else None), store.read_pointer()


def test_every_power_cut_during_the_reference_save_leaves_the_committed_checkpoint(tmp_path: Path) -> None:
    states, stats = crash_states(record_save("reference"), seed=0, cap=256)
    assert stats.explored > 10
    new, old = checkpoint_name(16), checkpoint_name(12)
    pointers = set()
    for n, state in enumerate(states):
        chosen, pointer = _select(state, tmp_path / f"s{n}", "reference")
        pointers.add(pointer)
        assert chosen in (old, new), state.describe()
        assert pointer != 16 or chosen == new, f"the commit of step 16 was lost: {state.describe()}"
    assert pointers == {12, 16}  # states before and after the commit were both checked


def test_a_power_cut_can_leave_rename_no_fsync_pointing_at_a_lost_checkpoint(tmp_path: Path) -> None:
    states, _ = crash_states(record_save("rename_no_fsync"), seed=0, cap=256)
    broken = None
    for n, state in enumerate(states):
        chosen, pointer = _select(state, tmp_path / f"s{n}", "rename_no_fsync")
        if pointer == 16 and chosen != checkpoint_name(16):
            broken = state
            break
    assert broken is not None, "no crash state lost the committed step 16"
    print(broken.describe())


def test_rename_no_fsync_is_judged_like_the_reference_on_a_clean_run(tmp_path: Path, golden: History) -> None:
    cfg = TrainConfig.from_dict({**CFG.to_dict(), "variant": "rename_no_fsync"})
    outcome = run_plan([], tmp_path / "run", golden, cfg=cfg)
    reference = run_plan([], tmp_path / "reference", golden)
    verdicts = {name: v.valid for name, v in outcome.judgement.verdicts.items()}
    assert verdicts == {name: v.valid for name, v in reference.judgement.verdicts.items()}, outcome.explain()
    assert all(v is True for v in verdicts.values()), outcome.explain()
    assert outcome.record.outcome == "completed" and outcome.events("save"), outcome.explain()


def test_a_write_that_is_not_durable_skips_the_fsync_and_a_default_one_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    fsynced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(fd), real(fd))[1])
    storage = LocalStorage(tmp_path)
    storage.write("quick", b"1", durable=False)
    assert fsynced == [] and (tmp_path / "quick").read_bytes() == b"1"
    storage.write("safe", b"2")
    assert len(fsynced) == 1
