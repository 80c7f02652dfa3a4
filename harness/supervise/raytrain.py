"""Supervising a Ray Train job: the driver's `TorchTrainer` owns the restarts, the harness watches.

Ray Train restarts the whole worker group itself (``FailureConfig(max_failures)``), as torchrun's
agent does, so this is `TorchrunSupervisor` with a different agent: one driver process (the job's
command, e.g. trainer/frameworks/examples/ray_train.py) that starts a local Ray instance on
127.0.0.1 and runs the trainer. The workers' probes number the groups (attempt 0, 1, ... :
trainer/frameworks/ray_train.py) and publish progress boards under those numbers; the harness reads
the boards to learn the workers' pids, fires the plan's external faults at them, detects hangs
and SIGKILLs the hung workers (Ray sees dead actors and restarts the group).

The driver runs its workers on two simulated Ray nodes (a `ray.cluster_utils.Cluster`), so a
planned ``node_loss`` is a real node removal: the harness asks the driver over its node-control
FIFO (trainer/frameworks/ray_nodes.py), the driver calls `cluster.remove_node` on the worker
node and answers with the pids that ran there, and the `fault` event (written once the node is
gone) names the ranks it took. The job's world sizes reach the driver as TRAINWRECK_MIN_WORKERS:
a schedule that shrinks (2, 1) makes its group elastic, and attempt N is watched at the size the
schedule names for it.

Between attempts: Ray restarts the group without asking anyone, so a planned ``corrupt`` of
attempt N+1 is applied once every worker of attempt N is gone (Ray tears the old group down only
after its controller has handled the failure, so what it registered by then is what it will hand
the new group) and before the new group has started (a restart takes seconds: new actors import
torch). What it damages is the checkpoint Ray registered last (`registered_newest`, from the
controller's own snapshot), not the newest the workers announced: Ray forgets a report it had not
polled yet (docs/FRAMEWORKS.md), and damaging a checkpoint Ray will never hand out tests nothing.

The driver's environment carries TRAINWRECK_RUN_DIR and TRAINWRECK_HOOKS into the workers
(runtime_env env_vars) and the restart budget as TRAINWRECK_MAX_RESTARTS (the script's
FailureConfig). Ray's processes (gcs, raylet, workers, its agents) are the driver's descendants:
`kill_all` ends the driver's group and every descendant.
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Callable

import psutil

from trainwreck.faults.between_attempts import corrupt_before
from trainwreck.faults.foreign import HOOKS_FACTORY
from trainwreck.faults.external import ExternalFault
from trainwreck.harness.launch.procs import child_env
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.torchrun import TorchrunSupervisor
from trainwreck.harness.supervise.watchdog import Watchdog
from trainwreck.rundir.files import SMALL_LIMIT, read_json
from trainwreck.rundir.layout import RunDir
from trainwreck.trainer.frameworks.ray_nodes import request_node_removal
from trainwreck.trainer.frameworks.ray_train import remove_session

STORAGE = "ray_storage/trainwreck"
"""Where the example job's checkpoints are, under the run directory (its RunConfig's storage_path/name)."""
DRIVER_LOG = "ray_driver.log"
SNAPSHOT = "checkpoint_manager_snapshot.json"
"""Ray Train v2's controller state in the storage path (ray/train/v2/_internal/constants.py
CHECKPOINT_MANAGER_SNAPSHOT_FILENAME), rewritten whenever it registers a checkpoint."""
REMOVAL_TIMEOUT_S = 60.0
"""How long the driver may take to remove a node (its raylet is given time to shut down gracefully)."""
GROUP_GONE_TIMEOUT_S = 60.0
"""How long Ray may take to tear down a failed group (its health check polls every 2 s)."""


def registered_newest(run_dir: Path) -> str | None:
    """The checkpoint folder Ray's controller registered last (the one `ray.train.get_checkpoint()`
    hands the next group), from its snapshot in the job's storage; None before it registered any."""
    try:  # Ray writes it inside the run directory: read bounded, and never through a link out of it
        state = read_json(Path(run_dir) / STORAGE / SNAPSHOT, SMALL_LIMIT, root=run_dir)
    except (OSError, ValueError):
        return None
    latest = state.get("latest_checkpoint_result") if isinstance(state, dict) else None
    name = latest.get("checkpoint_dir_name") if isinstance(latest, dict) else None
    return name if isinstance(name, str) else None


def on_registered(plan: list[dict[str, Any]], attempt: int, newest: str | None) -> list[dict[str, Any]]:
    """The plan with attempt `attempt`'s corruptions of "newest" aimed at Ray's registered newest
    (a name that is no folder when Ray registered none: the corruption then records that it found nothing)."""
    def aimed(fault: dict[str, Any]) -> dict[str, Any]:
        if fault.get("kind") != "corrupt" or fault.get("attempt", 1) != attempt or fault.get("target", "newest") != "newest":
            return fault
        return {**fault, "target": newest or "(no checkpoint registered by Ray)"}

    return [aimed(f) for f in plan]


def driver_env(run_dir: Path, max_restarts: int, world_sizes: tuple[int, ...] = (2,)) -> dict[str, str]:
    env = child_env()
    env.update({"TRAINWRECK_RUN_DIR": str(Path(run_dir).absolute()), "TRAINWRECK_HOOKS": HOOKS_FACTORY,
                "TRAINWRECK_MAX_RESTARTS": str(max_restarts), "TRAINWRECK_MIN_WORKERS": str(min(world_sizes)),
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    return env


class RayTrainSupervisor(TorchrunSupervisor):
    """The driver starts and restarts the worker group (through Ray); the harness watches it."""

    def __init__(self, spec: JobSpec, run_dir: Path) -> None:
        super().__init__(spec, run_dir)
        self.corrupted: set[int] = set()

    def supervise(self) -> str:
        return self.run_agent(0)

    def run_agent(self, rdzv_port: int) -> str:
        del rdzv_port  # Ray's workers rendezvous through Ray
        RunDir(self.run_dir).logs.mkdir(parents=True, exist_ok=True)
        return self.start_and_watch(list(self.spec.target.argv), RunDir(self.run_dir).logs / DRIVER_LOG,
                                    driver_env(self.run_dir, self.spec.max_restarts, self.spec.world_sizes))

    def kill_all(self) -> None:
        """The driver and its descendants (every node's processes), then the Ray folder a killed
        driver could not remove (its path in RUN/ray_session)."""
        super().kill_all()
        remove_session(self.run_dir)

    def begin_attempt(self, attempt: int) -> tuple[Watchdog, float, float]:
        self.world_size = self.spec.world_size_for(attempt)  # an elastic group restarts smaller
        return super().begin_attempt(attempt)

    def fire(self, attempt: int, fault: ExternalFault, steps: dict[int, int], pids: dict[int, int],
             send: Callable[[int, int], None]) -> None:
        """A node loss is the driver's `cluster.remove_node` of the worker node; its `fault` event,
        written once the node is gone, names the ranks that ran there (a `fault_skip` if none was
        removed). Signals go to the ranks, as for torchrun."""
        if not fault.group:
            return super().fire(attempt, fault, steps, pids, send)
        # The fault's ranks held still (SIGSTOP) while the driver removes the node: the updates
        # (10 ms each) made meanwhile would carry the job past the planned step, or to its end; the
        # others then wait in the next collective, their actors still answering Ray's polls.
        for rank in fault.ranks:
            send(rank, signal.SIGSTOP)
        answer = request_node_removal(self.run_dir, REMOVAL_TIMEOUT_S)
        for rank in fault.ranks:
            if pids[rank] not in answer.get("pids", []):
                send(rank, signal.SIGCONT)  # not on the removed node (or nothing removed): let it go on
        if "error" in answer:
            self.events.emit("fault_skip", attempt=attempt, fault_id=fault.id,
                             reason=f"the node was not removed: {answer['error']}")
            return
        on_node = sorted(r for r, pid in pids.items() if pid in answer.get("pids", []))
        replaced = ", a new node to replace it" if answer.get("replaced") else ", not replaced (the cluster stays a node short)"
        self.events.emit("fault", attempt=attempt, fault_id=fault.id, rank=None, ranks=on_node,
                         fault_kind="remove_node", node_id=answer.get("node_id"), pids=[pids[r] for r in on_node],
                         detail=f"cluster.remove_node of Ray node {str(answer.get('node_id'))[:12]} (raylet pid "
                                f"{answer.get('raylet_pid')}) at ranks' steps {steps}, ranks {list(fault.ranks)} held "
                                f"by SIGSTOP meanwhile: ranks {on_node} ran there{replaced}")

    def on_rank_lost(self, attempt: int) -> None:
        if attempt + 1 in self.corrupted:
            return
        self.corrupted.add(attempt + 1)
        if not any(f.get("kind") == "corrupt" and f.get("attempt", 1) == attempt + 1 for f in self.spec.plan):
            return
        self.wait_group_gone(attempt)
        newest = registered_newest(self.run_dir)
        corrupt_before(self.run_dir, STORAGE, on_registered(self.spec.plan, attempt + 1, newest), attempt + 1)

    def wait_group_gone(self, attempt: int) -> None:
        """Until every worker of `attempt` has exited (Ray kills the survivors once its controller
        has handled the failure) or GROUP_GONE_TIMEOUT_S passed."""
        procs = []
        for pid in self.pids.get(attempt, {}).values():
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=GROUP_GONE_TIMEOUT_S)
