"""The child-process helpers every launcher and supervisor shares (harness/launch/procs.py):
the environment a child starts with, and its process group plus a pre-exec step in one
Popen argument set on every supported Python."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainwreck.harness.launch import procs


def start_in_new_group(tmp_path: Path, kwargs_of: object = procs.process_group_kwargs) -> tuple[int, int, str]:
    """Start `sleep` in a new process group whose pre-exec step writes a marker file; its pid, pgid, marker."""
    marker = tmp_path / "ran"
    kwargs = kwargs_of(0, lambda: marker.write_text("yes"))  # type: ignore[operator]
    proc = subprocess.Popen(["sleep", "5"], stdin=subprocess.DEVNULL, **kwargs)
    try:
        return proc.pid, os.getpgid(proc.pid), marker.read_text()
    finally:
        proc.kill()
        proc.wait()


def test_a_child_leads_its_own_process_group_and_runs_the_pre_exec_step(tmp_path: Path) -> None:
    pid, pgid, ran = start_in_new_group(tmp_path)
    assert pgid == pid and ran == "yes"


def test_before_python_3_11_one_pre_exec_function_joins_the_group_and_runs_the_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "sys", SimpleNamespace(version_info=(3, 10)))
    assert list(procs.process_group_kwargs(0, lambda: None)) == ["preexec_fn"]
    pid, pgid, ran = start_in_new_group(tmp_path)
    assert pgid == pid and ran == "yes"


def test_a_childs_environment_imports_this_checkout_and_keeps_gloo_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = procs.child_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [procs.REPO_ROOT, "/elsewhere"]
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["OMP_NUM_THREADS"] == "1"
    assert (Path(procs.REPO_ROOT) / "harness" / "launch" / "procs.py").is_file()
