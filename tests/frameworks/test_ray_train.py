"""Ray Train's rows of `trainwreck frameworks`, run for real (nightly: a row is 1.5-3 minutes on 2 cores).

Each row is the table's own job (harness/suites/frameworks.py, the ray-driver launcher) of the
example trainer trainer/frameworks/examples/ray_train.py, with both data paths. Every assertion
reads the run's own events: the fault fired, what the restarted group restored, and from those
which invariant must have failed; no verdict is remembered. While a row runs, nothing in this
process's tree listens off loopback; after it, no process of it (Ray's gcs, raylet, workers,
agents: each inherits the row's TRAINWRECK_RUN_DIR) is left anywhere on the machine.
Skipped without the extra (pip install 'trainwreck[ray-train]')."""
from __future__ import annotations

import ipaddress
import threading
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

pytest.importorskip("ray.train")

from trainwreck.harness.suites import frameworks  # noqa: E402
from trainwreck.rundir.layout import iter_events  # noqa: E402

pytestmark = pytest.mark.slow
DATA_PATHS = ("ray_train", "ray_train_data")


def off_loopback(addresses: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """The addresses not on loopback; an IPv6 socket bound to the IPv4-mapped 127.0.0.1 (Ray's gRPC
    servers: '::ffff:127.0.0.1') accepts loopback connections only, so it is loopback too."""
    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip)
        mapped = getattr(address, "ipv4_mapped", None)
        return address.is_loopback or (mapped is not None and mapped.is_loopback)

    return {a for a in addresses if not loopback(a[0])}


def row_processes(run_dir: Path) -> list[psutil.Process]:
    """Every process on the machine started for this row: Ray's all inherit its TRAINWRECK_RUN_DIR."""
    mine = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TRAINWRECK_RUN_DIR") == str(run_dir.absolute()):
                mine.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return mine


class RowWatch(threading.Thread):
    """Every 0.5 s while a row runs: the listening sockets of this process's tree, and the most
    processes of the row alive at once."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.listening: dict[tuple[str, int], int] = {}
        self.most = 0
        self.done = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.done.is_set():
            tree = [me, *me.children(recursive=True)]
            for proc in tree:
                try:
                    for c in proc.net_connections(kind="inet"):
                        if c.status == psutil.CONN_LISTEN:
                            self.listening.setdefault((c.laddr.ip, c.laddr.port), proc.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.most = max(self.most, len(row_processes(self.run_dir)))
            self.done.wait(0.5)


def run_row(out: Path, name: str, scenario: str) -> tuple[frameworks.Row, Path]:
    run_dir = out / f"{name}-{scenario}"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    watch = RowWatch(run_dir)
    watch.start()
    try:
        row = frameworks.run_one(frameworks.job_for(frameworks.FRAMEWORKS[name], scenario), out, frameworks.cmd_runner)
    finally:
        watch.done.set()
        watch.join()
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert watch.most >= 3, f"saw at most {watch.most} process(es) of the row: the check saw nothing"
    assert after <= before, f"descendants left by the row: {sorted(after - before)}"
    assert row_processes(run_dir) == [], "Ray processes of the row still alive"
    assert watch.listening, "no listener seen while the row ran (Ray's gcs and raylet listen)"
    off = off_loopback(set(watch.listening))
    assert not off, f"listening beyond loopback (address: pid): { {a: watch.listening[a] for a in off} }"
    return row, run_dir


def events(run_dir: Path, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in iter_events(run_dir) if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("ray-train-rows")


@pytest.fixture(scope="module", params=DATA_PATHS)
def golden(request: pytest.FixtureRequest, out: Path) -> tuple[str, Path]:
    name = request.param
    row, run_dir = run_row(out, name, "golden")
    steps = {r: sorted(e["step"] for e in events(run_dir, "step", rank=r)) for r in (0, 1)}
    assert steps == {0: list(range(1, 13)), 1: list(range(1, 13))}
    assert [e["step"] for e in events(run_dir, "save")] == [3, 6, 9, 12]
    ids = [i for e in events(run_dir, "batch") for i in e["samples"]]
    assert sorted(ids[:64]) == list(range(64)) or len(set(ids)) == 64  # real per-sample ids, every one seen
    assert row.valid is True, row
    return name, run_dir


def restarted(run_dir: Path) -> list[dict[str, Any]]:
    """The restores of attempt 1 (Ray's restarted group); [] when it started fresh."""
    assert events(run_dir, "start", attempt=1), "Ray never restarted the worker group"
    return events(run_dir, "restore", attempt=1)


def lost_an_announced_save(run_dir: Path, restores: list[dict[str, Any]]) -> bool:
    """Attempt 0 announced a save that attempt 1 neither restored (nor a newer one) nor rejected."""
    saves = [e["step"] for e in events(run_dir, "save", attempt=0)]
    newest_restored = max((e["step"] for e in restores), default=0)
    return bool(saves) and max(saves) > newest_restored and not events(run_dir, "reject", attempt=1)


def test_a_worker_sigkilled_mid_epoch_is_restarted_by_ray_and_judged_from_what_it_restored(
        golden: tuple[str, Path], out: Path) -> None:
    name, _ = golden
    row, run_dir = run_row(out, name, "kill-mid-epoch")
    fired = events(run_dir, "fault", fault_id="kill-mid-epoch")
    assert fired and fired[0]["attempt"] == 0 and fired[0]["rank"] == 1
    restores = restarted(run_dir)
    assert max(e["step"] for e in events(run_dir, "step", attempt=1)) == 12
    lost = lost_an_announced_save(run_dir, restores)
    assert ("atomicity" in row.invalid) == lost, (row, restores)


def test_a_worker_killed_inside_ray_train_report_while_persisting_leaves_ray_the_previous_checkpoint(
        golden: tuple[str, Path], out: Path) -> None:
    name, _ = golden
    row, run_dir = run_row(out, name, "kill-in-save")
    fired = events(run_dir, "fault", fault_id="kill-in-save")
    assert fired and fired[0]["rank"] == 0 and fired[0]["attempt"] == 0, fired
    assert not events(run_dir, "save", attempt=0, step=6), "the torn checkpoint was announced"
    restores = restarted(run_dir)
    assert all(e["step"] < 6 for e in restores), restores  # Ray never registered the torn one
    assert ("atomicity" in row.invalid) == lost_an_announced_save(run_dir, restores), (row, restores)


def test_a_hung_worker_is_found_by_the_watchdog_not_by_ray(golden: tuple[str, Path], out: Path) -> None:
    name, _ = golden
    row, run_dir = run_row(out, name, "hang")
    assert events(run_dir, "fault", fault_id="hang", attempt=0)
    hangs = events(run_dir, "hang")
    assert hangs, "the watchdog never saw the hung worker"
    first_restart = min(e["t"] for e in events(run_dir, "start", attempt=1))
    assert hangs[0]["t"] < first_restart  # Ray restarted the group only after the watchdog killed it
    assert max(e["step"] for e in events(run_dir, "step", attempt=1)) == 12
    assert ("hang" in row.invalid) is False, row


def test_a_corrupted_newest_checkpoint_is_judged_by_what_rays_restarted_group_restored_instead(
        golden: tuple[str, Path], out: Path) -> None:
    name, _ = golden
    row, run_dir = run_row(out, name, "corrupt-newest")
    corrupt = events(run_dir, "fault", fault_id="cut-newest")
    assert corrupt, "the corruption found nothing to damage"
    damaged = corrupt[0]["checkpoint"]
    damaged_step = next(e["step"] for e in events(run_dir, "save", attempt=0) if e["checkpoint"] == damaged)
    restores = restarted(run_dir)
    skipped = not events(run_dir, "reject", attempt=1) and all(e["step"] < damaged_step for e in restores)
    assert ("atomicity" in row.invalid) == skipped, (row, restores)  # passed over without a reject
    if not restores:  # Ray offered nothing: a fresh start, which atomicity also objects to
        assert "atomicity" in row.invalid, row
