"""How the suite itself runs: the modules that must run whole on one xdist worker do (tests/scheduling.py), and a default test that hangs fails after its bound (tests/timeouts.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.scheduling import ONE_WORKER, ROOT, scope_of


def pytest_in(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """A pytest of `folder` alone, as its own conftest sets it up: the repository importable (its
    conftest names our plugins), none of this suite's options or the trainwreck plugin."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args, "-p", "no:cacheprovider", "-p", "no:trainwreck",
                           "-o", "addopts=", str(folder)], cwd=folder, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=120)


def test_the_modules_with_module_fixtures_are_found_by_their_node_id_paths() -> None:
    assert {"tests/report/test_handbook.py", "tests/report/test_truth.py"} <= ONE_WORKER
    assert all((ROOT / module).is_file() for module in ONE_WORKER), sorted(ONE_WORKER)
    assert "tests/test_architecture.py" not in ONE_WORKER, "a module without one is scheduled test by test"


def test_a_one_worker_modules_tests_share_one_scope_and_every_other_test_is_its_own() -> None:
    module = sorted(ONE_WORKER)[0]
    assert scope_of(f"{module}::test_a") == scope_of(f"{module}::test_b[1]") == module
    assert scope_of("tests/test_architecture.py::test_a") == "tests/test_architecture.py::test_a"


# Two modules with a module fixture each, declared one-worker modules, beside ungrouped tests.
MODULE = textwrap.dedent("""
    import os, pytest
    @pytest.fixture(scope="module")
    def built():
        with open(os.environ["BUILT_LOG"], "a") as log:
            log.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")
    @pytest.mark.parametrize("i", range(6))
    def test_uses(built, i):
        pass
""")
CONFTEST = textwrap.dedent("""
    import tests.scheduling
    tests.scheduling.ONE_WORKER = frozenset({"test_a.py", "test_b.py"})
    from tests.scheduling import pytest_xdist_make_scheduler
""")


def test_under_xdist_each_one_worker_modules_fixture_is_built_once(tmp_path: Path) -> None:
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(MODULE)
    (tmp_path / "test_c.py").write_text("".join(f"def test_{i}():\n    pass\n" for i in range(8)))
    (tmp_path / "conftest.py").write_text(CONFTEST)
    done = pytest_in(tmp_path, {"BUILT_LOG": str(tmp_path / "built.log")}, "-n", "2", "--dist", "loadgroup")
    assert done.returncode == 0, done.stdout + done.stderr
    built = (tmp_path / "built.log").read_text().split()
    assert sorted(built[::2]) == ["test_a", "test_b"], f"each module's fixture once: {built}"


HANGS = textwrap.dedent("""
    import threading
    def test_waits_forever():
        threading.Event().wait()
""")
CONFTEST_BOUNDED = 'pytest_plugins = ["tests.timeouts"]\n'


def test_a_default_test_that_hangs_fails_after_its_bound_instead_of_stalling_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    (tmp_path / "conftest.py").write_text(CONFTEST_BOUNDED)
    done = pytest_in(tmp_path, {"TRAINWRECK_TEST_TIMEOUT_S": "1"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Failed: Timeout (>1.0s) from pytest-timeout" in done.stdout and "1 failed" in done.stdout, done.stdout
