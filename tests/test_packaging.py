"""The installed names: everything lives under `trainwreck.*`, and a user's own modules
named like our folders (a training project very often has a `trainer.py`) shadow nothing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOPS = ("rundir", "trainer", "harness", "faults", "invariants", "report", "benchmarks")
# Each would end the process if Python imported it instead of trainwreck's own package.
SHADOW = "raise SystemExit('shadowed: the user module {name}.py was imported instead of trainwreck.{name}')\n"


def test_every_package_folder_is_installed_under_the_trainwreck_namespace():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(("trainwreck", *p.parent.relative_to(REPO).parts))
               for top in TOPS for p in (REPO / top).rglob("__init__.py")}
    assert folders == set(setuptools["packages"]), "a folder with __init__.py is missing from pyproject's packages"
    for top in TOPS:
        assert setuptools["package-dir"][f"trainwreck.{top}"] == top


def test_the_installed_packages_are_the_ones_in_this_checkout():
    from trainwreck import harness, invariants, trainer

    for module in (trainer, harness, invariants):
        assert Path(module.__file__).resolve().parent.parent == REPO


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """A working directory that holds a user's own trainer.py, harness.py, faults.py, ..."""
    for name in TOPS:
        (tmp_path / f"{name}.py").write_text(SHADOW.format(name=name))
    return tmp_path


def _run(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": "", **(env or {})})


def test_the_trainer_runs_and_is_judged_from_a_directory_holding_a_users_own_trainer_module(user_project):
    # `python -m` puts the working directory first on sys.path: the place a shadow would win.
    trained = _run(user_project, sys.executable, "-m", "trainwreck.trainer", "--run-dir", "run",
                   "--tiny", "--total-steps", "3")
    assert trained.returncode == 0, trained.stderr
    checked = _run(user_project, sys.executable, "-m", "trainwreck.invariants", "run", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["valid"] is True


def test_trainwreck_run_works_from_a_directory_holding_a_users_own_harness_and_trainer(user_project, golden_cache):
    cli = Path(sys.executable).with_name("trainwreck")
    plan = json.dumps([{"id": "k1", "kind": "kill", "rank": 1, "step": 3}])
    result = _run(user_project, str(cli), "run", "--plan", plan, "--total-steps", "6", "--out", "run", "--json",
                  env={"TRAINWRECK_GOLDEN_CACHE": str(golden_cache)})
    assert "shadowed" not in result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["valid"] is True
    fired = [json.loads(line) for path in (user_project / "run" / "events").glob("*.jsonl")
             for line in path.read_text().splitlines() if '"fault"' in line]
    assert [e["fault_id"] for e in fired if e.get("kind") == "fault"] == ["k1"]


def test_the_example_training_scripts_are_package_data_so_a_wheel_ships_them():
    """`trainwreck frameworks` and the docs' examples run from a wheel: every script under
    trainer/frameworks/examples matches pyproject's package-data globs."""
    tomllib = pytest.importorskip("tomllib")
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    base = REPO / "trainer" / "frameworks"
    scripts = {p.relative_to(base) for p in (base / "examples").rglob("*.py")}
    shipped = {p.relative_to(base) for pattern in globs["trainwreck.trainer.frameworks"] for p in base.glob(pattern)}
    assert {"examples/plain_ddp.py", "examples/ddp_tutorial/multigpu_torchrun.py", "examples/mingpt/trainer.py"} <= {
        str(s) for s in scripts}
    assert scripts == shipped, scripts ^ shipped


@pytest.mark.slow
def test_a_built_wheel_holds_every_example_training_script(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                                  ".pytest_cache"))
    built = _run(source, sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                 str(tmp_path / "dist"), ".")
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {"trainwreck/trainer/frameworks/examples/" + str(p.relative_to(REPO / "trainer" / "frameworks" / "examples"))
            for p in (REPO / "trainer" / "frameworks" / "examples").rglob("*.py")}
    assert want <= names, want - names
