"""A broken machine under the real command lines (issue 24, item 8): a disk that fills while the
golden cache is written, a read-only cache folder, an events/ folder this user may not read.
Each exits 2 with one line naming the path and the fix, never a traceback or exit 1 (INVALID).

The tests run as root here, where permission bits bind nothing and a tmpfs needs mount
privileges, so each failure is injected where the machine would raise it: the file layer
(rundir/files.py), the cache's write probe, the listing of events/. The commands run
in-process (`harness.cli.main`), so the injection reaches them."""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.report.rundirs import clean_run
from trainwreck.harness.cli import main as trainwreck
from trainwreck.rundir import files


def one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], *expected: str) -> str:
    code = trainwreck(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err and len(lines) == 1, (code, err[-2000:])
    assert all(text in lines[0] for text in expected), lines[0]
    return lines[0]


def failing(real: Callable[..., Any], when: Callable[..., bool], code: int) -> Callable[..., Any]:
    """`real`, raising OSError `code` (naming the path) whenever `when(*args)` holds."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            path = str(args[0]) if args else str(kwargs.get("dir"))
            raise OSError(code, os.strerror(code), path)
        return real(*args, **kwargs)
    return wrapper


def test_a_disk_that_fills_while_the_golden_cache_is_written_exits_2_naming_it_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRAINWRECK_GOLDEN_CACHE", str(cache))
    monkeypatch.setattr(files, "write_atomic", failing(files.write_atomic, lambda path, *a, **k: Path(path).name == "golden.json",
                                                       errno.ENOSPC))
    line = one_line_exit_2(["run", "--plan", "[]", "--world-sizes", "1", "--total-steps", "2", "--out", str(tmp_path / "o")],
                           capsys, "the golden cache could not be written", str(cache), "No space left on device", "golden.json",
                           "free space on that disk", "TRAINWRECK_GOLDEN_CACHE")
    assert not [p for p in cache.iterdir() if p.name.startswith(".build-")], line  # no half-written entry kept


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_read_only_golden_cache_folder_exits_2_naming_it_and_the_fix_before_any_rank_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TRAINWRECK_GOLDEN_CACHE", str(cache))
    monkeypatch.setattr(tempfile, "mkstemp", failing(tempfile.mkstemp, lambda *a, **k: Path(str(k.get("dir"))) == cache, code))
    one_line_exit_2(["run", "--plan", "[]", "--world-sizes", "1", "--total-steps", "2", "--out", str(tmp_path / "o")],
                    capsys, f"the golden cache {cache} cannot be used", os.strerror(code), "TRAINWRECK_GOLDEN_CACHE")
    assert list(cache.iterdir()) == [] and not (tmp_path / "o" / "events").exists()


@pytest.mark.parametrize("command", ["check", "report"])
def test_an_unreadable_events_folder_exits_2_naming_it_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str) -> None:
    run = clean_run(tmp_path / "run")
    events = str(run / "events")
    monkeypatch.setattr(os, "listdir", failing(os.listdir, lambda path=".": str(path).rstrip("/") == events, errno.EACCES))
    one_line_exit_2([command, str(run)], capsys, events, "Permission denied", "chmod")
    assert not (run / "report" / "report.md").exists()
