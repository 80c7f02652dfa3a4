"""Real framework runs for the tests: each is a `trainwreck run --cmd` job (harness/suites/frameworks.py's
launcher), judged by the unchanged invariants; and what a run's own events show."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import pytest

from trainwreck.harness.suites import frameworks
from trainwreck.harness.suites.frameworks import FRAMEWORKS, SCRIPTS, Job, Row, cmd_runner, job_for, run_one
from trainwreck.rundir.layout import iter_events


def without_extra(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """The frameworks table sees `module` as not installed (its extra missing), whatever is installed."""
    real = frameworks.importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == module else real(name, *args)

    monkeypatch.setattr(frameworks.importlib.util, "find_spec", find_spec)


def scenario(framework: str, name: str, out: Path) -> Row:
    """A table scenario of one framework, into out/<framework>-<name> (judged against out's golden)."""
    return run_one(job_for(FRAMEWORKS[framework], name), out, cmd_runner)


def with_golden(framework: str, out: Path) -> Path:
    """`out` holding the framework's golden row, judged valid: the runs a test module compares with it."""
    row = scenario(framework, "golden", out)
    assert row.valid is True, row
    return out


def custom(framework: str, name: str, out: Path, world_sizes: Sequence[int] = (2,), restarts: int = 0,
           faults: Sequence[dict[str, Any]] = (), args: Sequence[str] = (), prefix: Sequence[str] = ()) -> Row:
    """A job of the framework's example trainer with extra arguments (and a command prefix such
    as `env TMPDIR=...`), judged like a table row."""
    fw = FRAMEWORKS[framework]
    cmd = (*prefix, *fw.command(), *args)
    return run_one(Job(framework, name, cmd, tuple(world_sizes), restarts, tuple(faults), name), out, cmd_runner)


def script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / name), *args]


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in iter_events(run_dir) if e["kind"] == kind]


def fired(run_dir: Path) -> list[str]:
    return [e["fault_id"] for e in events(run_dir, "fault")]


def exit_codes(run_dir: Path, attempt: int) -> dict[int, int | None]:
    return {e["rank"]: e.get("code") for e in events(run_dir, "exit") if e.get("attempt") == attempt}


def ids_used_twice_in_an_epoch(run_dir: Path, total_steps: int) -> set[int]:
    """From the events alone: the lineage's batches (each attempt's updates after its restore),
    grouped by epoch, and the sample ids any epoch used more than once."""
    restores = {e["attempt"]: e["step"] for e in events(run_dir, "restore")}
    last_attempt = max(e["attempt"] for e in events(run_dir, "batch"))
    kept: dict[int, dict[int, tuple[int, list[int]]]] = {}  # step -> rank -> (epoch, ids); later attempts win
    for e in sorted(events(run_dir, "batch"), key=lambda e: e["attempt"]):
        resumed_at = restores.get(e["attempt"], 0)
        until = restores.get(e["attempt"] + 1, total_steps) if e["attempt"] < last_attempt else total_steps
        if resumed_at < e["step"] <= until:
            kept.setdefault(e["step"], {})[e["rank"]] = (e["epoch"], e["samples"])
    per_epoch: dict[int, Counter[int]] = {}
    for ranks in kept.values():
        for epoch, samples in ranks.values():
            per_epoch.setdefault(epoch, Counter()).update(samples)
    return {i for counts in per_epoch.values() for i, n in counts.items() if n > 1}
