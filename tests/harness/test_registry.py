"""The launcher registry (harness/registry.py) is the one place a launcher is declared.

Every entry loads, every reader (JobSpec, run_job, the commands' choices, the pytest
plugin) asks it, and no other module spells a launcher's name."""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from tests.test_architecture import TOPS
from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.launch import gpus
from trainwreck.harness.registry import (COMMAND, CUDA_STARTUP_S, LAUNCHERS, REFERENCE, REPLICA_GROUPS, LauncherKind, UnknownLauncher,
                                         get_launcher, launcher_names, load)
from trainwreck.harness.supervise.spec import JobSpec, SpecError
from trainwreck.harness.supervise.spec import Reference, ReplicaGroups
from trainwreck.trainer.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
NAMES = frozenset(LAUNCHERS)
SAMPLE_TARGETS = {REFERENCE: Reference(TrainConfig.tiny()), COMMAND: Command("python t.py"),
                  REPLICA_GROUPS: ReplicaGroups("python t.py")}
"""One target of each kind, for the checks that build a job for every launcher."""
ALLOWED = {
    "harness/registry.py": NAMES,  # the declarations themselves
    # A framework row named after the plain torchrun script it runs (not a launcher).
    "harness/suites/frameworks.py": {"torchrun"},
}


def launcher_literals(root: Path) -> list[str]:
    """Every string constant equal to a launcher name in our source, outside ALLOWED."""
    found = []
    for top in TOPS:
        for path in sorted((root / top).rglob("*.py")):
            rel = str(path.relative_to(root))
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Constant) and node.value in NAMES and node.value not in ALLOWED.get(rel, ()):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_but_the_registry_spells_a_launcher_name() -> None:
    assert launcher_literals(REPO) == [], "use harness/registry.py (get_launcher, launcher_names, DEFAULT_LAUNCHER)"


def test_the_launcher_name_check_finds_a_name_it_is_shown(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "x.py").write_text('launcher = "spawn"\nother = "spawning"\n')
    assert launcher_literals(tmp_path) == ["harness/x.py:1: 'spawn'"]


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_every_declared_launcher_loads_its_supervisor_and_factory(name: str) -> None:
    kind = get_launcher(name)
    assert kind.name == name and kind.serves and kind.help
    assert callable(kind.supervisor_class())
    if kind.factory is not None:
        assert callable(load(kind.factory))


def test_get_launcher_of_torchrun_is_its_declaration_not_an_error() -> None:
    kind = get_launcher("torchrun")
    assert kind.fixed_world_size and kind.factory is None
    assert kind.supervisor_class().__name__ == "TorchrunSupervisor"
    with pytest.raises(TypeError, match="starts its attempts itself"):
        kind.attempt_launcher(None)


def test_an_unknown_launcher_is_an_input_error_naming_the_known_ones() -> None:
    with pytest.raises(UnknownLauncher, match="known launchers: " + ", ".join(LAUNCHERS)):
        get_launcher("mpirun")


def test_the_commands_offer_only_launchers_that_serve_their_targets() -> None:
    from trainwreck.harness.commands import chaos, defects, run

    def choices(module: object) -> list[str]:
        parser = argparse.ArgumentParser()
        module.configure(parser)  # type: ignore[attr-defined]
        return next(a.choices for a in parser._actions if a.dest == "launcher")  # type: ignore[return-value]

    assert "cmd" not in choices(chaos) and list(choices(chaos)) == list(launcher_names(REFERENCE))
    assert list(choices(run)) == list(launcher_names())  # the reference's, and --cmd's (warm or cold)
    assert list(choices(defects)) == [n for n in launcher_names(REFERENCE) if LAUNCHERS[n].planted_watchdogs]
    assert "torchrun" not in choices(defects)


def test_the_pytest_plugin_option_lists_the_registry() -> None:
    from trainwreck.harness.pytest_plugin import LAUNCHER, OPTIONS

    assert tuple(OPTIONS[LAUNCHER].choices) == launcher_names(REFERENCE)


def test_a_job_gets_the_default_launcher_of_its_target() -> None:
    assert JobSpec(config=TrainConfig.tiny()).launcher == "warm"
    assert JobSpec(target=Command("python t.py")).launcher == "cmd-warm"  # --cmd forks warm ranks by default; "cmd" is the cold start
    assert JobSpec(target=ReplicaGroups("python t.py")).launcher == "replica-groups"


def test_every_target_kind_is_served_by_a_registered_launcher() -> None:
    assert set(SAMPLE_TARGETS) == {t for k in LAUNCHERS.values() for t in k.serves}
    for kind, target in SAMPLE_TARGETS.items():
        assert target.kind == kind and launcher_names(kind), kind


def test_a_launcher_that_does_not_serve_the_target_is_refused_naming_one_that_does() -> None:
    with pytest.raises(SpecError, match="launcher 'cmd' does not run a reference target; use 'warm'"):
        JobSpec(config=TrainConfig.tiny(), launcher="cmd")
    with pytest.raises(SpecError, match="launcher 'spawn' does not run a command target; use 'cmd-warm' or 'cmd'"):
        JobSpec(target=Command("python t.py"), launcher="spawn")


def test_startup_budgets_and_fixed_world_sizes_come_from_the_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "cuda_device_count", lambda: 0)  # the sample's device=auto stays on the CPU
    for name, kind in LAUNCHERS.items():
        target = SAMPLE_TARGETS[kind.serves[0]]
        spec = JobSpec(target=target, launcher=name, hang_timeout_s=5.0)
        assert spec.startup_budget_s == max(5.0, kind.startup_floor_s)
        if kind.fixed_world_size:
            with pytest.raises(SpecError, match="cannot change between attempts"):
                JobSpec(target=target, launcher=name, world_sizes=(4, 2))


def test_ranks_that_may_run_on_cuda_get_the_cuda_startup_floor_whatever_the_launcher(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each CUDA rank creates its own context (seconds, more with many at once): a 2 s hang timeout
    must not cover it, or a restarted attempt is a false hang alarm."""
    found = {"gpus": 0}
    monkeypatch.setattr(gpus, "cuda_device_count", lambda: found["gpus"])

    def budget(launcher: str = "warm", world_sizes: tuple[int, ...] = (2,), **config: str) -> float:
        return JobSpec(config=TrainConfig.tiny(**config), launcher=launcher, world_sizes=world_sizes,
                       hang_timeout_s=2.0).startup_budget_s

    assert budget(device="cuda", backend="gloo") == budget(backend="nccl") == CUDA_STARTUP_S
    assert budget(device="cpu") == budget(device="auto") == 2.0
    found["gpus"] = 2
    assert budget(device="cpu") == 2.0
    assert budget(device="auto", world_sizes=(4, 2)) == CUDA_STARTUP_S  # the second attempt's ranks fit the GPUs
    assert budget(device="auto", world_sizes=(4,)) == 2.0  # pick_device keeps them all on the CPU
    assert budget("spawn", device="cuda", backend="gloo") == max(LAUNCHERS["spawn"].startup_floor_s, CUDA_STARTUP_S)
    assert JobSpec(config=TrainConfig.tiny(device="cuda"), hang_timeout_s=2.0, startup_timeout_s=5.0).startup_budget_s == 5.0


def test_a_new_launcher_is_one_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A declaration alone makes a launcher every reader knows: the spec, its budget, the choices."""
    monkeypatch.setitem(LAUNCHERS, "slowfork", LauncherKind(
        "slowfork", "the spawn launcher, declared again", factory="trainwreck.harness.launch.launchers:SpawnLauncher",
        startup_floor_s=300.0))
    spec = JobSpec(config=TrainConfig.tiny(), launcher="slowfork", hang_timeout_s=5.0)
    assert spec.startup_budget_s == 300.0 and "slowfork" in launcher_names(REFERENCE)
    assert spec.launcher_kind.attempt_launcher(spec).__class__.__name__ == "SpawnLauncher"
    assert "slowfork" not in launcher_names(COMMAND)
