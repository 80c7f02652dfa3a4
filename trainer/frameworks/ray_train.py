"""Ray Train adapter: a `TorchTrainer` job writes the run format from inside its workers; Ray unchanged.

    with local_cluster():                                  # ray.init on 127.0.0.1, no dashboard; shut down after
        trainer = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                               run_config=run_config(max_failures), datasets=...)
        trainer.fit()

    def loop(config):                                      # train_loop_per_worker
        probe = worker_probe()                             # rank, world size, attempt from Ray; faults from the plan
        step, state = restore(probe, model, optimizer)     # ray.train.get_checkpoint(), then `restore`
        ... probe.batch / probe.step per update ...
        report(probe, step, state, digest)                 # ray.train.report(checkpoint=...), then `save`

Ray Train (not the harness) restarts the worker group: `FailureConfig(max_failures)`, every worker
of the group replaced, the new group given the newest checkpoint the controller registered. So
the attempt number is not the harness's: the first worker group is attempt 0 and each restarted
group the next number, agreed by its ranks (rank 0 counts the attempts whose events are on disk
and broadcasts it over the group's own gloo process group). The harness's ray-driver launcher
(harness/supervise/raytrain.py) watches the boards the same numbers name, as it does torchrun's.

The harness's environment (TRAINWRECK_RUN_DIR, TRAINWRECK_HOOKS: the plan's in-rank faults) reaches
the workers through the runtime environment's env_vars (`worker_env`): a Ray worker is a process
the raylet starts, not a child of the driver's environment.

The process group is set up by `LoopbackTorchConfig`, not Ray's `TorchConfig`: Ray's backend
(ray/train/torch/config.py `_TorchBackend.on_start`, `_setup_torch_process_group`) calls
`init_process_group(init_method="tcp://127.0.0.1:PORT")`, whose TCPStore server ignores the host
and listens on every interface (`[::]:PORT`, seen on rank 0's worker with Ray 2.60 and torch
2.13). The replacement does what Ray's does for gloo, but rank 0's store is trainwreck's
`loopback_store` (a socket bound to 127.0.0.1, handed over) and the others connect to it.

The checkpoint is persisted by a `checkpoint_upload_fn` (Ray's documented hook) that copies the
files the way Ray's default does, but in Python: Ray's own copy is `pyarrow.fs.copy_files`
(ray/train/v2/_internal/execution/storage.py `_pyarrow_fs_copy_files`), which writes from C++ and
raises no audit event, so a crash inside it could not be placed between its files. The copy runs
inside the probe's `saving`, so kill-in-save lands between the persisted files, inside
`ray.train.report`. Neither copy fsyncs: `report` fsyncs the persisted folder before `save`.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from trainwreck.trainer.probe import ENV_ATTEMPT, ENV_HOOKS, ENV_RUN_DIR, Probe, state_digest
from trainwreck.rundir.layout import RunDir, events_file_attempt

INSTALL = "pip install 'trainwreck[ray-train]'"
PASSED_ENV = (ENV_RUN_DIR, ENV_HOOKS)
"""What the harness sets for a rank that a Ray worker must see (its attempt it works out itself)."""
STATE_FILE = "state.pt"
LOOPBACK = "127.0.0.1"
SOCKET_ROOM = 24
"""The longest temporary folder Ray's session goes under (its socket paths add ~80 bytes)."""


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The runtime_env env_vars that carry the harness's rank environment into every Ray worker."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in PASSED_ENV if env.get(k)}


def cluster_options(environ: dict[str, str] | None = None, num_cpus: int = 4) -> dict[str, Any]:
    """ray.init's arguments for a local cluster that listens on loopback only and dies with the
    driver: no dashboard, the node's address 127.0.0.1, more logical CPUs than workers (Ray Data's
    read tasks need a CPU beside the two the workers reserve)."""
    return {"address": "local", "include_dashboard": False, "_node_ip_address": LOOPBACK, "num_cpus": num_cpus,
            "log_to_driver": False, "runtime_env": {"env_vars": worker_env(environ)}}


@contextmanager
def local_cluster(num_cpus: int = 4) -> Iterator[None]:
    """A local Ray instance on 127.0.0.1 for the block (shut down after: its gcs, raylet and
    workers end with it), its session files in a temporary folder of its own, removed after
    (Ray's default, $TMPDIR/ray, is shared by every Ray instance and never cleaned)."""
    import tempfile

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray's single-machine switch
    import ray

    # Ray's unix sockets live under it (session_<date>_<pid>/sockets/plasma_store), and a socket path
    # must fit in 107 bytes: a long $TMPDIR (a test's private one) made ray.init fail; /tmp is short.
    base = tempfile.gettempdir()
    session = tempfile.mkdtemp(prefix="tw-ray-", dir=base if len(base) <= SOCKET_ROOM else "/tmp")
    try:
        ray.init(**cluster_options(num_cpus=num_cpus), _temp_dir=session)
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(session, ignore_errors=True)


def loopback_process_group(rank: int, world_size: int, addr: str, port: int, timeout_s: float) -> None:
    """On each Ray worker: gloo over a TCPStore that listens on loopback only (rank 0 hosts it)."""
    from datetime import timedelta

    import torch.distributed as dist

    from trainwreck.trainer.launch import loopback_store

    timeout = timedelta(seconds=timeout_s)
    store = (loopback_store(port, world_size, timeout, host=addr) if rank == 0 else
             dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)


def loopback_torch_config(timeout_s: int = 1800) -> Any:
    """A `TorchConfig` (gloo) whose process group listens on 127.0.0.1 only; timeout_s: Ray's default."""
    import ray
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _set_torch_distributed_env_vars, _TorchBackend

    class LoopbackTorchBackend(_TorchBackend):  # type: ignore[misc]
        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            addr, port = worker_group.execute_single(0, _address_and_port)
            worker_group.execute(_set_torch_distributed_env_vars)
            n = len(worker_group)  # positional: execute_single_async's own first parameter is `rank`
            ray.get([worker_group.execute_single_async(i, loopback_process_group, i, n, addr, port,
                                                       backend_config.timeout_s) for i in range(n)])

    class LoopbackTorchConfig(TorchConfig):  # type: ignore[misc]
        @property
        def backend_cls(self) -> Any:
            return LoopbackTorchBackend

    return LoopbackTorchConfig(backend="gloo", timeout_s=timeout_s)


def _address_and_port() -> tuple[str, int]:
    """Rank 0's node address (127.0.0.1 on the loopback cluster) and a port free on it."""
    import socket

    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return LOOPBACK, sock.getsockname()[1]


def group_attempt(run_dir: Path) -> int:
    """One past the highest attempt a rank's events file records; 0 before any (harness events
    are not counted: the supervisor's `attempt` 0 is written before the first group starts)."""
    names = os.listdir(RunDir(run_dir).events) if RunDir(run_dir).events.is_dir() else []
    used = [a for n in names if (a := events_file_attempt(n)) is not None]
    return max(used) + 1 if used else 0


def worker_probe() -> Probe:
    """This Ray worker's probe: rank and world size from Ray's context, the attempt agreed by the
    group (rank 0 decides, over the group's process group), the harness's faults and stack dump."""
    import ray.train
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    run_dir = os.environ.get(ENV_RUN_DIR)
    attempt = torch.tensor([group_attempt(Path(run_dir)) if run_dir and rank == 0 else 0])
    if world > 1 and dist.is_initialized():
        dist.broadcast(attempt, src=0)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), ENV_ATTEMPT: str(int(attempt.item()))})
    return Probe.from_env()


def restore(probe: Probe, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load the checkpoint Ray hands this group (ray.train.get_checkpoint(): the newest the
    controller registered), then `restore`; {} when Ray has none."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return {}
    folder = Path(checkpoint.path)
    state = torch.load(folder / STATE_FILE, weights_only=False)
    getattr(model, "module", model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    probe.restore(state["step"], folder.name, state_digest(model, optimizer), path=folder)
    return state


def report(probe: Probe, step: int, state: dict[str, Any], metrics: dict[str, Any], scratch: Path) -> Path | None:
    """Every rank calls it: rank 0 writes `state` into `scratch` and reports it as the checkpoint
    of update `step` (`ray.train.report` persists it under the run's storage path); once the
    persisted folder is fsynced, rank 0 emits `save`. Returns the persisted folder (rank 0)."""
    import ray.train

    name = f"checkpoint_{step:06d}"
    checkpoint = None
    if probe.rank == 0:
        folder = scratch / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(state, folder / STATE_FILE)
        checkpoint = ray.train.Checkpoint.from_directory(str(folder))
    storage = Path(ray.train.get_context().get_storage().experiment_fs_path)
    persisted: list[Path] = []

    def upload(ckpt: Any, dir_name: str) -> Any:
        target = storage / dir_name
        with probe.saving(step, storage):
            shutil.copytree(ckpt.path, target, dirs_exist_ok=True)
        persisted.append(target)
        return ray.train.Checkpoint.from_directory(str(target))

    ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name, checkpoint_upload_fn=upload)
    if not persisted:
        return None
    _fsync_tree(persisted[0])
    probe.commit(step, name, state["digest"], path=persisted[0])
    return persisted[0]


def _fsync_tree(folder: Path) -> None:
    for item in [*(p for p in folder.rglob("*") if p.is_file()), folder, folder.parent]:
        fd = os.open(item, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
