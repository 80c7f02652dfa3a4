"""Where a campaign's plans run: one class per scheduling policy, chosen by name.

A chaos campaign is a stream of independent plans, each one job of a few ranks on
one host. How they are scheduled is a policy, not a pipeline: `LocalEngine` runs
them one after another in this process (the default, nothing to install);
`RayEngine` (harness/suites/rayengine.py, the `[ray]` extra) runs each as a Ray task that
reserves the cores its ranks need on whichever node Ray picks. Both run the same
`run_plan` and hand back the same `Outcome`; the campaign (harness/suites/campaign.py)
never asks which engine it has. Like xdist's schedulers: a Protocol, a class per
policy, a registry of names, so adding one is one class and one row.
"""
from __future__ import annotations

import importlib
import importlib.util
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from trainwreck.harness.suites.chaos import ChaosCase
from trainwreck.harness.registry import DEFAULT_LAUNCHER
from trainwreck.rundir.errors import InputError
from trainwreck.rundir.layout import RunDir, read_run_json, write_json_atomic


class EngineUnavailable(InputError):
    """An engine was asked for whose package is not installed; the message says how to install it."""


@dataclass(frozen=True)
class PlanJob:
    """One plan of a campaign: its place in the seeded stream and where its run directory ends up."""

    index: int
    case: ChaosCase
    run_dir: Path
    """OUT/plan-NNNN on the driver; an engine may run it elsewhere, but only a finished one lands here."""
    launcher: str = DEFAULT_LAUNCHER
    backend: str = "auto"

    @property
    def reproduce(self) -> str:
        return self.case.reproduce(self.launcher, self.backend)


@dataclass
class Outcome:
    """A judged plan (or one the harness could not judge: valid 'unknown')."""

    index: int
    case: ChaosCase
    run_dir: Path
    valid: object
    reproduce: str
    seconds: float
    node: dict[str, Any] = field(default_factory=dict)
    """Which machine ran it (run.json's "node"): engine, id, host, ip."""


@dataclass(frozen=True)
class EngineOptions:
    """What a command line can say about scheduling (each engine reads the fields it understands)."""

    address: str | None = None
    """Ray: the cluster to join (`ray://`, `HOST:PORT`, `auto`); None: RAY_ADDRESS, else a local instance."""
    cpus_per_rank: float = 1.0
    """Ray: logical CPUs reserved per rank (a plan reserves world_size x this, at most one whole node)."""


class Engine(Protocol):
    """A scheduling policy for independent plans."""

    name: ClassVar[str]

    def describe(self) -> str:
        """One line for the campaign's header: what runs the plans, and on how much."""

    def submit(self, job: PlanJob) -> list[Outcome]:
        """Start `job` (waiting for room first if the engine is full); return the plans finished meanwhile."""

    def drain(self) -> list[Outcome]:
        """Wait for every plan still running; return their outcomes."""

    def close(self) -> None:
        """Release what the engine started (a Ray instance it began, its tasks); idempotent."""


def this_host() -> dict[str, Any]:
    host = socket.gethostname()
    return {"engine": "local", "id": host, "host": host}


def run_plan(job: PlanJob, run_dir: Path, node: dict[str, Any], golden_cache: Path | None = None) -> Outcome:
    """Run and judge one plan in `run_dir` (the harness unchanged) and stamp the node into its run.json.

    A harness error is this plan's UNKNOWN with its traceback in chaos-error.txt, never
    the end of the campaign."""
    from trainwreck.harness.judge.runner import run_judged, verdict_lines  # torch: only where plans run

    started = time.monotonic()
    try:
        judged = run_judged(job.case.spec(run_dir, job.launcher, job.backend), golden_cache=golden_cache)
        valid = judged.judgement.valid
        if valid is not True:
            lines = verdict_lines(judged.judgement) + [f"reproduce: {job.reproduce}"]
            (run_dir / "chaos-failure.txt").write_text("\n".join(lines) + "\n")
    except Exception:  # noqa: BLE001 - a harness error is this run's "unknown", not the end of the chaos run
        valid = "unknown"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "chaos-error.txt").write_text(traceback.format_exc())
    stamp_node(run_dir, node)
    return Outcome(job.index, job.case, run_dir, valid, job.reproduce, time.monotonic() - started, node)


def stamp_node(run_dir: Path, node: dict[str, Any]) -> None:
    """Record in run.json (an extra field, allowed by the format) which node ran the job."""
    paths = RunDir(run_dir)
    if paths.run_json.exists():
        write_json_atomic(paths.run_json, {**read_run_json(run_dir), "node": node})


class LocalEngine:
    """The default: plans one after another in this process, on this host's cores."""

    name: ClassVar[str] = "local"

    def __init__(self, options: EngineOptions) -> None:
        if options.address is not None:
            raise InputError(f"--address {options.address}: an address is for --engine ray; "
                             "drop it or add --engine ray")
        self.node = this_host()

    def describe(self) -> str:
        return f"local engine on {self.node['host']} (one plan at a time)"

    def submit(self, job: PlanJob) -> list[Outcome]:
        return [run_plan(job, job.run_dir, self.node)]

    def drain(self) -> list[Outcome]:
        return []

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class EngineEntry:
    target: str
    """`module:Class`, imported only when chosen (Ray is never imported for the local engine)."""
    requires: str | None = None
    """The top-level package it needs; absent: EngineUnavailable with `install`."""
    install: str = ""


ENGINES: dict[str, EngineEntry] = {
    "local": EngineEntry("trainwreck.harness.suites.engines:LocalEngine"),
    "ray": EngineEntry("trainwreck.harness.suites.rayengine:RayEngine", requires="ray",
                       install="pip install 'trainwreck[ray]' (or: pip install 'ray[default]')"),
}
"""Engine name -> its class; the CLI's --engine choices are these keys."""


def engine_class(name: str) -> type:
    entry = ENGINES.get(name)
    if entry is None:
        raise InputError(f"--engine {name!r} is unknown; engines: {', '.join(ENGINES)}")
    if entry.requires and importlib.util.find_spec(entry.requires) is None:
        raise EngineUnavailable(f"--engine {name} needs the {entry.requires!r} package, which is not installed; "
                                f"install it with {entry.install}")
    module, _, attr = entry.target.partition(":")
    return getattr(importlib.import_module(module), attr)


def open_engine(name: str, options: EngineOptions) -> Engine:
    """The engine called `name`, started with `options` (exit-2 errors for a missing package or bad option)."""
    return engine_class(name)(options)
