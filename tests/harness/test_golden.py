"""The golden cache heals itself: damaged entries are rebuilt, builds of a killed harness are swept."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from trainwreck.harness.judge import golden
from trainwreck.harness.judge.golden import BUILD_PREFIX, golden_run, remove_stale_builds
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.progress import read_progress
from tests.harness.conftest import assert_no_leftover_processes

CFG = TrainConfig.tiny(total_steps=4)
WORLD = 2
SYNC_DEADLINE_S = 240.0


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One intact golden entry, built once and copied by each test that damages it."""
    return golden_run(CFG, WORLD, tmp_path_factory.mktemp("golden"))


def rank_events(entry: Path) -> Path:
    return sorted((entry / "events").glob("a*.jsonl"))[0]


def truncate_events(entry: Path) -> None:
    path = rank_events(entry)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def delete_run_json(entry: Path) -> None:
    (entry / "run.json").unlink()


def remove_a_step(entry: Path) -> None:
    path = rank_events(entry)
    lines = path.read_text().splitlines(keepends=True)
    step_line = next(i for i, line in enumerate(lines) if json.loads(line).get("kind") == "step")
    path.write_text("".join(lines[:step_line] + lines[step_line + 1:]))


@pytest.mark.parametrize("damage", [truncate_events, delete_run_json, remove_a_step], ids=lambda f: f.__name__)
def test_a_damaged_golden_entry_is_rebuilt_and_replaced(damage: Callable[[Path], None], pristine: Path,
                                                       tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(pristine.parent, cache)
    entry = cache / pristine.name
    damage(entry)
    healed = golden_run(CFG, WORLD, cache)
    assert healed == entry  # replaced in place, so every later run finds the good one
    assert json.loads((healed / "run.json").read_text())
    good, now = rank_events(pristine).read_text(), rank_events(healed).read_text()
    assert [json.loads(x)["kind"] for x in now.splitlines()] == [json.loads(x)["kind"] for x in good.splitlines()]
    assert not list(cache.glob(f"{BUILD_PREFIX}*"))
    assert golden_run(CFG, WORLD, cache) == entry  # and it is served from the cache from now on
    assert_no_leftover_processes()


def test_an_intact_golden_entry_is_served_without_a_rebuild(pristine: Path) -> None:
    before = (pristine / golden.MANIFEST).stat().st_mtime_ns
    assert golden_run(CFG, WORLD, pristine.parent) == pristine
    assert (pristine / golden.MANIFEST).stat().st_mtime_ns == before


def dead_process() -> psutil.Process:
    proc = psutil.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc


def test_a_stale_build_of_a_dead_owner_is_removed_and_a_live_one_is_kept(tmp_path: Path) -> None:
    me = psutil.Process()
    gone = dead_process()
    started = lambda p: int(p.create_time() * 1000)  # noqa: E731
    live = tmp_path / f"{BUILD_PREFIX}k-{me.pid}-{started(me)}-aaaaaa"
    dead = tmp_path / f"{BUILD_PREFIX}k-{gone.pid}-{started(gone)}-bbbbbb"
    reused = tmp_path / f"{BUILD_PREFIX}k-{me.pid}-{started(me) - 1}-cccccc"  # our pid, another start
    for path in (live, dead, reused):
        (path / "events").mkdir(parents=True)
    assert sorted(remove_stale_builds(tmp_path)) == sorted([dead.name, reused.name])
    assert live.is_dir() and not dead.exists() and not reused.exists()


def test_a_harness_killed_during_a_golden_build_leaves_no_build_directory_behind(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code = (f"from trainwreck.harness.judge.golden import golden_run; from trainwreck.trainer.config import TrainConfig;"
            f"golden_run(TrainConfig.tiny(total_steps=200), {WORLD}, __import__('pathlib').Path({str(cache)!r}))")
    harness = psutil.Popen([sys.executable, "-c", code], start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        build = wait_for_a_training_build(cache, harness)
        tree = harness.children(recursive=True)
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
    finally:
        kill_tree(harness)
    for proc in tree:  # ranks die with their parent (PDEATHSIG); make sure, they are ours
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)
    assert build.is_dir()  # the kill did leave a half build behind
    entry = golden_run(CFG, WORLD, cache)
    assert not list(cache.glob(f"{BUILD_PREFIX}*")) and entry.is_dir()
    assert_no_leftover_processes()


def wait_for_a_training_build(cache: Path, harness: psutil.Process) -> Path:
    """The build directory, once one of its ranks has published a training step."""
    deadline = time.monotonic() + SYNC_DEADLINE_S
    while time.monotonic() < deadline and harness.is_running():
        for build in cache.glob(f"{BUILD_PREFIX}*"):
            boards = [read_progress(p) for p in build.glob("progress/*.bin")]
            if any(b is not None and b.step >= 1 for b in boards):
                return build
        time.sleep(0.05)  # polling real progress, not standing in for it
    raise AssertionError("the golden build never reached a training step")


def kill_tree(proc: psutil.Process) -> None:
    if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
        proc.kill()
    proc.wait()
