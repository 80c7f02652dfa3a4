"""torchft under trainwreck: a replica group's rank writes the run format, and every server
torchft starts in it listens on loopback only.

torchft (pytorch/torchft) restarts one *replica group* while the others keep training: the
groups join a quorum through a lighthouse, a restarted group heals its state from a live
peer over HTTP, and a step commits only where `Manager.should_commit()` says so. Judging that
needs more than the run format's whole-job events, so a rank here also writes the replica
extension (docs/DESIGN.md "Replica groups"): `quorum`, `commit`, `heal`, `heal_send`, and
`replica_group`/`incarnation` on every event.

Loopback (torchft 0.2.0, read from its source):

- the Manager's server binds ``[::]:port`` (hard-coded in ``Manager.__init__``): `loopback_only`
  replaces ``torchft.manager.ManagerServer`` with a wrapper that binds ``127.0.0.1:port``; the
  address it advertises is the Manager's ``hostname`` argument, given as 127.0.0.1;
- the heal server (``HTTPTransport``) binds ``("", 0)`` over IPv6, i.e. every interface, and
  advertises ``socket.gethostname()``: `LoopbackHTTPTransport` binds 127.0.0.1 and advertises it;
- gloo's pair listeners follow ``GLOO_SOCKET_IFNAME`` (the harness sets ``lo``); the group's
  TCPStore and the lighthouse are the harness's (harness/supervise/replicas.py), both on 127.0.0.1.

torchft-nightly (2026.10.26) adds one more: ``ProcessGroup.get_reconfigure_handle()`` starts a
rendezvous TCPStore server with ``TCPStore(host_name=socket.gethostname(), port=0,
is_master=True)``, which listens on every interface (a store server ignores its host), and
advertises ``hostname:port`` in the handle. `loopback_only` replaces that method, where it
exists, with one that starts the store through trainer/launch.py `loopback_store` (the socket
bound to 127.0.0.1 and handed over) before torchft looks, and advertises 127.0.0.1.

`tests/frameworks/test_torchft.py` lists a live run's listening sockets to prove it.
"""
from __future__ import annotations

import hashlib
import importlib
import io
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from datetime import timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import torch
import torchft.checkpointing.http_transport as http_transport
import torchft.manager
import torchft.process_group
from torchft.checkpointing.http_transport import HTTPTransport

from trainwreck.trainer.hooks import IN_ALLREDUCE, IN_HEAL, Hooks, NoHooks
from trainwreck.trainer.launch import loopback_store
from trainwreck.trainer.probe import Probe, state_digest
from trainwreck.rundir.layout import read_run_json

LOOPBACK = "127.0.0.1"
# The replica environment the harness gives a rank (beside torchrun's RANK/WORLD_SIZE, which
# torchft reads as the rank inside its group, and MASTER_ADDR/PORT: the group's store).
ENV_GROUP = "TRAINWRECK_REPLICA_GROUP"
ENV_GROUPS = "TRAINWRECK_REPLICA_GROUPS"
ENV_INCARNATION = "TRAINWRECK_INCARNATION"
ENV_GATE = "TRAINWRECK_REPLICA_GATE"
"""host:port of a store where every group's first incarnation meets before its first update."""
GATE_TIMEOUT = timedelta(seconds=300)
RENDEZVOUS_TIMEOUT = timedelta(seconds=300)
"""torch's own TCPStore default, which the nightly's rendezvous store used."""
RANK_FAULT_KINDS = ("kill", "hang")
"""The plan's kinds a replica rank fires itself; the others are the harness's (lighthouse kills)."""


# ----- loopback --------------------------------------------------------------------------


class _LoopbackHTTPServer(ThreadingHTTPServer):
    """torchft's heal server, on 127.0.0.1 instead of every IPv6 interface."""

    address_family = socket.AF_INET
    request_queue_size = 1024

    def __init__(self, server_address: tuple[str, int], handler: Any) -> None:
        super().__init__((LOOPBACK, server_address[1]), handler)


def loopback_only() -> None:
    """Patch torchft, in this process, so its Manager server, heal server and (nightly)
    rendezvous store bind 127.0.0.1. Call it before building the Manager; idempotent."""
    if getattr(torchft.manager, "_trainwreck_loopback", False):
        return
    server_cls = torchft.manager.ManagerServer

    def loopback_server(*args: Any, bind: str, **kwargs: Any) -> Any:
        port = bind.rsplit(":", 1)[1]
        return server_cls(*args, bind=f"{LOOPBACK}:{port}", **kwargs)

    torchft.manager.ManagerServer = loopback_server  # type: ignore[assignment,misc]
    http_transport._IPv6HTTPServer = _LoopbackHTTPServer  # type: ignore[attr-defined,misc]
    group_cls = torchft.process_group.ProcessGroup
    if hasattr(group_cls, "get_reconfigure_handle"):  # the nightly; 0.2.0 has no such store
        group_cls.get_reconfigure_handle = _loopback_handle(group_cls.get_reconfigure_handle)
    torchft.manager._trainwreck_loopback = True  # type: ignore[attr-defined]


def _loopback_handle(original: Callable[[Any], str]) -> Callable[[Any], str]:
    """get_reconfigure_handle with its store started on 127.0.0.1 first (torchft then reuses
    `_rendezvous_store`) and the handle's `store` naming 127.0.0.1, not the hostname.
    Should a later torchft stop reading `_rendezvous_store`, its own store listens on every
    interface again, and the listener checks of tests/frameworks/test_torchft.py fail."""

    def handle(self: Any) -> str:
        if getattr(self, "_rendezvous_store", None) is None:
            self._rendezvous_store = loopback_store(0, None, RENDEZVOUS_TIMEOUT)
        fields = json.loads(original(self))
        fields["store"] = f"{LOOPBACK}:{self._rendezvous_store.port}"
        return json.dumps(fields)

    return handle


class LoopbackHTTPTransport(HTTPTransport):  # type: ignore[type-arg]
    """torchft's HTTP heal transport on loopback, telling the probe what it sends and fetches."""

    def __init__(self, timeout: timedelta, on_send: Callable[[list[int], int], None],
                 on_recv: Callable[[int, str, int], None]) -> None:
        loopback_only()
        super().__init__(timeout=timeout, num_chunks=0)
        self._on_send, self._on_recv = on_send, on_recv

    def address(self) -> str:
        return f"http://{LOOPBACK}:{self._server.socket.getsockname()[1]}/checkpoint/"

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        self._on_send(list(dst_ranks), step)
        super().send_checkpoint(dst_ranks, step, state_dict, timeout)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        self._on_recv(src_rank, metadata, step)
        return super().recv_checkpoint(src_rank, metadata, step, timeout)


# ----- the rank's identity and its probe ----------------------------------------------------


@dataclass(frozen=True)
class ReplicaRank:
    """Who this process is: group `group` of `groups`, rank `group_rank` of `group_world_size`
    inside it, the group's `incarnation`-th start (0: first)."""

    group: int
    groups: int
    group_rank: int
    group_world_size: int
    incarnation: int

    @property
    def rank(self) -> int:
        """The job-wide rank of the run format: groups laid out one after another."""
        return self.group * self.group_world_size + self.group_rank

    @property
    def world_size(self) -> int:
        return self.groups * self.group_world_size

    @classmethod
    def from_env(cls) -> ReplicaRank:
        env = os.environ
        try:
            return cls(int(env.get(ENV_GROUP, "0")), int(env.get(ENV_GROUPS, "1")), int(env.get("RANK", "0")),
                       int(env.get("WORLD_SIZE", "1")), int(env.get(ENV_INCARNATION, "0")))
        except ValueError as exc:
            raise SystemExit(f"a replica variable is not an integer ({exc}); run under trainwreck's replica "
                             "harness or set TRAINWRECK_REPLICA_GROUP/_GROUPS to integers") from None


def _rank_hooks(run_dir: Path, factory: str) -> Hooks:
    """The plan's in-rank faults (kill, hang) for this rank; the harness's own kinds left out."""
    module, _, name = factory.partition(":")
    plan = [f for f in read_run_json(run_dir).get("faults") or [] if f.get("kind") in RANK_FAULT_KINDS]
    hooks: Hooks = getattr(importlib.import_module(module), name)(plan)
    return hooks


class ReplicaProbe:
    """The probe of one replica-group rank: every event carries `replica_group` and
    `incarnation`; the plan's faults see the incarnation as their `attempt` (a fault with
    attempt 1 fires in the group's first restart), while the events keep attempt 0: the job
    as a whole never restarts."""

    def __init__(self, who: ReplicaRank, run_dir: str | Path | None = None) -> None:
        self.who = who
        chosen = os.environ.get("TRAINWRECK_RUN_DIR") or run_dir
        self.probe = Probe(chosen, who.rank, who.world_size, 0)
        self.hooks: Hooks = NoHooks()
        factory = os.environ.get("TRAINWRECK_HOOKS")
        if self.probe.events is not None and factory and os.environ.get("TRAINWRECK_RUN_DIR"):
            self.hooks = _rank_hooks(Path(chosen), factory)  # type: ignore[arg-type]
            self.hooks.bind(self.probe.events, who.rank, who.world_size, who.incarnation)
        self._lock = threading.Lock()  # torchft calls the transport from its quorum thread
        self.pending_heal: dict[str, Any] | None = None
        self.digest: Callable[[], str] | None = None
        """The trainer's state digest: a heal's sender records what it serves."""
        self.current_step: Callable[[], int] = lambda: 0
        """The Manager's committed step (`manager.current_step`): fault points count updates by it."""

    def emit(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self.probe.emit(kind, replica_group=self.who.group, incarnation=self.who.incarnation, **fields)
            self.probe.flush()

    def start(self, **spec: Any) -> None:
        self.probe.write_run_json(**spec)
        self.emit("start", pid=os.getpid(), group_rank=self.who.group_rank)
        self.probe.phase(0, "start")

    def ready(self) -> None:
        """When the harness starts every group together (the job's start, a whole-job restart),
        each rank waits here, once its Manager (and so its heartbeat) is up, for all the others:
        the first quorum then has every group, and no group trains alone because a peer was
        slower to import torch. A group restarted alone gets no gate: joining a running job is
        what it is there for."""
        gate = os.environ.get(ENV_GATE)
        if not gate:
            return
        host, port = gate.rsplit(":", 1)
        store = torch.distributed.TCPStore(host, int(port), is_master=False, timeout=GATE_TIMEOUT)
        round_ = self.who.incarnation  # every group of one start has the same incarnation number
        store.set(f"ready/{round_}/{self.who.rank}", "1")
        store.wait([f"ready/{round_}/{r}" for r in range(self.who.world_size)])

    def point(self, name: str, step: int) -> None:
        self.hooks.point(name, step)

    def batch(self, step: int, epoch: int, samples: list[int]) -> None:
        self.emit("batch", step=step, epoch=epoch, samples=samples)

    def outcome(self, step: int, committed: bool, participating: bool, participants: int, quorum_id: int,
                loss: float | None, digest: str | None) -> None:
        """The update's commit decision; a committed one is also the format's `step` event."""
        self.emit("commit", step=step, committed=committed, participating=participating,
                  participants=participants, quorum_id=quorum_id)
        if committed:
            self.emit("step", step=step, loss=loss, digest=digest)
            self.probe.phase(step, "optimizer")

    # torchft's transport hooks (quorum thread) -------------------------------------------------

    def on_send(self, dst_ranks: list[int], step: int) -> None:
        # The quorum thread serves the state between updates: the main thread is past the last
        # optimizer.step() and the next one waits for this quorum, so the digest is the state sent.
        self.emit("heal_send", step=step, to_replica_ranks=dst_ranks,
                  digest=self.digest() if self.digest is not None else None)

    def on_recv(self, src_rank: int, address: str, step: int) -> None:
        self.pending_heal = {"step": step, "source_replica_rank": src_rank, "source": address}
        # Numbered like every point, by the update the group is attempting (a fresh group: 1),
        # not by the peer's step it heals to, which no plan can know in advance.
        self.point(IN_HEAL, self.current_step() + 1)

    def healed(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """After the received state is loaded (main thread): the `heal` event with its digest."""
        heal = self.pending_heal or {"step": None}
        self.pending_heal = None
        self.emit("heal", digest=state_digest(model, optimizer), **heal)

    def close(self) -> None:
        self.probe.close()


class Checkpoints:
    """Periodic checkpoints of a replica job, written by group 0's rank 0 only (every group holds
    the same state at a committed step): serialised in memory, named by step and sha256, written
    to a temporary name, fsynced and renamed into place, reported with `save` once durable.
    Read back only if the bytes match the name's checksum, with ``weights_only=True``."""

    def __init__(self, probe: ReplicaProbe) -> None:
        self.probe = probe
        run_dir = probe.probe.run_dir
        self.root = Path(run_dir) / "checkpoints" if run_dir is not None else None

    def save(self, step: int, state: dict[str, Any], digest: str) -> None:
        if self.root is None or (self.probe.who.group, self.probe.who.group_rank) != (0, 0):
            return
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        name = f"step-{step:06d}-{hashlib.sha256(data).hexdigest()[:16]}.pt"
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / name)
        folder = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        self.probe.emit("save", step=step, checkpoint=name, digest=digest)

    def newest(self) -> tuple[str, dict[str, Any]] | None:
        """The newest checkpoint whose bytes match its checksum (a damaged one is rejected)."""
        if self.root is None or not self.root.is_dir():
            return None
        for path in sorted(self.root.glob("step-*.pt"), reverse=True):
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest()[:16] != path.stem.rsplit("-", 1)[1]:
                self.probe.emit("reject", checkpoint=path.name, reason="sha256 does not match its name")
                continue
            return path.name, torch.load(io.BytesIO(data), weights_only=True)
        return None


def record_quorums(probe: ReplicaProbe) -> logging.Handler:
    """torchft logs each new quorum to the `torchft_quorums` logger (data in the record's
    extra: quorum_id, step): turn each into a `quorum` event."""

    class QuorumEvents(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            probe.emit("quorum", quorum_id=getattr(record, "quorum_id", None), step=getattr(record, "step", None))

    handler = QuorumEvents(level=logging.INFO)
    logger = logging.getLogger("torchft_quorums")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False
    return handler


def allreduce_point(manager: Any, probe: ReplicaProbe) -> None:
    """A fault point inside the update's gradient all-reduce: DDP's comm hook calls
    ``manager.allreduce`` per bucket, so the instance's method is wrapped, and the point fires
    once the collective is issued and before it completes (a kill there leaves the peers
    inside it)."""
    inner = manager.allreduce

    def allreduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = inner(tensor, *args, **kwargs)
        probe.point(IN_ALLREDUCE, manager.current_step() + 1)
        return work

    manager.allreduce = allreduce
