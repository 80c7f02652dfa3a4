"""The command line's promises about itself: refusals before any rank starts, and help that
matches what each command accepts."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from trainwreck.harness.cli import main as cli
from trainwreck.harness.launch import gpus


def refused_before_anything_ran(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> str:
    """Run `argv` with its own golden cache and run directory; assert exit 2, one line, and
    that neither a golden run nor the job left anything behind. Returns the line."""
    monkeypatch.setenv("TRAINWRECK_GOLDEN_CACHE", str(tmp_path / "golden"))
    code = cli([*argv, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "run").exists() and not any((tmp_path / "golden").glob("*")), "a rank started"
    return err


@pytest.mark.parametrize("found, sizes", [(1, "2"), (0, "1"), (2, "2,4")])
def test_nccl_with_fewer_gpus_than_ranks_exits_2_naming_the_count_and_gloo_before_any_rank_starts(
        found: int, sizes: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "cuda_device_count", lambda: found)
    err = refused_before_anything_ran(tmp_path, ["run", "--backend", "nccl", "--world-sizes", sizes],
                                      capsys, monkeypatch)
    wanted = max(int(s) for s in sizes.split(","))
    assert f"world size {wanted} needs {wanted} GPUs" in err, err
    assert (f"this machine has {found} CUDA GPU(s)" if found else "this machine has no CUDA GPU") in err, err
    assert "--backend gloo" in err and (f"--world-sizes {found}" in err) == (found > 0), err
    assert ("--backend gloo --set device=cuda, whose ranks share the GPUs" in err) == (found > 0), err


def test_on_this_machine_nccl_is_refused_as_the_gpus_torch_sees_cannot_hold_the_ranks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    found = gpus.cuda_device_count()  # the real count: 0 on a CPU machine
    err = refused_before_anything_ran(tmp_path, ["run", "--backend", "nccl", "--world-sizes", str(found + 1)],
                                      capsys, monkeypatch)
    assert f"needs {found + 1} GPUs" in err, err


def test_enough_gpus_for_every_rank_pass_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU needed without nccl or device=cuda; nccl needs one per rank of the widest attempt,
    # gloo with device=cuda one in all (its ranks share it).
    gpus.check_gpus({"backend": "gloo", "device": "cpu"}, (4,))
    gpus.check_gpus({}, (4,))
    monkeypatch.setattr(gpus, "cuda_device_count", lambda: 1)
    gpus.check_gpus({"backend": "gloo", "device": "cuda"}, (4, 2))
    gpus.check_gpus({"backend": "nccl", "device": "cuda"}, (1,))


def test_device_cuda_without_a_gpu_exits_2_before_any_rank_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "cuda_device_count", lambda: 0)
    err = refused_before_anything_ran(tmp_path, ["run", "--backend", "gloo", "--set", "device=cuda",
                                                 "--world-sizes", "2"], capsys, monkeypatch)
    assert "device=cuda puts the ranks on CUDA GPUs and this machine has no CUDA GPU" in err, err


def test_run_accepts_the_auto_backend_its_help_calls_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["run", "--help"]) == 0
    assert "{auto,gloo,nccl}" in capsys.readouterr().out
    # Refused for the world sizes, which come after the backend: `auto` itself was accepted.
    assert cli(["run", "--backend", "auto", "--world-sizes", "two"]) == 2
    err = capsys.readouterr().err
    assert "--world-sizes 'two'" in err and "invalid choice" not in err, err


def test_version_prints_the_installed_distributions_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert cli(["--version"]) == 0
    assert capsys.readouterr().out == f"trainwreck {version('trainwreck')}\n"


def test_sweep_points_the_save_does_not_have_exit_2_in_one_line_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwreck.faults.sweep import crash_points, record_save_ops

    err = refused_before_anything_ran(tmp_path, ["sweep", "--points", "99:after,0:before"], capsys, monkeypatch)
    last = max(index for index, _, _ in crash_points(record_save_ops("reference")))
    assert "--points 99:after: reference's save has no such crash point" in err, err
    assert f"ops 0..{last} before and after" in err, err


def test_an_unknown_sweep_writer_lists_the_writers_and_no_defect_that_writes_like_the_reference(
        capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.harness.suites.sweep import writer_variants
    from trainwreck.trainer.entry import VARIANTS
    from trainwreck.trainer.loop import Trainer

    assert cli(["sweep", "--writer", "nope"]) == 2
    err = capsys.readouterr().err
    for name, cls in VARIANTS.items():
        own = cls.store_class is not Trainer.store_class or cls.save is not Trainer.save or \
            cls.shard_manifest_files is not Trainer.shard_manifest_files
        assert bool(re.search(rf"\b{name}\b", err)) == (own or name == "reference"), (name, err)
    assert {"naive_writer", "rename_no_fsync"} <= set(writer_variants())
    for other in ("dcp", "dcp_in_place", "--framework", "lightning", "torchrun"):
        assert other in err, err


def test_handbook_help_names_every_chapter(capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.report.chapters import CHAPTERS

    assert cli(["handbook", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert all(chapter.slug in text for chapter in CHAPTERS), text


def test_a_full_disk_that_names_no_file_is_named_by_the_run_directorys_disk(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import errno
    from types import SimpleNamespace

    from trainwreck.harness.cli import run_command

    def main(args: argparse.Namespace) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # os.write on a descriptor names no file

    out = tmp_path / "run"
    assert run_command("run", SimpleNamespace(main=main), argparse.Namespace(out=out)) == 2
    mount = tmp_path
    while not os.path.ismount(mount):
        mount = mount.parent
    err = capsys.readouterr().err
    assert f"{out} is on the disk mounted at {mount} (" in err and " free of " in err, err
    assert "free space on that disk" in err, err


def test_a_run_leaves_nothing_in_tmpdir_and_keeps_torchs_cache_in_the_users_cache(tmp_path: Path) -> None:
    import subprocess
    import sys

    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(TMPDIR=str(tmp), HOME=str(home), TRAINWRECK_GOLDEN_CACHE=str(tmp_path / "golden"))
    done = subprocess.run([sys.executable, "-m", "trainwreck.harness.cli", "run", "--plan", "[]", "--world-sizes", "1",
                           "--total-steps", "4", "--out", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in tmp.iterdir()) == [], "the run left these in $TMPDIR"
    assert (home / ".cache" / "trainwreck" / "torchinductor").is_dir(), "torch never made its cache: nothing tested"


def test_a_torch_cache_folder_the_user_chose_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from trainwreck.harness.launch import torchcache

    monkeypatch.setenv(torchcache.ENV, str(tmp_path / "mine"))
    torchcache.keep_torch_cache_out_of_tmp()
    assert os.environ[torchcache.ENV] == str(tmp_path / "mine")
    monkeypatch.delenv(torchcache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    torchcache.keep_torch_cache_out_of_tmp()
    assert os.environ[torchcache.ENV] == str(tmp_path / "xdg" / "trainwreck" / "torchinductor")
