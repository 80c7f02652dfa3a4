"""Chaos plans as Ray tasks: a campaign fans out over whatever cluster a team already runs.

Each plan is one task reserving the cores (or, with nccl, the GPUs) its ranks need,
run by the unchanged harness on the node Ray picks. A plan's ranks share one host
(the harness signals and watches them locally), so a plan wider than every node
reserves one whole node rather than waiting forever for a node that does not exist.

Results come back as bytes, not through a shared path: the task tars its finished
run directory and returns it, and the driver unpacks it under OUT beside the
others. KubeRay and most Slurm clusters have no filesystem every node shares, and
returning bytes makes "finished" atomic: a node lost mid-run returns nothing, so a
plan is never judged from a partial directory; Ray reruns the task (max_retries)
and the campaign resubmits a plan Ray gave up on. The golden run of each (config,
world size) is built once, by one task, and its bytes are handed to every plan that
needs it, which installs them in the node's golden cache instead of rebuilding.

A local instance (no --address) listens on loopback only: Ray would otherwise
advertise the host's routable address, so the driver sets
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's own single-machine switch) before
importing Ray, and starts no dashboard.
"""
from __future__ import annotations

import io
import math
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import traceback
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from trainwreck.harness.suites.engines import EngineOptions, Outcome, PlanJob, run_plan
from trainwreck.rundir.errors import InputError

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""'0': Ray uses 127.0.0.1 as the node address (read when Ray is imported)."""
TASK_RETRIES = 3
"""Ray reruns a task whose worker or node died this many times (system failures only)."""
RESUBMITS = 1
"""Then the campaign submits the plan once more before calling it UNKNOWN."""
WORK_DIR = "trainwreck-ray"
"""Under each node's temporary directory: <node id>/plan-NNNN-* while a plan runs, golden/ its cache."""


# ----- on a node ------------------------------------------------------------------------------


def this_node() -> dict[str, Any]:
    import ray

    return {"engine": "ray", "id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address()}


def node_root(node_id: str) -> Path:
    return Path(tempfile.gettempdir()) / WORK_DIR / node_id[:16]


def pack(run_dir: Path, skip: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(run_dir, arcname=run_dir.name, filter=lambda info: None if _skipped(info.name, skip) else info)
    return buffer.getvalue()


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    parts = Path(name).parts
    return len(parts) > 1 and parts[1] in skip


def unpack(blob: bytes, into: Path) -> Path:
    """Extract a pack()ed directory's contents into `into`; the 'data' filter refuses links
    and paths that would leave it (the bytes came over the network)."""
    def inside(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        parts = Path(member.name).parts
        if len(parts) < 2:
            return None  # the packed directory itself: `into` stands for it
        return tarfile.data_filter(member.replace(name=str(Path(*parts[1:])), deep=False), path)

    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(into, filter=inside)
    return into


def cpu_only_unless_nccl(backend: str) -> None:
    """No GPU was reserved, and Ray 2.60 no longer hides a node's GPUs from such a task: the
    trainer's `auto` would find them. A campaign has one backend, so this worker process (and
    the fork server it starts) stays CPU-only for every task it runs."""
    if backend != "nccl":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def build_golden(config: dict[str, Any], world_size: int, backend: str) -> tuple[str, bytes]:
    """Task: the golden run of (config, world size) in this node's cache, as (cache key, bytes)."""
    from trainwreck.harness.judge.golden import golden_run
    from trainwreck.trainer.config import TrainConfig

    cpu_only_unless_nccl(backend)
    entry = golden_run(TrainConfig.from_dict(config), world_size, node_root(this_node()["id"]) / "golden")
    return entry.name, pack(entry, skip=("checkpoints",))  # the judge reads run.json and events only


def run_plan_task(job: PlanJob, golden: tuple[str, bytes]) -> tuple[Outcome, bytes]:
    """Task: install the shared golden run, run and judge the plan in node-local scratch, return it packed."""
    from trainwreck.harness.judge.golden import adopt

    cpu_only_unless_nccl(job.backend)
    node = this_node()
    root = node_root(node["id"])
    key, blob = golden
    adopt(lambda scratch: unpack(blob, scratch), root / "golden", key)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{job.run_dir.name}-", dir=root))
    try:
        outcome = run_plan(job, work / job.run_dir.name, node, root / "golden")
        return outcome, pack(outcome.run_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ----- on the driver -----------------------------------------------------------------------


def reservation(ranks: int, cpus_per_rank: float, largest: float) -> float:
    """CPUs a plan of `ranks` ranks reserves: ranks x cpus_per_rank, at most the largest node (0: none known yet)."""
    want = ranks * cpus_per_rank
    if largest > 0:
        want = min(want, largest)
    return want if want <= 1 else float(math.ceil(want))  # Ray takes fractions below 1 only


def _land_dir(blob: bytes, final: Path) -> None:
    """Unpack beside `final`, then rename into place: a reader sees the whole directory or none."""
    staging = final.parent / f".incoming-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(unpack(blob, staging), final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """A HOST:PORT that nothing answers is refused in one line: Ray itself would retry for minutes."""
    if address is None or "://" in address or ":" not in address:
        return  # a local instance, `auto`, or a ray:// client address: Ray's own checks
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise InputError(f"--address {address}: no Ray cluster answers there ({exc}); start one "
                         "(`ray start --head`) or give the address it printed") from None


def _is_local(address: str | None) -> bool:
    return address is None or address.split("://")[-1].rsplit(":", 1)[0] in ("127.0.0.1", "localhost", "::1", "[::1]")


class RayEngine:
    """Plans as Ray tasks, at most as many in flight as the cluster has room for."""

    name: ClassVar[str] = "ray"

    def __init__(self, options: EngineOptions) -> None:
        if not (options.cpus_per_rank > 0 and math.isfinite(options.cpus_per_rank)):
            raise InputError(f"--cpus-per-rank {options.cpus_per_rank} must be a positive number, e.g. 1 or 0.5")
        self.address = options.address or os.environ.get("RAY_ADDRESS")
        check_reachable(self.address)
        if _is_local(self.address):
            os.environ.setdefault(LOOPBACK_ENV, "0")
        import ray

        self.ray = ray
        self.cpus_per_rank = options.cpus_per_rank
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(address=self.address or "local", include_dashboard=False, log_to_driver=False,
                     **({"_node_ip_address": "127.0.0.1"} if self.address is None else {}))
        self.in_flight: dict[Any, tuple[PlanJob, int, Any]] = {}
        self.goldens: dict[tuple[str, int], Any] = {}
        self.kept: list[Any] = []  # golden refs already copied to OUT/golden
        self.plan_task = ray.remote(run_plan_task)
        self.golden_task = ray.remote(build_golden)

    # -- resources

    def node_cpus(self) -> list[float]:
        return [n["Resources"].get("CPU", 0.0) for n in self.ray.nodes() if n["Alive"]]

    def reservation(self, ranks: int, largest: float) -> float:
        return reservation(ranks, self.cpus_per_rank, largest)

    def slots(self) -> int:
        cpus = self.node_cpus()
        smallest_plan = self.reservation(2, max(cpus, default=0.0))
        return max(1, int(sum(cpus) // smallest_plan))

    def describe(self) -> str:
        cpus = self.node_cpus()
        where = self.address or "a local Ray instance (loopback only)"
        return (f"ray engine: {len([c for c in cpus if c > 0])} node(s) with CPUs, {sum(cpus):g} CPU(s) in all, at "
                f"{where}; a plan reserves {self.cpus_per_rank:g} CPU per rank, at most one whole node "
                f"({max(cpus, default=0):g})")

    # -- submitting and collecting

    def submit(self, job: PlanJob) -> list[Outcome]:
        done = []
        while len(self.in_flight) >= self.slots():
            done += self.collect(block=True)
        self._launch(job, tries=0)
        return done + self.collect(block=False)

    def drain(self) -> list[Outcome]:
        done = []
        while self.in_flight:
            done += self.collect(block=True)
        return done

    def _launch(self, job: PlanJob, tries: int) -> None:
        largest = max(self.node_cpus(), default=0.0)
        ranks = max(job.case.world_sizes)
        gpus = ranks if job.backend == "nccl" else 0
        golden = self._golden(job, largest)
        ref = self.plan_task.options(num_cpus=self.reservation(ranks, largest), num_gpus=gpus,
                                     max_retries=TASK_RETRIES, name=f"trainwreck-{job.run_dir.name}"
                                     ).remote(job, golden)
        self.in_flight[ref] = (job, tries, golden)

    def _golden(self, job: PlanJob, largest: float) -> Any:
        """The one task that builds this plan's golden run (its result goes to every plan that needs it)."""
        cfg = replace(job.case.config(job.backend), variant="reference")
        key = (repr(sorted(cfg.to_dict().items())), job.case.world_sizes[0])
        if key not in self.goldens:
            self.goldens[key] = self.golden_task.options(
                num_cpus=self.reservation(key[1], largest), max_retries=TASK_RETRIES,
                num_gpus=key[1] if job.backend == "nccl" else 0,
                name="trainwreck-golden").remote(cfg.to_dict(), key[1], job.backend)
        return self.goldens[key]

    def collect(self, block: bool) -> list[Outcome]:
        ready, _ = self.ray.wait(list(self.in_flight), num_returns=1 if block else len(self.in_flight),
                                 timeout=None if block else 0)
        return [o for o in (self._land(ref) for ref in ready) if o is not None]

    def _land(self, ref: Any) -> Outcome | None:
        job, tries, golden = self.in_flight.pop(ref)
        try:
            outcome, blob = self.ray.get(ref)
            if golden not in self.kept:
                self._keep_golden(job.run_dir.parent / "golden", *self.ray.get(golden))
                self.kept.append(golden)
        except self.ray.exceptions.RayError as exc:
            if tries < RESUBMITS:
                print(f"       plan {job.index} lost ({type(exc).__name__}); submitted again", file=sys.stderr)
                self._launch(job, tries + 1)
                return None
            return self._lost(job, exc)
        _land_dir(blob, job.run_dir)  # the plan appears whole or not at all, never twice
        return replace(outcome, run_dir=job.run_dir)

    @staticmethod
    def _keep_golden(into: Path, key: str, blob: bytes) -> None:
        """A copy of each golden run beside the plans (OUT/golden/KEY), for `trainwreck check --golden`."""
        if not (into / key).exists():
            into.mkdir(parents=True, exist_ok=True)
            _land_dir(blob, into / key)

    def _lost(self, job: PlanJob, exc: BaseException) -> Outcome:
        """A plan Ray could not finish: UNKNOWN, with why; nothing of its partial run is kept."""
        job.run_dir.mkdir(parents=True)
        (job.run_dir / "chaos-error.txt").write_text(
            f"the Ray cluster lost this plan on every try ({TASK_RETRIES + 1} runs per submission, "
            f"{RESUBMITS + 1} submissions); the last error:\n"
            + "".join(traceback.format_exception(exc)))
        return Outcome(job.index, job.case, job.run_dir, "unknown", job.reproduce, 0.0, {"engine": "ray"})

    def close(self) -> None:
        for ref in list(self.in_flight):
            self.ray.cancel(ref, force=True)
        self.in_flight.clear()
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
