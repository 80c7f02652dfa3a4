"""The Ray engine on a simulated two-node cluster (ray.cluster_utils.Cluster on this machine):
plans from both nodes in one casebook with the local engine's verdicts, every listener on
loopback, and a worker node lost mid-campaign costing no plan and duplicating none.

Slow (a cluster is a dozen processes and ~10 s to start) and skipped without the [ray]
extra. Every cluster is shut down in the fixture's teardown, which then checks that no
gcs_server or raylet it started is still alive.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

# Before Ray is imported: its single-machine switch makes every node advertise and bind 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from trainwreck.harness.suites.campaign import OUTCOME, Campaign, CampaignSpec  # noqa: E402
from trainwreck.harness.suites.engines import EngineOptions, Outcome  # noqa: E402
from trainwreck.harness.suites.rayengine import WORK_DIR, RayEngine  # noqa: E402

pytestmark = pytest.mark.slow
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
RAY_DAEMONS = ("gcs_server", "raylet")


def ray_daemons() -> dict[int, str]:
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() in RAY_DAEMONS:
                found[proc.pid] = proc.name()
        except psutil.NoSuchProcess:
            continue
    return found


def listeners() -> list[tuple[int, str, str, int]]:
    """(pid, name, address, port) of every listening inet socket in this process's tree."""
    found = []
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            found += [(proc.pid, proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


class TwoNodes:
    def __init__(self, cluster: Cluster, workers: list[Any], tmp: Path) -> None:
        self.cluster, self.workers, self.tmp = cluster, workers, tmp

    def work_dir(self, node: Any) -> Path:
        return self.tmp / WORK_DIR / node.node_id[:16]

    def running_plans(self, node: Any) -> list[Path]:
        """Plan directories a node is in the middle of: run.json written, verdicts.json not yet."""
        return [p.parent for p in self.work_dir(node).glob("plan-*-*/plan-*/run.json")
                if not (p.parent / "verdicts.json").exists()]


@pytest.fixture
def two_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoNodes]:
    # A short temporary root: Ray's unix socket paths live under it and must stay under 108 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="twray-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(tmp))  # inherited by every node's raylet and workers
    monkeypatch.setenv("RAY_TMPDIR", str(tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        # Notice a lost node within seconds, not the default ~30 s.
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
    started: dict[int, str] = {}
    try:
        workers = [cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1") for _ in range(2)]
        cluster.wait_for_nodes()
        started = ray_daemons()
        assert sorted(Counter(started.values()).items()) == [("gcs_server", 1), ("raylet", 3)]
        yield TwoNodes(cluster, workers, tmp)
    finally:
        ray.shutdown()
        cluster.shutdown()
        survivors = [pid for pid in started if psutil.pid_exists(pid) and
                     psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        shutil.rmtree(tmp, ignore_errors=True)
        assert not survivors, f"Ray daemons outlived the cluster: {survivors}"


COMPARE_SEED, COMPARE_PLANS = 49, 6
"""Seed 49's first six plans are all DDP on 2 ranks (they fit this 2-core machine under load):
two without faults, then kill; comm_fail + storage_throttle; torn_write; torn_write. Seed 6,
used before, drew FSDP plans growing to 4 ranks under the 2 s hang timeout, which raised a
false hang alarm on both engines at load average ~19; its fault-free plans proved nothing more."""


def chaos_args(out: Path, engine: str, address: str | None = None, plans: int = COMPARE_PLANS) -> argparse.Namespace:
    return argparse.Namespace(budget="10m", plans=plans, seed=COMPARE_SEED, out=out, launcher="warm", backend="auto",
                              engine=engine, address=address, cpus_per_rank=1.0, resume=None)


def verdicts(run_dir: Path) -> dict[str, Any]:
    return {name: v["valid"] for name, v in json.loads((run_dir / "verdicts.json").read_text())["verdicts"].items()}


def test_a_two_node_cluster_judges_every_plan_with_the_local_engine_s_verdicts_on_loopback_only(
        two_nodes: TwoNodes, tmp_path: Path, golden_cache: Path, warm_launcher: Any,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.harness.commands import chaos
    from trainwreck.harness.judge.cache_dir import CACHE_ENV

    wide = [(pid, name, ip, port) for pid, name, ip, port in listeners() if ip not in LOOPBACK]
    assert not wide, f"the local cluster listens beyond loopback: {wide}"
    assert {name for _, name, _, _ in listeners()} >= set(RAY_DAEMONS), "the check saw the daemons it guards"

    assert chaos.main(chaos_args(tmp_path / "ray", "ray", two_nodes.cluster.address)) == 0
    printed = capsys.readouterr().out
    monkeypatch.setenv(CACHE_ENV, str(golden_cache))
    assert chaos.main(chaos_args(tmp_path / "local", "local")) == 0

    ray_runs = sorted((tmp_path / "ray").glob("plan-*"))
    local_runs = sorted((tmp_path / "local").glob("plan-*"))
    assert [p.name for p in ray_runs] == [p.name for p in local_runs] == [f"plan-{i:04d}" for i in range(1, COMPARE_PLANS + 1)]
    faults = 0
    for on_ray, here in zip(ray_runs, local_runs):
        ray_outcome, local_outcome = (json.loads((p / OUTCOME).read_text()) for p in (on_ray, here))
        assert ray_outcome["case"] == local_outcome["case"], "the same seed draws the same plan on both engines"
        assert verdicts(on_ray) == verdicts(here) and ray_outcome["valid"] == local_outcome["valid"]
        faults += len(ray_outcome["case"]["plan"])
    assert faults >= 5, "the compared plans inject faults (each fired: the runs are VALID, not UNKNOWN)"
    nodes = Counter(json.loads((p / "run.json").read_text())["node"]["id"] for p in ray_runs)
    assert set(nodes) == {w.node_id for w in two_nodes.workers}, "plans ran on both worker nodes"
    book = (tmp_path / "ray" / "casebook" / "index.md").read_text()
    for worker in two_nodes.workers:
        assert f"{worker.node_id[:8]} (127.0.0.1): {nodes[worker.node_id]} run(s)" in book
    assert "plans per node:" in printed
    # One golden build per (config, world size), installed on the nodes, never rebuilt there.
    keys = {p.name for node in two_nodes.workers for p in (two_nodes.work_dir(node) / "golden").iterdir()
            if not p.name.startswith(".")}
    assert len(keys) == len({(o["case"]["parallelism"], o["case"]["world_sizes"][0])
                             for o in (json.loads((p / OUTCOME).read_text()) for p in ray_runs)})
    assert {p.name for p in (tmp_path / "ray" / "golden").iterdir()} == keys, "the golden runs came back too"


def test_a_worker_node_lost_mid_campaign_costs_no_plan_and_judges_none_twice(
        two_nodes: TwoNodes, tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    killed: list[tuple[Any, list[Path]]] = []
    live: list[tuple[int, str, str, int]] = []

    def kill_a_busy_node(outcome: Outcome) -> None:
        if killed:
            return
        busy, running = wait_for_a_busy_node(two_nodes)
        two_nodes.cluster.remove_node(busy, allow_graceful=False)  # its raylet and workers SIGKILLed
        killed.append((busy, running))
        live.extend(listeners())  # the driver connected, the other node's workers and ranks running

    engine = RayEngine(EngineOptions(address=two_nodes.cluster.address))
    try:
        outcomes = Campaign(engine, out, CampaignSpec(seed=9), kill_a_busy_node).run(budget_s=600, plans=6)
    finally:
        engine.close()

    (victim, cut), = killed
    assert {name for _, name, _, _ in live} >= set(RAY_DAEMONS)
    assert not [entry for entry in live if entry[2] not in LOOPBACK], live
    assert cut, "the node was killed in the middle of a plan"
    cut_index = int(cut[0].name.split("-")[1])
    assert [o.index for o in outcomes] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in out.glob("plan-*")) == [f"plan-000{i}" for i in range(1, 7)]
    assert not list(out.glob(".incoming-*")), "no half-received plan is left behind"
    for o in outcomes:
        assert (o.run_dir / "verdicts.json").exists() and (o.run_dir / OUTCOME).exists()
        assert o.valid is True, (o.index, o.run_dir)
    by_index = {o.index: o for o in outcomes}
    assert by_index[cut_index].node["id"] != victim.node_id, "the cut plan was judged again on the survivor"
    assert cut[0].exists() and not (cut[0] / "verdicts.json").exists(), "the partial run stayed on the dead node"


def wait_for_a_busy_node(nodes: TwoNodes, timeout_s: float = 120.0) -> tuple[Any, list[Path]]:
    """A worker node in the middle of a plan (its run directory half written) and that plan, polled for."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node in nodes.workers:
            running = nodes.running_plans(node)
            if running:
                return node, running
        time.sleep(0.05)
    raise AssertionError("no worker node started a plan within the timeout")


def test_a_ray_driver_killed_mid_campaign_resumes_on_the_cluster_without_rerunning_finished_plans(
        two_nodes: TwoNodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import signal
    import subprocess
    import sys
    import time

    from trainwreck.harness import cli

    out, address = tmp_path / "campaign", two_nodes.cluster.address
    command = ["chaos", "--engine", "ray", "--address", address, "--plans", "4", "--budget", "10m"]
    driver = subprocess.Popen([sys.executable, "-m", "trainwreck.harness.cli", *command, "--seed", "3",
                               "--out", str(out)], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob(f"plan-*/{OUTCOME}")):  # a plan judged: kill the driver with others in flight
            assert driver.poll() is None and time.monotonic() < deadline, "the driver ended before a plan"
            time.sleep(0.05)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    judged = {p.parent.name: p.stat().st_ino for p in out.glob(f"plan-*/{OUTCOME}")}
    assert 0 < len(judged) < 4

    assert cli.main([*command, "--resume", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"resuming, {len(judged)} plan(s) already judged" in printed
    assert {name: (out / name / OUTCOME).stat().st_ino for name in judged} == judged, "finished plans were rerun"
    assert sorted(p.name for p in out.glob("plan-*")) == [f"plan-000{i}" for i in range(1, 5)]
    assert all((p / OUTCOME).exists() for p in out.glob("plan-*")) and not list(out.glob(".incoming-*"))
    rerun = sorted(int(line[1:5]) for line in printed.splitlines() if line.startswith("["))
    assert rerun == sorted(i for i in range(1, 5) if f"plan-000{i}" not in judged)
