"""Ray Train's rows of `trainwreck frameworks`, run for real (nightly: a row is 1.5-3 minutes on 2 cores).

Each row is the table's own job (harness/suites/frameworks.py, the ray-driver launcher) of the
example trainer trainer/frameworks/examples/ray_train.py, with both data paths, on two simulated
Ray nodes (two raylets seen alive at once in every row). Every assertion reads the run's own
events: the fault fired, what the restarted group restored, and from those which invariant must
have failed; no verdict is remembered. While a row runs, nothing in this process's tree listens
off loopback; after it, no process of it (Ray's gcs, raylets, workers, agents: each inherits the
row's TRAINWRECK_RUN_DIR) is left anywhere on the machine, and Ray left nothing in $HOME (its
auth token) or the temporary root (its session folder). Skipped without the extra (pip install
'trainwreck[ray-train]')."""
from __future__ import annotations

import ipaddress
import os
import tempfile
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


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def ray_folders() -> set[str]:
    """The Ray folders (`simulated_cluster`'s tw-ray-*) under the temporary roots a driver may use."""
    return {str(p) for root in {tempfile.gettempdir(), "/tmp"} for p in Path(root).glob("tw-ray-*")}


class RowWatch(threading.Thread):
    """Every 0.5 s while a row runs: the listening sockets of this process's tree, and the most
    processes of the row alive at once."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.listening: dict[tuple[str, int], int] = {}
        self.most = 0
        self.raylets = 0
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
            procs = row_processes(self.run_dir)
            self.most = max(self.most, len(procs))
            self.raylets = max(self.raylets, sum(1 for p in procs if _name(p) == "raylet"))
            self.done.wait(0.5)


def run_row(out: Path, name: str, scenario: str) -> tuple[frameworks.Row, Path]:
    run_dir = out / f"{name}-{scenario}"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    folders = ray_folders()
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
    assert watch.raylets == 2, f"saw {watch.raylets} raylet(s) alive at once: the row ran on two simulated nodes"
    assert ray_folders() <= folders, f"Ray's folder left behind: {ray_folders() - folders}"
    assert not (Path(os.environ["HOME"]) / ".ray").exists(), "Ray wrote its auth token into $HOME"
    assert watch.listening, "no listener seen while the row ran (Ray's gcs and raylet listen)"
    off = off_loopback(set(watch.listening))
    assert not off, f"listening beyond loopback (address: pid): { {a: watch.listening[a] for a in off} }"
    return row, run_dir


def events(run_dir: Path, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in iter_events(run_dir) if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # A $HOME of the module's own, inherited by every driver: Ray's default token file would be
    # $HOME/.ray/auth_token, which run_row asserts never appears.
    home, saved = tmp_path_factory.mktemp("home"), os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        yield tmp_path_factory.mktemp("ray-train-rows")
    finally:
        if saved is None:
            del os.environ["HOME"]
        else:
            os.environ["HOME"] = saved


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
    saves = {e["checkpoint"]: e["step"] for e in events(run_dir, "save", attempt=0)}
    rejected = {e["checkpoint"] for e in events(run_dir, "reject", attempt=1)}
    newest_restored = max((e["step"] for e in restores), default=0)
    return any(step > newest_restored and name not in rejected for name, step in saves.items())


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


def test_corrupt_newest_damages_the_checkpoint_ray_registered_and_the_restarted_group_rejects_it(
        golden: tuple[str, Path], out: Path) -> None:
    name, _ = golden
    row, run_dir = run_row(out, name, "corrupt-newest")
    corrupt = events(run_dir, "fault", fault_id="cut-newest")
    if not corrupt:  # Ray had registered nothing when its old group was gone: nothing to damage, and said so
        assert "cut-newest" not in row.fired and "no checkpoint registered by Ray" in row.reason, row
        return
    damaged = corrupt[0]["checkpoint"]
    rejects = events(run_dir, "reject", attempt=1)
    # Ray handed the new group exactly what the harness damaged: its registered newest, every rank refusing it
    assert {e["checkpoint"] for e in rejects} == {damaged} and {e["rank"] for e in rejects} == {0, 1}, rejects
    restores = restarted(run_dir)
    assert all(e["checkpoint"] < damaged for e in restores), restores  # an older registered one, or none
    assert max(e["step"] for e in events(run_dir, "step", attempt=1)) == 12
    assert ("atomicity" in row.invalid) == lost_an_announced_save(run_dir, restores), (row, restores)


def removed_node(run_dir: Path) -> dict[str, Any]:
    """The node-loss fault: the harness recorded it once the driver's cluster.remove_node had returned."""
    (fired,) = events(run_dir, "fault", fault_id="remove-node")
    assert fired["fault_kind"] == "remove_node" and fired["attempt"] == 0 and fired["node_id"], fired
    assert fired["ranks"] and len(fired["pids"]) == len(fired["ranks"]), "the node took no rank with it"
    return fired


def node_loss_row(golden: tuple[str, Path], out: Path, scenario: str, said: str,
                  world_size: int) -> tuple[Any, Path, list[dict[str, Any]]]:
    """A node-loss row: the fault names what happened to the node (`said`), Ray restarted the group at
    `world_size` and it trained to the end; atomicity fails exactly when an announced save was lost."""
    row, run_dir = run_row(out, golden[0], scenario)
    assert said in removed_node(run_dir)["detail"]
    restores = restarted(run_dir)
    assert {e["world_size"] for e in events(run_dir, "step", attempt=1)} == {world_size}
    assert max(e["step"] for e in events(run_dir, "step", attempt=1)) == 12
    assert ("atomicity" in row.invalid) == lost_an_announced_save(run_dir, restores), (row, restores)
    return row, run_dir, restores


def test_a_simulated_node_removed_mid_epoch_takes_its_worker_and_ray_restarts_the_group_on_a_new_node(
        golden: tuple[str, Path], out: Path) -> None:
    node_loss_row(golden, out, "remove-node", "a new node to replace it", world_size=2)


def test_a_node_lost_for_good_shrinks_the_elastic_group_to_one_worker_with_the_same_global_batch(
        golden: tuple[str, Path], out: Path) -> None:
    # Ray's ElasticScalingPolicy restarts the group with the one worker the remaining node can hold.
    row, run_dir, _ = node_loss_row(golden, out, "world-size", "not replaced", world_size=1)
    assert {e["rank"] for e in events(run_dir, "start", attempt=1)} == {0}
    # One worker draws another order than two (the loader: prepare_data_loader adds its DistributedSampler
    # only above one worker; the dataset: one shard instead of two), so its batches differ from golden's.
    resumed, before = global_batches(run_dir, attempt=1), global_batches(golden[1], attempt=0)
    differs = any(resumed[step] != before[step] for step in resumed)
    assert ("coverage" in row.invalid) == differs, (row, differs)


def global_batches(run_dir: Path, attempt: int) -> dict[int, frozenset[int]]:
    """Each update's global batch (every rank's sample ids) in `attempt`."""
    batches: dict[int, set[int]] = {}
    for e in events(run_dir, "batch", attempt=attempt):
        batches.setdefault(e["step"], set()).update(e["samples"])
    return {step: frozenset(ids) for step, ids in batches.items()}
