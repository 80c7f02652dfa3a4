"""`python -m trainwreck.benchmarks`: a section that crashes loses its own figures, never the run's,
and the GPU figures' code runs on the CPU here (a GPU host measures them; docs/TESTING.md)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainwreck.benchmarks.__main__ import run_sections
from trainwreck.benchmarks.gpu import bench_gpu


def test_a_crashing_section_is_recorded_and_every_other_sections_figures_are_written_as_it_ends(tmp_path: Path) -> None:
    out, seen_on_disk, lines = tmp_path / "figures.json", [], []

    def boom() -> dict[str, Any]:
        seen_on_disk.append(json.loads(out.read_text()))  # the section before it is already on disk
        raise RuntimeError("the fsdp job at world 2 failed: exit codes [1, 1]")

    results = run_sections([("first", lambda: {"a": 1}), ("fsdp", boom), ("last", lambda: {"b": 2})],
                           {"quick": True}, lines.append, out)
    assert seen_on_disk == [{"quick": True, "failed": {}, "a": 1}]
    assert results["a"] == 1 and results["b"] == 2
    assert results["failed"] == {"fsdp": "RuntimeError: the fsdp job at world 2 failed: exit codes [1, 1]"}
    assert json.loads(out.read_text()) == results
    assert any(line.startswith("[benchmarks] fsdp FAILED after") for line in lines)
    assert '[benchmarks] last done in' in lines[-1] and lines[-1].endswith('{"b": 2}')


def test_the_text_output_prints_a_splits_parts_one_line_each(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.benchmarks import __main__ as benchmarks

    monkeypatch.setattr(benchmarks, "sections", lambda quick: [
        ("throughput", lambda: {"scenario_wall_s": 0.9, "scenario_split_s": {"compute": 0.37, "setup": 0.16}})])
    monkeypatch.setattr(benchmarks, "machine", lambda: {"cpus": 2})
    assert benchmarks.main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines if line.startswith("scenario_")] == [
        ["scenario_wall_s", "0.9"], ["scenario_split_s.compute", "0.37"], ["scenario_split_s.setup", "0.16"]]


def test_only_runs_the_sections_it_names_and_an_unknown_name_exits_2_listing_the_known(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.benchmarks import __main__ as benchmarks

    ran: list[str] = []
    monkeypatch.setattr(benchmarks, "sections", lambda quick: [
        (name, lambda name=name: ran.append(name) or {f"{name}_s": 1.0}) for name in ("launch", "fsdp", "gpu")])
    monkeypatch.setattr(benchmarks, "machine", lambda: {"cpus": 2})
    assert benchmarks.main(["--quick", "--json", "--only", "fsdp,gpu"]) == 0
    assert ran == ["fsdp", "gpu"]
    figures = json.loads(capsys.readouterr().out)
    assert "launch_s" not in figures and figures["fsdp_s"] == figures["gpu_s"] == 1.0
    assert benchmarks.main(["--only", "fsdp,gpus"]) == 2
    error = capsys.readouterr().err
    assert "--only 'fsdp,gpus': gpus is not a section" in error and "launch, fsdp, gpu" in error
    assert ran == ["fsdp", "gpu"]


def test_without_cuda_the_gpu_section_says_it_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_gpu() == {"gpu": "skipped: no CUDA device on this machine"}


def test_the_gpu_checkpoint_figures_are_measured_by_the_same_code_on_the_cpu() -> None:
    figures = bench_gpu(device="cpu", sizes=("1mb",))
    assert figures["gpu_device"] == "cpu (not a GPU figure)"
    detail = figures["gpu_checkpoint_1mb"]
    for key in ("verified_save_s", "plain_durable_save_s", "verified_load_s", "plain_load_s", "training_step_s"):
        assert detail[key] > 0, key
    # The ratios are of the unrounded seconds; the detail is rounded to 0.1 ms.
    assert figures["gpu_save_ratio_vs_fsynced_1mb"] == pytest.approx(
        detail["verified_save_s"] / detail["plain_durable_save_s"], rel=0.02, abs=0.002)
    assert figures["gpu_async_stall_of_step_1mb"] == pytest.approx(
        detail["async_stall_s"] / detail["training_step_s"], rel=0.02, abs=0.002)


@pytest.mark.parametrize("writes_its_own", [True, False])
def test_the_benchmarks_write_the_bytecode_caches_an_interpreter_without_them_would_skip(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes_its_own: bool) -> None:
    import importlib.util
    import sys

    from trainwreck.benchmarks.__main__ import cache_bytecode

    module = tmp_path / "pkg" / "sub" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text("X = 1\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", not writes_its_own)  # PYTHONDONTWRITEBYTECODE, -B
    assert cache_bytecode([str(tmp_path / "pkg")]) is (not writes_its_own)
    assert Path(importlib.util.cache_from_source(str(module))).exists() is (not writes_its_own)


def test_the_packages_whose_bytecode_is_cached_are_pyprojects() -> None:
    import tomllib

    from trainwreck.benchmarks.__main__ import PACKAGES

    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(PACKAGES) == sorted(p.split(".")[1] for p in declared if p.count(".") == 1)
