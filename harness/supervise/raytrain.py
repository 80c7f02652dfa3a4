"""Supervising a Ray Train job: the driver's `TorchTrainer` owns the restarts, the harness watches.

Ray Train restarts the whole worker group itself (``FailureConfig(max_failures)``), as torchrun's
agent does, so this is `TorchrunSupervisor` with a different agent: one driver process (the job's
command, e.g. trainer/frameworks/examples/ray_train.py) that starts a local Ray instance on
127.0.0.1 and runs the trainer. The workers' probes number the groups (attempt 0, 1, ... :
trainer/frameworks/ray_train.py) and publish progress boards under those numbers; the harness reads
the boards to learn the workers' pids, fires the plan's external faults at them, detects hangs
and SIGKILLs the hung workers (Ray sees dead actors and restarts the group).

Between attempts: Ray restarts the group without asking anyone, so a planned ``corrupt`` of
attempt N+1 is applied the moment the harness sees a worker of attempt N gone, before the new
group has started (a restart takes seconds: the controller tears the group down and starts new
actors that import torch), and its `fault` event says when; the restore event that follows shows
whether the damage was in time.

The driver's environment carries TRAINWRECK_RUN_DIR and TRAINWRECK_HOOKS into the workers
(runtime_env env_vars) and the restart budget as TRAINWRECK_MAX_RESTARTS (the script's
FailureConfig). Ray's processes (gcs, raylet, workers, its agents) are the driver's descendants:
`kill_all` ends the driver's group and every descendant.
"""
from __future__ import annotations

from pathlib import Path

from trainwreck.faults.between_attempts import corrupt_before
from trainwreck.faults.cmdrank import HOOKS_FACTORY
from trainwreck.harness.launch.procs import child_env
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.torchrun import TorchrunSupervisor
from trainwreck.rundir.layout import RunDir

STORAGE = "ray_storage/trainwreck"
"""Where the example job's checkpoints are, under the run directory (its RunConfig's storage_path/name)."""
DRIVER_LOG = "ray_driver.log"


def driver_env(run_dir: Path, max_restarts: int) -> dict[str, str]:
    env = child_env()
    env.update({"TRAINWRECK_RUN_DIR": str(Path(run_dir).absolute()), "TRAINWRECK_HOOKS": HOOKS_FACTORY,
                "TRAINWRECK_MAX_RESTARTS": str(max_restarts), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
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
                                    driver_env(self.run_dir, self.spec.max_restarts))

    def on_rank_lost(self, attempt: int) -> None:
        if attempt + 1 not in self.corrupted:
            self.corrupted.add(attempt + 1)
            corrupt_before(self.run_dir, STORAGE, self.spec.plan, attempt + 1)
