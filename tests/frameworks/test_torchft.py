"""torchft under the replica-group harness: real jobs of trainer/frameworks/torchft_train.py,
judged from their own events. Skipped without the extra (pip install 'trainwreck[torchft]')."""
from __future__ import annotations

import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("torchft")

from trainwreck.harness.supervise.spec import JobSpec  # noqa: E402
from trainwreck.harness.supervise.supervisor import run_job  # noqa: E402
from trainwreck.harness.supervise.spec import ReplicaGroups  # noqa: E402
from trainwreck.harness.suites.torchft_rows import GROUP_RESTARTS, HANG_TIMEOUT_S, SCRIPT, judge_replica_run  # noqa: E402
from trainwreck.trainer.progress import read_progress  # noqa: E402
from trainwreck.rundir.layout import RunDir, iter_events, read_run_json  # noqa: E402
from tests.harness.conftest import assert_no_leftover_processes  # noqa: E402
from tests.harness.test_loopback import non_loopback  # noqa: E402

SCAN_AT_STEP = 3
LONG_STEPS, LONG_STEP_S = "60", "0.3"
"""Kill rows: the survivor must still be training when the restarted group is back (a restart
took 4-22 s on the shared machine), or that group finds no peer and starts over alone."""
SCAN_DEADLINE_S = 120.0


def job(run_dir: Path, steps: int, *args: str, plan: list[dict[str, Any]] | None = None,
        hang_timeout_s: float = HANG_TIMEOUT_S, **fields: Any) -> JobSpec:
    """Two groups of one rank of the example trainer; `fields` go to its ReplicaGroups target."""
    command = shlex.join([sys.executable, "-m", SCRIPT, "--steps", str(steps), *args])
    return JobSpec(target=ReplicaGroups(command, **fields), plan=plan or [], run_dir=run_dir,
                   hang_timeout_s=hang_timeout_s, max_restarts=GROUP_RESTARTS)


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in iter_events(run_dir) if e["kind"] == kind]


def own_listeners(proc: psutil.Process) -> set[tuple[str, int]]:
    """The listening TCP sockets of one process (not its children)."""
    try:
        conns = getattr(proc, "net_connections", proc.connections)(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()
    return {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}


class LiveScanner(threading.Thread):
    """Once every rank has committed SCAN_AT_STEP updates, lists the listening sockets of this
    process's whole tree (the harness's stores, the lighthouse, every rank's servers)."""

    def __init__(self, run_dir: Path, world_size: int) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.world_size = run_dir, world_size
        self.found: dict[int, set[tuple[str, int]]] | None = None

    def run(self) -> None:
        deadline = time.monotonic() + SCAN_DEADLINE_S
        while time.monotonic() < deadline:
            boards = [read_progress(RunDir(self.run_dir).rank_progress(0, r)) for r in range(self.world_size)]
            if all(b is not None and b.step >= SCAN_AT_STEP for b in boards):
                me = psutil.Process()
                self.found = {p.pid: own_listeners(p) for p in [me, *me.children(recursive=True)]}
                return
            time.sleep(0.05)  # polling the ranks' real progress


class ListenerWatch(threading.Thread):
    """Polls the listening sockets of this process's whole tree every POLL_S while a row runs
    and keeps each one seen with its pid: a server that a restart, a heal or a reconfigure
    starts late (the nightly's rendezvous store) is seen too, not only those alive at one
    instant."""

    POLL_S = 0.25

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[tuple[str, int], int] = {}
        self.polls = 0
        self._stop_polling = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._stop_polling.is_set():
            for proc in [me, *me.children(recursive=True)]:
                for address in own_listeners(proc):
                    self.seen.setdefault(address, proc.pid)
            self.polls += 1
            self._stop_polling.wait(self.POLL_S)

    def stop(self) -> None:
        self._stop_polling.set()
        self.join()


@pytest.fixture(autouse=True)
def loopback_throughout() -> Any:
    """Every row of this module: nothing in its process tree listens off loopback at any
    poll while it runs (issue 26: "no listener off loopback during any torchft row")."""
    watch = ListenerWatch()
    watch.start()
    yield watch
    watch.stop()
    assert watch.seen, f"no listener seen in {watch.polls} poll(s): the row never ran its servers, the check saw nothing"
    off = {address: watch.seen[address] for address in non_loopback(set(watch.seen))}
    assert not off, f"listening beyond loopback during the row (address: pid): {off}"


def test_a_torchft_golden_run_listens_on_loopback_only_and_is_judged_valid(tmp_path: Path) -> None:
    run_dir = tmp_path / "golden"
    scanner = LiveScanner(run_dir, world_size=2)
    scanner.start()
    record = run_job(job(run_dir, 12, "--step-seconds", "0.2"))
    scanner.join()
    assert scanner.found is not None, "the ranks never reached the scan step"
    everything = set().union(*scanner.found.values())
    assert not non_loopback(everything), f"listening beyond loopback: {sorted(everything)}"
    rank_pids = {e["pid"] for e in events(run_dir, "start")}
    for pid in rank_pids:  # the Manager's server and the heal server, each on 127.0.0.1
        assert len(scanner.found.get(pid, set())) >= 2, scanner.found
    assert record.status == "completed" and record.final_step == 12
    assert read_run_json(run_dir)["launcher"] == "replica-groups"  # a registered launcher (harness/registry.py)
    judgement, figures = judge_replica_run(run_dir)
    assert judgement.valid is True, judgement.to_json()
    assert {e["replica_group"] for e in events(run_dir, "step")} == {0, 1}
    assert figures["replayed"] == figures["dropped"] == 0 and figures["uncommitted_steps"] == 0
    assert_no_leftover_processes()  # ranks, lighthouse: all reaped


@pytest.mark.slow
def test_a_group_killed_between_steps_heals_from_its_peer_and_the_survivor_trains_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "kill"
    plan = [{"id": "k1", "kind": "kill", "rank": 1, "step": 10}]
    run_job(job(run_dir, int(LONG_STEPS), "--step-seconds", LONG_STEP_S, plan=plan))
    assert [e["fault_id"] for e in events(run_dir, "fault")] == ["k1"]
    assert events(run_dir, "end")[-1]["group_starts"] == {"0": 1, "1": 2}
    judgement, figures = judge_replica_run(run_dir)
    assert judgement.valid is True, judgement.to_json()
    heals = events(run_dir, "heal")
    assert [h["replica_group"] for h in heals] == [1] and heals[0]["step"] >= 9
    assert figures["replayed"] > 0  # the restarted group replays its shard: measured, not failed
    assert_no_leftover_processes()


@pytest.mark.slow
def test_a_heal_that_skips_the_optimizer_state_is_caught_by_continuity(tmp_path: Path) -> None:
    run_dir = tmp_path / "model-only"
    plan = [{"id": "k1", "kind": "kill", "rank": 1, "step": 10}]
    run_job(job(run_dir, int(LONG_STEPS), "--step-seconds", LONG_STEP_S, "--heal-model-only", plan=plan))
    assert [e["fault_id"] for e in events(run_dir, "fault")] == ["k1"]
    judgement, _ = judge_replica_run(run_dir)
    assert judgement.verdicts["continuity"].valid is False
    assert judgement.verdicts["continuity"].counts["bad_heals"] == 1


@pytest.mark.slow
def test_survivors_that_wait_for_a_group_that_never_returns_fail_progress(tmp_path: Path) -> None:
    run_dir = tmp_path / "min2"
    plan = [{"id": "k1", "kind": "kill", "rank": 1, "step": 5}]
    run_job(job(run_dir, 20, "--min-replicas", "2", "--step-seconds", "0.1", plan=plan, lost_groups=(1,), hang_timeout_s=20.0))
    assert [e["fault_id"] for e in events(run_dir, "fault")] == ["k1"]
    judgement, figures = judge_replica_run(run_dir)
    assert judgement.verdicts["progress"].valid is False
    # it went on quorum after quorum, never committing, until the watchdog stopped it. Its
    # last committed step lands within a millisecond or so of the kill's event, before or
    # after it (seen both ways at load 4-14), so the judge's pause is either None (never
    # committed again) or the pause up to its last decision; the decisions themselves say it:
    stall = figures["stall_s"][0]
    assert (stall is None or stall > 9.0) and figures["steps_alone"] == [0]
    killed_at = events(run_dir, "fault")[0]["t"]
    after = [e for e in events(run_dir, "commit") if e["replica_group"] == 0 and e["t"] > killed_at]
    assert sum(e["committed"] for e in after) <= 1 and after[-1]["t"] - killed_at > 9.0
    assert [e["kind"] for e in events(run_dir, "hang")] == ["hang"]


@pytest.mark.slow
def test_a_job_claiming_exactly_once_with_torchfts_sampler_is_invalid_after_a_restart(tmp_path: Path) -> None:
    run_dir = tmp_path / "claim"
    plan = [{"id": "k1", "kind": "kill", "rank": 1, "step": 10}]
    run_job(job(run_dir, int(LONG_STEPS), "--step-seconds", LONG_STEP_S, "--claim-exactly-once", plan=plan))
    assert [e["fault_id"] for e in events(run_dir, "fault")] == ["k1"]
    judgement, _ = judge_replica_run(run_dir)
    assert judgement.verdicts["coverage"].valid is False
    assert "claims exactly-once" in judgement.verdicts["coverage"].summary
