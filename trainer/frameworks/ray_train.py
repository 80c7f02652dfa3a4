"""Ray Train adapter: a `TorchTrainer` job writes the run format from inside its workers; Ray unchanged.

    with simulated_cluster(run_dir):                       # 2 Ray nodes on 127.0.0.1 (head + worker), one SLOT each
        trainer = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                                                  resources_per_worker={"CPU": 1, SLOT: 1}),
                               run_config=run_config(max_failures), datasets=...)
        trainer.fit()                                      # the harness may remove the worker node meanwhile

    def loop(config):                                      # train_loop_per_worker
        probe = worker_probe()                             # rank, world size, attempt from Ray; faults from the plan
        step, state = restore(probe, model, optimizer)     # ray.train.get_checkpoint() (`reject` if it does not load)
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
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from trainwreck.trainer.frameworks.ray_nodes import serve_node_control
from trainwreck.trainer.probe import ENV_ATTEMPT, ENV_HOOKS, ENV_RUN_DIR, Probe, state_digest
from trainwreck.rundir.layout import RunDir, events_file_attempt

INSTALL = "pip install 'trainwreck[ray-train]'"
PASSED_ENV = (ENV_RUN_DIR, ENV_HOOKS)
"""What the harness sets for a rank that a Ray worker must see (its attempt it works out itself)."""
STATE_FILE = "state.pt"
LOOPBACK = "127.0.0.1"
SESSION_NOTE = "ray_session"
"""RUN/ray_session: the path of the driver's Ray folder (outside the run directory: socket paths)."""
SLOT = "trainwreck_worker_slot"
"""A custom resource each simulated node has one of and each worker needs one of: one worker a node."""
SOCKET_ROOM = 24
"""The longest temporary folder Ray's session goes under (its socket paths add ~80 bytes)."""


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The runtime_env env_vars that carry the harness's rank environment into every Ray worker."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in PASSED_ENV if env.get(k)}


def cluster_options(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """ray.init's arguments for the driver: its own address 127.0.0.1 (else Ray resolves the
    cluster's 127.0.0.1 to the machine's outward address and waits for a gcs there), the
    harness's rank environment for every worker, the workers' output kept off the driver's log
    (each rank writes its own run-directory files)."""
    return {"_node_ip_address": LOOPBACK, "log_to_driver": False, "runtime_env": {"env_vars": worker_env(environ)}}


def node_options(session: Path, num_cpus: int, head: bool) -> dict[str, Any]:
    """One simulated node (`Cluster.add_node`): it listens on 127.0.0.1 only, no dashboard, its
    files under `session`, `num_cpus` logical CPUs and one SLOT (a worker needs one: SLOT puts
    the two workers on two nodes, so removing a node takes exactly one worker)."""
    options = {"num_cpus": num_cpus, "node_ip_address": LOOPBACK, "temp_dir": str(session / "ray"),
               "resources": {SLOT: 1}}
    # The head's: the dashboard process (off) and a lost node noticed within seconds, not ~30 s.
    return {**options, "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}} if head else options


def ray_state_env(session: Path) -> dict[str, str]:
    """Where Ray keeps state outside a node's temp_dir, moved into the cluster's own folder: the
    address file ($RAY_TMPDIR/ray/ray_current_cluster, else /tmp/ray) and the token that token
    authentication (on by default in 2.60) writes to ~/.ray/auth_token when none exists
    (ray/_private/authentication/authentication_token_setup.py `generate_and_save_token`): a
    token of its own per cluster in RAY_AUTH_TOKEN, which Ray's C++ token loader reads first."""
    return {"RAY_TMPDIR": str(session), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray's single-machine switch


class SimulatedNodes:
    """The driver's `ray.cluster_utils.Cluster`: a head node (the driver's, where the controller
    runs) and one worker node; `remove_worker_node` is the node loss the harness asks for."""

    def __init__(self, cluster: Any, session: Path, node_cpus: int, replace: bool) -> None:
        self.cluster, self.session, self.node_cpus, self.replace = cluster, session, node_cpus, replace

    def add_worker_node(self) -> Any:
        import threading

        # A node started with exit hooks installs a SIGTERM handler, which only the main thread may
        # (ray/_private/node.py `_register_shutdown_hooks`); a replacement is started by the
        # node-control thread, so without them: `cluster.shutdown()` still removes it at the end.
        hooks = self.cluster._shutdown_at_exit
        self.cluster._shutdown_at_exit = hooks and threading.current_thread() is threading.main_thread()
        try:
            node = self.cluster.add_node(**node_options(self.session, self.node_cpus, head=False))
        finally:
            self.cluster._shutdown_at_exit = hooks
        self.cluster.wait_for_nodes()
        return node

    def remove_worker_node(self) -> dict[str, Any]:
        """`cluster.remove_node` of the worker node (the head holds the driver: Ray refuses to
        remove it), then SIGKILL to whatever ran on it and outlived its raylet (a worker the
        harness froze cannot exit by itself): a lost node takes every process on it. The answer
        lists those pids, so the harness can tell which ranks the node took."""
        import psutil
        from ray._private import ray_constants

        node = next(iter(self.cluster.worker_nodes))
        raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        procs = psutil.Process(raylet).children(recursive=True)
        self.cluster.remove_node(node)
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)
        return {"node_id": node.node_id, "raylet_pid": raylet, "pids": [p.pid for p in procs],
                "left": [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
                "nodes_alive": len(self.cluster.list_all_nodes()), "replaced": self.replace}

    def after_removal(self) -> None:
        """With `replace`, a fresh worker node takes the lost one's place (a fixed-size group needs
        two slots to restart, as an autoscaler would provide); else the cluster stays a node short."""
        if self.replace:
            self.add_worker_node()


@contextmanager
def simulated_cluster(run_dir: Path | None, head_cpus: int = 2, node_cpus: int = 1,
                      replace: bool = True) -> Iterator[SimulatedNodes]:
    """Two simulated Ray nodes on this machine (`ray.cluster_utils.Cluster`: head + one worker
    node, each a raylet of its own), the driver connected, for the block; then Ray is shut down
    (every node's processes end) and its folder removed. Everything Ray keeps goes in a temporary
    folder of the block's own (`ray_state_env`), never $TMPDIR/ray or ~/.ray. With `run_dir`,
    the driver serves RUN/ray_node_control: the harness's node-loss fault removes the worker node.
    head_cpus: one for a worker and one for Ray Data's read tasks (the dataset path)."""
    import tempfile

    # Ray's unix sockets live under it (session_<date>_<pid>/sockets/plasma_store), and a socket path
    # must fit in 107 bytes: a long $TMPDIR (a test's private one) made ray.init fail; /tmp is short.
    base = tempfile.gettempdir()
    session = Path(tempfile.mkdtemp(prefix="tw-ray-", dir=base if len(base) <= SOCKET_ROOM else "/tmp"))
    (session / "ray").mkdir()
    if run_dir is not None:  # the harness removes the folder should it have to SIGKILL this driver
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / SESSION_NOTE).write_text(str(session))
    saved = {k: os.environ.get(k) for k in ray_state_env(session)}
    os.environ.update(ray_state_env(session))  # read by Ray in this process and inherited by every node
    control: Path | None = None
    cluster = None
    try:
        import ray
        from ray._raylet import AuthenticationTokenLoader, Config
        from ray.cluster_utils import Cluster

        # Ray reads RAY_AUTH_MODE into its config once, when imported (the example imports ray.train
        # first): refresh it as Ray's own `_enable_token_auth` does (ray/_private/authentication/
        # authentication_token_setup.py), and the token loader's cache, or this process would
        # speak to the token-checking gcs without a token.
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
        cluster = Cluster(initialize_head=True, head_node_args=node_options(session, head_cpus, head=True))
        nodes = SimulatedNodes(cluster, session, node_cpus, replace)
        nodes.add_worker_node()
        ray.init(address=cluster.address, **cluster_options())
        if run_dir is not None:
            control = serve_node_control(Path(run_dir), nodes.remove_worker_node, nodes.after_removal)
        yield nodes
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()  # first: Cluster refuses to remove the node a connected driver uses
            cluster.shutdown()
        if control is not None:
            control.unlink(missing_ok=True)
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        shutil.rmtree(session, ignore_errors=True)
        if run_dir is not None:
            (Path(run_dir) / SESSION_NOTE).unlink(missing_ok=True)


def remove_session(run_dir: Path) -> Path | None:
    """After the driver is gone: remove the Ray folder it named in RUN/ray_session (only a
    `tw-ray-` folder directly under a temporary root, as `simulated_cluster` makes) and the note."""
    note = Path(run_dir) / SESSION_NOTE
    try:
        session = Path(note.read_text().strip())
    except OSError:
        return None
    note.unlink(missing_ok=True)
    if not session.name.startswith("tw-ray-") or not session.is_dir() or session.is_symlink():
        return None
    shutil.rmtree(session, ignore_errors=True)
    return session


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
    controller registered), then `restore`; {} when Ray has none. One that does not load is
    rejected (`reject`, with its bytes' content) and the next older one Ray registered is tried
    (ray.train.get_all_reported_checkpoints): Ray itself never checks what it hands out."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return {}
    for folder in _newest_first(Path(checkpoint.path)):
        try:
            state = torch.load(folder / STATE_FILE, weights_only=False)
        except Exception as exc:  # torch.load's errors for torn bytes vary (EOFError, RuntimeError, ...)
            probe.reject(folder.name, f"{type(exc).__name__}: {exc}", path=folder)
            continue
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        probe.restore(state["step"], folder.name, state_digest(model, optimizer), path=folder)
        return state
    return {}


def _newest_first(handed: Path) -> Iterator[Path]:
    """The folder Ray handed, then the older registered ones, newest first (asked only when the
    handed one failed to load: every rank fails on the same bytes, so every rank asks)."""
    import ray.train

    yield handed
    reported = ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED)
    older = sorted((Path(r.checkpoint.path) for r in reported if Path(r.checkpoint.path).name < handed.name),
                   key=lambda p: p.name, reverse=True)
    yield from older


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
