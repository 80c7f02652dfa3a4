"""The golden cache key of a --cmd job follows the code: the files the command names, every
file they import from the user's tree (transitively, relative imports and `-m` included), and
the installed torch and trainwreck versions. Static, so these tests run nothing."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from trainwreck.harness.supervise.command.golden_key import cmd_golden_key, command_sources
from trainwreck.trainer.frameworks import EXAMPLES

PYTHON = sys.executable


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


USER_TREE = {
    "train.py": """
        import torch
        import datautils
        from models import build
        def main():
            from .unused_relative import nothing  # a relative import outside a package: ignored
        """,
    "datautils.py": "from helpers.io import load\n",
    "helpers/__init__.py": "",
    "helpers/io.py": "def load(): return 1\n",
    "models/__init__.py": "from .mlp import build\n",
    "models/mlp.py": "def build(): return 2\n",
    "unrelated.py": "print('never imported')\n",
}


@pytest.mark.parametrize("edited", ["datautils.py", "helpers/io.py", "models/mlp.py", "models/__init__.py",
                                    "train.py"])
def test_editing_a_file_the_script_imports_changes_the_golden_key(tmp_path: Path, edited: str) -> None:
    root = tree(tmp_path, USER_TREE)
    command = f"{PYTHON} train.py --lr 3e-4"
    before = cmd_golden_key(command, 2, cwd=root)
    with open(root / edited, "a") as f:
        f.write("# an edit\n")
    assert cmd_golden_key(command, 2, cwd=root) != before


def test_files_the_script_never_imports_and_installed_packages_leave_the_key_alone(tmp_path: Path) -> None:
    root = tree(tmp_path, USER_TREE)
    sources = command_sources(f"{PYTHON} train.py", cwd=root)
    assert sorted(p.relative_to(root).as_posix() for p in sources.files) == [
        "datautils.py", "helpers/__init__.py", "helpers/io.py", "models/__init__.py", "models/mlp.py", "train.py"]
    assert set(sources.versions) == {"torch", "trainwreck", "python"}
    assert "not installed" not in sources.versions.values()
    before = cmd_golden_key(f"{PYTHON} train.py", 2, cwd=root)
    (root / "unrelated.py").write_text("print('edited')\n")
    assert cmd_golden_key(f"{PYTHON} train.py", 2, cwd=root) == before
    assert cmd_golden_key(f"{PYTHON} train.py", 1, cwd=root) != before  # the world size is in it too


def test_a_module_run_with_dash_m_is_followed_into_its_package(tmp_path: Path) -> None:
    root = tree(tmp_path, {"proj/__init__.py": "", "proj/train.py": "from . import data\n", "proj/data.py": "X = 1\n"})
    command = f"{PYTHON} -m proj.train"
    files = {p.relative_to(root).as_posix() for p in command_sources(command, cwd=root).files}
    assert files == {"proj/__init__.py", "proj/train.py", "proj/data.py"}
    before = cmd_golden_key(command, 2, cwd=root)
    (root / "proj/data.py").write_text("X = 2\n")
    assert cmd_golden_key(command, 2, cwd=root) != before


def test_fresh_golden_without_cmd_exits_2_with_the_reason(tmp_path: Path) -> None:
    import subprocess

    result = subprocess.run([PYTHON, "-m", "trainwreck.harness.cli", "run", "--fresh-golden", "--out",
                             str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--fresh-golden applies to --cmd only" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_fresh_golden_rebuilds_an_intact_cached_golden_run(tmp_path: Path) -> None:
    from trainwreck.harness.supervise.command.target import Command
    from trainwreck.harness.judge.golden import golden_for
    from trainwreck.harness.supervise.spec import JobSpec
    from trainwreck.rundir.layout import iter_events

    script = EXAMPLES / "plain_ddp.py"
    spec = JobSpec(target=Command(f"{PYTHON} {script} --total-steps 3"), world_sizes=(2,), hang_timeout_s=30.0,
                   run_dir=tmp_path / "run", keep=True)

    def pids(run_dir: Path) -> set[int]:
        return {e["pid"] for e in iter_events(run_dir) if e["kind"] == "start"}

    first = golden_for(spec, tmp_path / "cache")
    before = pids(first)
    assert golden_for(spec, tmp_path / "cache") == first and pids(first) == before  # cached
    again = golden_for(spec, tmp_path / "cache", fresh=True)
    assert again == first and pids(again).isdisjoint(before)  # the same key, a new run
