"""A session-wide check that no test leaves files behind (issue 24): not in $TMPDIR, and not
in the repository (where a test's working directory is), only under its own tmp_path or --out.

The session gets a private $TMPDIR (inherited by xdist workers, ranks and every subprocess),
so other sessions on a shared machine cannot look like our leftovers. At the end the
controller lists what is left there beside pytest's own tmp_path tree, and what is new in
the repository's top level, and fails the session naming them. Set TRAINWRECK_TMP_CHECK=0
to turn it off (a debugging session that wants to keep its scratch files)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ENV = "TRAINWRECK_TEST_TMPDIR"
THIRD_PARTY_CACHES = ("pytest-of-",)
"""Caches libraries keep in $TMPDIR by design (pytest's tmp_path tree). torch's compile cache
is not one: the plugin points it at the user's cache (harness/launch/torchcache.py)."""
IGNORED_IN_REPO = {".pytest_cache", ".hypothesis", ".venv", "__pycache__", ".git", ".coverage"}


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("TRAINWRECK_TMP_CHECK") == "0" or not _is_controller(config) or ENV in os.environ:
        return
    private = tempfile.mkdtemp(prefix="trainwreck-tests-")
    os.environ[ENV] = os.environ["TMPDIR"] = private
    tempfile.tempdir = private
    config.stash[_KEY] = (private, _repo_entries(config))


_KEY = pytest.StashKey[tuple[str, set[str]]]()


def _repo_entries(config: pytest.Config) -> set[str]:
    return {p.name for p in Path(config.rootpath).iterdir()}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _KEY not in session.config.stash:
        return
    private, before = session.config.stash[_KEY]
    left = sorted(name for name in os.listdir(private) if not name.startswith(THIRD_PARTY_CACHES))
    new = sorted(n for n in _repo_entries(session.config) - before
                 if n not in IGNORED_IN_REPO and not n.endswith(".egg-info"))
    shutil.rmtree(private, ignore_errors=True)
    if left or new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"tests left files behind: in $TMPDIR {left or 'nothing'}, in the repository "
                   f"{new or 'nothing'}; a test must write under its tmp_path (or --out) only")
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
