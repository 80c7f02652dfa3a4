"""How a rank process joins a job: from a harness-owned store or from torchrun's environment."""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from trainwreck.trainer.config import ConfigError
from trainwreck.rundir.layout import launcher_identity, standalone_attempt

if TYPE_CHECKING:  # torch is imported where a process group or a device is made: a usage error never pays for it
    import torch
    import torch.distributed as dist


@dataclass(frozen=True)
class RankContext:
    """Who this process is in which attempt of which run."""

    run_dir: Path
    """The run directory (format trainwreck-run/1); events and checkpoints go below it."""
    rank: int
    world_size: int
    attempt: int
    """0-based attempt number; every attempt is a fresh process group."""
    local_rank: int = 0
    """Index of the rank on its host (selects cuda:LOCAL_RANK)."""
    store_host: str | None = None
    """Host of a harness-owned TCPStore; None means torchrun's env:// rendezvous."""
    store_port: int | None = None
    store_prefix: str = ""
    """Namespace inside the store; a fresh one per attempt, because reused keys break the next attempt."""
    standalone: bool = False
    """True when no harness supervises (python -m trainer, torchrun): rank 0 writes `end` itself."""
    pg_timeout_s: float = 1800.0
    """Collective timeout of the process group (gloo's own default is 30 minutes)."""

    @classmethod
    def from_torchrun_env(cls, run_dir: Path, **overrides: object) -> RankContext:
        env = os.environ
        missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
        if missing:
            # Plain `python -m trainer` without torchrun: a single-rank job.
            # A rerun in the same run directory is a new attempt, not attempt 0 again.
            return cls(run_dir=Path(run_dir), rank=0, world_size=1, standalone=True,
                       attempt=standalone_attempt(Path(run_dir), 0, None),
                       **overrides)  # type: ignore[arg-type]
        if not (env["RANK"].isdigit() and env["WORLD_SIZE"].isdigit() and int(env["RANK"]) < int(env["WORLD_SIZE"])):
            raise ConfigError(f"RANK={env['RANK']!r} WORLD_SIZE={env['WORLD_SIZE']!r} are not a rank of a world: "
                              "run under torchrun, or unset both for a one-process job")
        check_rendezvous_env(int(env["WORLD_SIZE"]))
        return cls(
            run_dir=Path(run_dir),
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            # torchrun restarts the whole worker group and counts from 0 in each
            # invocation; a second invocation in the same run directory continues after
            # the attempts already logged (every rank of it reads the same base).
            attempt=standalone_attempt(Path(run_dir), int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
                                       launcher_identity()),
            standalone=True,
            **overrides,  # type: ignore[arg-type]
        )


def init_process_group(ctx: RankContext, backend: str) -> None:
    import torch.distributed as dist

    timeout = timedelta(seconds=ctx.pg_timeout_s)
    if ctx.store_host is None:
        if ctx.world_size == 1 and not _multi_host_asked():
            # A lone rank still gets a real process group so the code path is the same;
            # a private HashStore opens no port at all: a stray MASTER_ADDR (0.0.0.0, the
            # host's address) must not make a one-process job listen on every interface.
            store: dist.Store = dist.HashStore()
        elif _hosts_env_store(ctx):
            store = _env_store(ctx, timeout)
        else:
            dist.init_process_group(backend, rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)
            return
    else:
        store = dist.TCPStore(ctx.store_host, ctx.store_port, ctx.world_size, is_master=False,
                              timeout=timeout)
        if ctx.store_prefix:
            store = dist.PrefixStore(ctx.store_prefix, store)
    dist.init_process_group(backend, store=store, rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timeout)


MULTI_HOST_ENV = "TRAINWRECK_MULTI_HOST"
"""Set to 1 to let a one-rank job serve env:// on MASTER_ADDR anyway (nobody else could join it)."""


def _multi_host_asked() -> bool:
    return os.environ.get(MULTI_HOST_ENV) == "1"


def check_rendezvous_env(world_size: int) -> None:
    """Before any rank starts: env:// with more than one rank needs MASTER_ADDR and an integer
    MASTER_PORT (torch's own error is a traceback deep inside init_process_group)."""
    env = os.environ
    if world_size == 1 or env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return
    port = env.get("MASTER_PORT", "")
    if not env.get("MASTER_ADDR") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"MASTER_ADDR={env.get('MASTER_ADDR')!r} MASTER_PORT={env.get('MASTER_PORT')!r}: "
                          "a job of several ranks needs both (a host and a port 1-65535); run it under torchrun")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _hosts_env_store(ctx: RankContext) -> bool:
    """True where env:// would make rank 0 host a store on every interface and we must not.

    Under torchrun without a shared agent store (TORCHELASTIC_USE_AGENT_STORE != True),
    rank 0 of env:// serves MASTER_ADDR:MASTER_PORT itself. When MASTER_ADDR is loopback
    (single-host torchrun), we create those stores so the server listens on loopback only;
    any other MASTER_ADDR is an explicit multi-host opt-in and keeps torch's own path.
    """
    env = os.environ
    return (env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and "MASTER_PORT" in env
            and _is_loopback(env.get("MASTER_ADDR", "")))


def _env_store(ctx: RankContext, timeout: timedelta) -> dist.Store:
    import torch.distributed as dist

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    host = "127.0.0.1" if host == "localhost" else host
    if ctx.rank == 0:
        return loopback_store(port, ctx.world_size, timeout, host)
    return dist.TCPStore(host, port, ctx.world_size, is_master=False, timeout=timeout)


def _bound_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def loopback_store(port: int, world_size: int | None, timeout: timedelta, host: str = "127.0.0.1") -> dist.TCPStore:
    """A TCPStore server listening on `host`:`port` only (port 0: the kernel picks one).

    A TCPStore server ignores its host argument and listens on every interface, so we bind
    the socket ourselves and hand it over (``master_listen_fd``, torch >= 2.0). The store
    owns the descriptor from then on (it closes it), hence ``detach``. torch 2.13's default
    libuv backend adopts the socket (checked on 2.13 and 2.11: it then listens on 127.0.0.1
    only, and so does the classic backend given a detached descriptor); should a
    libuv backend refuse the descriptor, the classic backend (``use_libuv=False``), which
    has honoured ``master_listen_fd`` since it was added, takes a freshly bound socket.
    """
    import torch.distributed as dist

    last: Exception | None = None
    for use_libuv in (True, False):
        sock = _bound_socket(host, port)
        bound_port = sock.getsockname()[1]
        fd = sock.detach()
        try:
            return dist.TCPStore(host, bound_port, world_size, is_master=True, wait_for_workers=False,
                                 timeout=timeout, master_listen_fd=fd, use_libuv=use_libuv)
        except (RuntimeError, ValueError, OSError) as exc:
            # Not closed here: the store may already own (and have closed) the descriptor,
            # and closing a reused number would hit an unrelated file.
            last = exc
    raise RuntimeError(f"could not start a TCPStore on {host}:{port}: {last}")


def cuda_count() -> int:
    """Visible CUDA devices (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pick_device(device: str, local_rank: int, local_world_size: int = 1) -> torch.device:
    """cpu, or cuda:(LOCAL_RANK mod the GPU count). 'auto' takes CUDA only when there is a GPU
    for every rank on this host (ranks split between GPU and CPU would disagree); 'cuda' with
    fewer GPUs than ranks shares them, rank r on device r mod n, which gloo runs and nccl refuses
    (check_nccl_devices). Sharing is how a one-GPU machine exercises multi-rank CUDA state."""
    import torch

    gpus = cuda_count()
    if not takes_cuda(device, gpus, local_world_size):
        return torch.device("cpu")
    if gpus == 0:
        raise ConfigError("device='cuda' was requested but CUDA is not available; use device='cpu'")
    index = local_rank % gpus
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def takes_cuda(device: str, gpus: int, local_world_size: int) -> bool:
    """Whether a rank of `device` goes on a CUDA GPU (`pick_device`): 'cuda' always (with no GPU it
    is refused), 'auto' only when this host has a GPU for every one of its ranks, 'cpu' never."""
    return device == "cuda" or (device == "auto" and gpus >= local_world_size)


def check_nccl_devices(local_world_size: int, gpus: int) -> None:
    """nccl needs a GPU of its own per rank: two ranks on one device fail inside NCCL's init
    ("invalid usage") after the job has started, so say it first, with the alternative."""
    if local_world_size > gpus:
        raise ConfigError(f"backend='nccl' runs one rank per GPU, but this host has {local_world_size} rank(s) "
                          f"and {gpus} GPU(s); use backend='gloo' with device='cuda' (ranks share the GPUs, "
                          f"rank r on GPU r mod {max(gpus, 1)}), or at most {gpus} rank(s)")
