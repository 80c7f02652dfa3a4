"""Nothing the harness starts listens beyond loopback: every launcher's stores (and gloo) stay on 127.0.0.1."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.progress import read_progress
from trainwreck.rundir.layout import RunDir
from tests.harness.conftest import assert_no_leftover_processes, harness_events

LOOPBACK = {"127.0.0.1", "::1"}
HELD_AT = 3
SYNC_DEADLINE_S = 240.0  # ranks are fresh interpreters importing torch on a shared CPU


def listening_addresses(root: psutil.Process) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of `root` and all its descendants."""
    found = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            # psutil >= 6 renamed connections() to net_connections()
            conns = getattr(proc, "net_connections", proc.connections)(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found.update((c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN)
    return found


def non_loopback(addresses: set[tuple[str, int]]) -> set[tuple[str, int]]:
    return {a for a in addresses if a[0] not in LOOPBACK}


class HeldRunScanner(threading.Thread):
    """Waits until every rank has reached HELD_AT (a hang fault then holds them), then
    lists the listening sockets of the whole harness tree, while the run is live."""

    def __init__(self, run_dir: Path, world_size: int) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.world_size = run_dir, world_size
        self.addresses: set[tuple[str, int]] | None = None

    def held(self) -> bool:
        boards = [read_progress(RunDir(self.run_dir).rank_progress(0, r)) for r in range(self.world_size)]
        return all(b is not None and b.step >= HELD_AT for b in boards)

    def run(self) -> None:
        deadline = time.monotonic() + SYNC_DEADLINE_S
        while time.monotonic() < deadline:
            if self.held():
                self.addresses = listening_addresses(psutil.Process())
                return
            time.sleep(0.05)  # polling real progress, not standing in for it


def test_the_listening_socket_check_flags_a_socket_on_every_interface() -> None:
    import socket

    with socket.socket() as wide, socket.socket() as narrow:
        wide.bind(("0.0.0.0", 0)); wide.listen()
        narrow.bind(("127.0.0.1", 0)); narrow.listen()
        found = listening_addresses(psutil.Process())
        assert ("0.0.0.0", wide.getsockname()[1]) in non_loopback(found)
        assert ("127.0.0.1", narrow.getsockname()[1]) in found - non_loopback(found)


# The warm launcher runs in the default selection (its ranks are forked: a short hang
# timeout is enough); fresh interpreters import torch first, so those run nightly.
@pytest.mark.parametrize("launcher", ["warm", pytest.param("spawn", marks=pytest.mark.slow),
                                      pytest.param("torchrun", marks=pytest.mark.slow)])
def test_a_live_run_listens_on_loopback_only_with_every_launcher(launcher: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    plan = [{"id": "hold", "kind": "hang", "rank": 1, "step": HELD_AT, "expect": "hang"}]
    scanner = HeldRunScanner(run, world_size=2)
    scanner.start()
    run_job(JobSpec(config=TrainConfig.tiny(total_steps=10), world_sizes=(2,), plan=plan, launcher=launcher,
                    run_dir=run, max_restarts=0, hang_timeout_s=3.0 if launcher == "warm" else 15.0))
    scanner.join()
    assert scanner.addresses is not None, "the ranks never reached the held step"
    assert scanner.addresses, "no listening socket found: the check would pass vacuously"
    assert not non_loopback(scanner.addresses), f"listening beyond loopback: {sorted(scanner.addresses)}"
    assert [e["kind"] for e in harness_events(run, "hang")] == ["hang"]  # the fault held the ranks
    assert_no_leftover_processes()
