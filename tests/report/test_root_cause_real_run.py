"""Real runs in which ranks die of an exception no planned fault caused: every output names it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.commands.run import print_result
from trainwreck.harness.judge.runner import JudgedRun, run_judged
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.trainer.config import TrainConfig
from tests.harness.conftest import assert_no_leftover_processes

NUMPY = "RuntimeError: Numpy is not available"
HOOKS = "tests.report.crash_hooks:build_hooks"


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("golden")  # one golden run for the module's runs


def crash_run(run_dir: Path, golden: Path, plan: list[dict[str, Any]]) -> JudgedRun:
    spec = JobSpec(config=TrainConfig.tiny(total_steps=8), world_sizes=(2,), plan=plan, max_restarts=0,
                   hooks_factory=HOOKS, run_dir=run_dir)
    try:
        return run_judged(spec, golden_cache=golden)
    finally:
        assert_no_leftover_processes()


def test_an_unplanned_exception_on_rank_1_is_named_in_the_cli_and_every_report(
        tmp_path: Path, golden: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    judged = crash_run(run, golden, [{"id": "c1", "kind": "test_crash", "ranks": [1], "step": 3, "message":
                                      "Numpy is not available"}])
    log = run / "logs" / "a000-r001.log"
    assert NUMPY in log.read_text(), "the crash must actually have happened on rank 1"
    assert judged.root_cause is not None
    assert (judged.root_cause.first.rank, judged.root_cause.first.line) == (1, NUMPY)
    print_result(judged, as_json=False)
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert first.startswith("root cause: rank 1 crashed") and NUMPY in first and "logs/a000-r001.log" in first
    print_result(judged, as_json=True)
    cause = json.loads(capsys.readouterr().out)["root_cause"]
    assert (cause["rank"], cause["line"], cause["log"]) == (1, NUMPY, "logs/a000-r001.log")
    report = json.loads((run / "report" / "report.json").read_text())
    assert (report["root_cause"]["rank"], report["root_cause"]["line"], report["root_cause"]["log"]) == \
        (1, NUMPY, "logs/a000-r001.log")
    for name in ("report.md", "report.html"):
        page = (run / "report" / name).read_text()
        assert NUMPY in page and "logs/a000-r001.log" in page and "rank 1 crashed" in page, name
    from trainwreck.report.truth import check_report

    assert check_report(run) == [], "the crash's one root-cause sentence is the claim its facts derive"


def test_every_rank_crashing_before_the_planned_kill_fires_is_said_in_words(tmp_path: Path, golden: Path) -> None:
    run = tmp_path / "run"
    plan = [{"id": "k1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 6},
            {"id": "c1", "kind": "test_crash", "ranks": [0, 1], "step": 2, "message": "Numpy is not available"}]
    judged = crash_run(run, golden, plan)
    assert all(NUMPY in (run / "logs" / f"a000-r{r:03d}.log").read_text() for r in (0, 1)), "both ranks crashed"
    assert judged.judgement.unfired_faults, "the planned kill must not have fired"
    assert judged.root_cause is not None and judged.root_cause.before_faults
    words = "every rank crashed before any planned fault fired: " + NUMPY
    for name in ("report.md", "report.html", "report.json"):
        assert words in (run / "report" / name).read_text(), name


def test_the_demo_line_of_a_crashed_run_names_its_root_cause(tmp_path: Path, golden: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwreck.harness.judge import runner
    from trainwreck.harness.commands.demo import run_one

    plan = [{"id": "c1", "kind": "test_crash", "ranks": [1], "step": 3, "message": "Numpy is not available"}]
    # The demo runs built-in scenarios only; this swaps its run for one with the crashing hooks.
    monkeypatch.setattr(runner, "run_judged", lambda spec, name: crash_run(spec.run_dir, golden, plan))
    word, detail = run_one("kill-resume", tmp_path / "run")
    assert word == "INVALID"
    assert "root cause: rank 1 crashed" in detail and NUMPY in detail and "logs/a000-r001.log" in detail


@pytest.mark.slow  # every torchrun rank is a fresh interpreter importing torch
def test_under_torchrun_the_crashed_rank_and_its_line_are_read_from_torchrun_log(tmp_path: Path) -> None:
    from trainwreck.report.crash_cause import root_cause
    from trainwreck.harness.supervise.supervisor import run_job

    run = tmp_path / "run"
    plan = [{"id": "c1", "kind": "test_crash", "ranks": [1], "step": 3, "message": "Numpy is not available"}]
    try:
        run_job(JobSpec(config=TrainConfig.tiny(total_steps=8), world_sizes=(2,), plan=plan, max_restarts=0,
                        launcher="torchrun", hooks_factory=HOOKS, run_dir=run))
    finally:
        assert_no_leftover_processes()
    assert f"[rank1]: {NUMPY}" in (run / "logs" / "torchrun.log").read_text(), "rank 1 must have crashed"
    cause = root_cause(run)
    assert cause is not None and (cause.first.rank, cause.first.line, cause.first.log) == \
        (1, NUMPY, "logs/torchrun.log")


def test_a_rank_sigkilled_by_no_plan_is_named_with_its_signal_and_the_memory_killer(tmp_path: Path) -> None:
    """What the kernel's out-of-memory killer does: SIGKILL one rank of a running job, no fault
    planned. The test sends it by pid (read from the rank's progress record), from outside."""
    import os
    import signal
    import time
    from concurrent.futures import ThreadPoolExecutor

    from trainwreck.report.crash_cause import root_cause
    from trainwreck.harness.supervise.supervisor import run_job
    from trainwreck.trainer.progress import read_progress
    from trainwreck.rundir.layout import RunDir

    run = tmp_path / "run"
    spec = JobSpec(config=TrainConfig.tiny(total_steps=10**6, ckpt_interval=10**6), world_sizes=(2,),
                   max_restarts=0, hang_timeout_s=60, run_dir=run)
    with ThreadPoolExecutor(1) as pool:  # the job in a thread; this one plays the kernel
        job = pool.submit(run_job, spec)
        deadline = time.monotonic() + 180
        board = None
        while board is None or board.step < 2:
            assert time.monotonic() < deadline and not job.done(), "rank 1 never reached update 2"
            time.sleep(0.05)  # polling a file another process writes; nothing to wait on
            board = read_progress(RunDir(run).rank_progress(0, 1))
        os.kill(board.pid, signal.SIGKILL)
        record = job.result(timeout=120)
    assert_no_leftover_processes()
    assert record.outcome == "budget_exhausted"
    cause = root_cause(run)
    assert cause is not None and (cause.first.rank, cause.first.line) == (1, "killed by SIGKILL")
    sentence = cause.sentence()
    assert sentence.startswith("rank 1 was killed by SIGKILL, a signal no planned fault sent"), sentence
    assert "out-of-memory killer" in sentence
