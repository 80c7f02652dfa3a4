"""Every way a job's ranks can start, declared once: the launcher registry.

A launcher name used to pick a pipeline by `if`: `warm`/`spawn` built a per-attempt
launcher, `torchrun` swapped the whole supervisor, `cmd` needed its own golden run. Here
each launcher is one `LauncherKind` that says what the rest of the harness asks of it:
what starts an attempt (`factory`) or the whole job (`supervisor`), its startup budget,
whether the world size may change between attempts, which job targets it serves
(harness/supervise/spec.py), and its one-line help. `JobSpec` validates against it, `run_job`
dispatches on it, the pytest plugin and every command's `--launcher` choices read it.

Implementations are named as `module:attribute` (as `JobSpec.entry` is) and loaded only
when a job starts: this module stays stdlib-only, so the CLI's parsers and the pytest
plugin can list the launchers without importing torch, and the registry sits below every
layer that implements a launcher (tests/test_architecture.py). Adding a launcher is one
entry here plus its implementation; `tests/harness/test_registry.py` loads every entry and
fails on a launcher name spelled anywhere else.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from trainwreck.rundir.errors import InputError, UnknownName

WARM, SPAWN, TORCHRUN, CMD, CMD_WARM, RAY_TRAIN = "warm", "spawn", "torchrun", "cmd", "cmd-warm", "ray-driver"
"""The launcher names, for the few places that measure one launcher against another (benchmarks/)."""
REFERENCE, COMMAND, REPLICA_GROUPS = "reference", "command", "replica_groups"
"""The job targets a launcher can serve (`Target.kind` in harness/supervise/spec.py)."""
ATTEMPT_LOOP = "trainwreck.harness.supervise.supervisor:Supervisor"
"""The harness's own attempt loop: it starts every attempt through the launcher's factory."""


class UnknownLauncher(UnknownName):
    """A launcher name that is not in the registry; the message lists the known ones."""


T = TypeVar("T")


def by_name(items: Iterable[T], name: str, what: str, *, key: Callable[[T], str] = lambda item: item.name,
            error: type[InputError] = UnknownName, hint: str = "") -> T:
    """The item of `items` whose key is `name`; otherwise `error`, naming the bad value and every
    known one (the one lookup behind each `get_<thing>` of the harness)."""
    items = list(items)
    for item in items:
        if key(item) == name:
            return item
    raise error(f"unknown {what} {name!r}; known {what}s: {', '.join(key(item) for item in items)}{hint}")


@dataclass(frozen=True)
class LauncherKind:
    """One launcher: how its ranks start and what the harness may ask of it."""

    name: str
    help: str
    """One line for `--launcher` help and docs."""
    serves: tuple[str, ...] = (REFERENCE,)
    """The target kinds it can run: REFERENCE (the reference trainer), COMMAND (a user's command),
    REPLICA_GROUPS (a torchft trainer whose groups restart one at a time)."""
    factory: str | None = None
    """`module:callable(spec) -> Launcher` starting each attempt under ATTEMPT_LOOP; None when
    `supervisor` starts the attempts itself."""
    supervisor: str = ATTEMPT_LOOP
    """`module:Class(spec, run_dir)` whose `run(started)` supervises the whole job."""
    fixed_world_size: bool = False
    """True: every attempt has the same world size (torchrun's agent restarts with a fixed
    --nproc-per-node; replica groups restart one group at a time, each the same size)."""
    shrink_only: bool = False
    """True: a world-size schedule may only shrink (Ray Train's elastic group restarts smaller when a
    node is lost; nothing here adds a node back for it to grow)."""
    startup_floor_s: float = 0.0
    """Startup budget = max(hang_timeout_s, this): fresh interpreters import torch before publishing
    (and at least CUDA_STARTUP_S for ranks on CUDA)."""
    planted_watchdogs: bool = True
    """False: only the reference watchdog (harness/supervise/watchdog_variants.py) can supervise it."""
    fork_server: bool = False
    """True: its ranks fork from this process's fork server (the pytest plugin starts one per worker)."""
    agent_reaps_ranks: bool = False
    """True: an agent between the harness and the ranks reaps them, so a rank's own exit code and
    error reach the harness only through the agent's log (the root-cause finder reads it there)."""

    def startup_budget_s(self, hang_timeout_s: float, cuda: bool = False) -> float:
        """The watchdog's budget while a rank sets up (watchdog.py `setting_up`); `cuda`: the ranks
        run on CUDA devices, and each creates its own CUDA context."""
        return max(hang_timeout_s, self.startup_floor_s, CUDA_STARTUP_S if cuda else 0.0)

    def supervisor_class(self) -> Any:
        return load(self.supervisor)

    def attempt_launcher(self, spec: Any) -> Any:
        """The per-attempt launcher of `spec` (harness/launch/launchers.py `Launcher`)."""
        if self.factory is None:
            raise TypeError(f"launcher {self.name!r} starts its attempts itself ({self.supervisor}); "
                            "it has no per-attempt launcher")
        return load(self.factory)(spec)


SPAWN_STARTUP_S = 120.0
"""Fresh interpreters import torch first, several seconds each, all at once on a few shared cores."""
CUDA_STARTUP_S = 60.0
"""A rank on a CUDA device creates its CUDA context itself (a fork server cannot hold one: CUDA does
not survive a fork). On one H200 with up to 16 such ranks starting at once, a rank took up to 4.3 s
from its start to its first update, and two restarted ranks sat in `torch.cuda.set_device` past a
2 s hang timeout (a false hang alarm, 2026-11-28)."""
REPLICA_STARTUP_S = 180.0
"""A replica rank imports torch and torchft before its first progress: over 20 s each on a loaded
2-core machine, every group at once."""
RAY_STARTUP_S = 240.0
"""A Ray Train job starts a local Ray instance, then its worker actors import torch: a minute and
more on a loaded 2-core machine before the first progress (measured 60-80 s)."""

LAUNCHERS: dict[str, LauncherKind] = {k.name: k for k in (
    LauncherKind(WARM, "forked from a fork server that already imported torch (default; fast)",
                 factory="trainwreck.harness.launch.launchers:WarmLauncher", fork_server=True),
    LauncherKind(SPAWN, "fresh interpreters, nothing shared (slow; what a new process really does)",
                 factory="trainwreck.harness.launch.launchers:SpawnLauncher", startup_floor_s=SPAWN_STARTUP_S),
    LauncherKind(TORCHRUN, "the real elastic agent; it owns restarts, the world size is fixed",
                 supervisor="trainwreck.harness.supervise.torchrun:TorchrunSupervisor", fixed_world_size=True,
                 startup_floor_s=SPAWN_STARTUP_S, planted_watchdogs=False, agent_reaps_ranks=True),
    # Before CMD: the first launcher serving commands is --cmd's default (default_launcher).
    LauncherKind(CMD_WARM, "a user's `python SCRIPT.py`/`python -m MOD` per rank, forked from a server that "
                 "imported torch and the script's frameworks once, torchrun's environment (--cmd's default; "
                 "any other command starts cold as `cmd` does, saying why)", serves=(COMMAND,),
                 factory="trainwreck.harness.supervise.command.warm:WarmCmdLauncher", startup_floor_s=SPAWN_STARTUP_S),
    LauncherKind(CMD, "a user's own command per rank with torchrun's environment, a fresh process each (--cmd's cold start)",
                 serves=(COMMAND,), factory="trainwreck.harness.launch.launchers:CmdLauncher",
                 startup_floor_s=SPAWN_STARTUP_S),
    LauncherKind(RAY_TRAIN, "a Ray Train driver whose TorchTrainer restarts its worker group itself (FailureConfig); "
                 "the harness watches the workers' boards; a shrinking world-size schedule makes the group elastic",
                 serves=(COMMAND,), supervisor="trainwreck.harness.supervise.raytrain:RayTrainSupervisor",
                 shrink_only=True, startup_floor_s=RAY_STARTUP_S, planted_watchdogs=False, agent_reaps_ranks=True),
    LauncherKind("replica-groups", "torchft replica groups: a loopback lighthouse, a store per group; a failed "
                 "group restarts alone while the others train on", serves=(REPLICA_GROUPS,),
                 supervisor="trainwreck.harness.supervise.replicas:ReplicaSupervisor", fixed_world_size=True,
                 startup_floor_s=REPLICA_STARTUP_S, planted_watchdogs=False),
)}
DEFAULT_LAUNCHER = WARM
"""The launcher of a reference job that names none (and of every golden run)."""


def get_launcher(name: str) -> LauncherKind:
    """The declaration of launcher `name`; an UnknownLauncher naming the known ones otherwise."""
    return by_name(LAUNCHERS.values(), name, "launcher", error=UnknownLauncher)


def launcher_names(serves: str | None = None, planted_watchdogs: bool = False) -> tuple[str, ...]:
    """The launchers (in declaration order) serving target kind `serves`, e.g. a command's `choices`."""
    return tuple(k.name for k in LAUNCHERS.values()
                 if (serves is None or serves in k.serves) and (k.planted_watchdogs or not planted_watchdogs))


def default_launcher(target_kind: str) -> str:
    """The launcher a job of `target_kind` gets when it names none."""
    if target_kind in LAUNCHERS[DEFAULT_LAUNCHER].serves:
        return DEFAULT_LAUNCHER
    return launcher_names(target_kind)[0]


def launcher_help(names: tuple[str, ...]) -> str:
    """`--launcher` help listing `names` with their one-line help."""
    return "; ".join(f"{n}: {LAUNCHERS[n].help}" for n in names)


def load(path: str) -> Any:
    """The object a `module:attribute` path names."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
