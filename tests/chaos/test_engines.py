"""Engines and the campaign ledger, without running a job: the registry, the no-Ray message,
and resuming a campaign whose driver died (with an engine that judges nothing itself).

The Ray engine on a simulated cluster is tests/chaos/test_ray_engine.py (slow, needs Ray)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from trainwreck.harness import cli
from trainwreck.harness.suites.campaign import (OUTCOME, Campaign, CampaignSpec, LedgerError, finished_outcomes, plan_dir,
                                         read_ledger, write_ledger)
from trainwreck.harness.suites.engines import (ENGINES, EngineOptions, EngineUnavailable, LocalEngine, Outcome, PlanJob,
                                        engine_class)


def test_the_engine_registry_is_what_the_cli_offers_and_the_local_engine_needs_no_package() -> None:
    from trainwreck.harness.commands import chaos

    parser = argparse.ArgumentParser()
    chaos.configure(parser)
    engine_option = next(a for a in parser._actions if a.dest == "engine")
    assert tuple(engine_option.choices) == tuple(ENGINES) == ("local", "ray")
    assert engine_option.default == "local"
    assert ENGINES["local"].requires is None and engine_class("local") is LocalEngine
    assert ENGINES["ray"].requires == "ray" and "trainwreck[ray]" in ENGINES["ray"].install
    assert "ray" not in sys.modules or engine_class("ray").name == "ray"  # the class is named as its row


def test_engine_ray_without_ray_installed_exits_two_saying_how_to_install_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` and find_spec see without the extra
    with pytest.raises(EngineUnavailable):
        engine_class("ray")
    out = tmp_path / "chaos"
    assert cli.main(["chaos", "--engine", "ray", "--budget", "1s", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--engine ray needs the 'ray' package" in err and "pip install 'trainwreck[ray]'" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists(), "nothing may run (or be created) before the engine is there"


def test_an_address_without_the_ray_engine_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["chaos", "--address", "10.0.0.1:6379", "--budget", "1s"]) == 2
    assert "an address is for --engine ray" in capsys.readouterr().err


class RecordingEngine:
    """Judges every plan VALID at once without running it, and remembers what it was given."""

    name: ClassVar[str] = "recording"

    def __init__(self) -> None:
        self.submitted: list[int] = []

    def describe(self) -> str:
        return "recording"

    def submit(self, job: PlanJob) -> list[Outcome]:
        self.submitted.append(job.index)
        job.run_dir.mkdir(parents=True)
        return [Outcome(job.index, job.case, job.run_dir, True, job.reproduce, 0.0, {"engine": "recording"})]

    def drain(self) -> list[Outcome]:
        return []

    def close(self) -> None:
        pass


def test_a_resumed_campaign_keeps_its_finished_plans_and_reruns_only_the_unfinished_ones(tmp_path: Path) -> None:
    out, spec = tmp_path / "campaign", CampaignSpec(seed=11)
    write_ledger(out, spec)
    first = Campaign(RecordingEngine(), out, spec).run(budget_s=60, plans=3)
    assert [o.index for o in first] == [1, 2, 3]
    # A driver killed while plan 3 ran: its directory is there, its outcome.json is not.
    (plan_dir(out, 3) / OUTCOME).unlink()
    (plan_dir(out, 3) / "half-written").write_text("partial")
    kept = (plan_dir(out, 1) / OUTCOME).stat().st_ino

    assert read_ledger(out) == spec
    finished = finished_outcomes(out)
    assert sorted(finished) == [1, 2]
    engine = RecordingEngine()
    resumed = Campaign(engine, out, spec).run(budget_s=60, plans=5, finished=finished)
    assert engine.submitted == [3, 4, 5], "finished plans are never run again"
    assert [o.index for o in resumed] == [1, 2, 3, 4, 5]
    assert [o.case for o in resumed[:3]] == [o.case for o in first], "the same seed draws the same plans"
    assert not (plan_dir(out, 3) / "half-written").exists(), "an unfinished directory is replaced, not judged"
    assert (plan_dir(out, 1) / OUTCOME).stat().st_ino == kept


def test_a_ledger_whose_seed_now_draws_other_plans_is_refused_rather_than_mixed(tmp_path: Path) -> None:
    out, spec = tmp_path / "campaign", CampaignSpec(seed=11)
    write_ledger(out, spec)
    Campaign(RecordingEngine(), out, spec).run(budget_s=60, plans=2)
    outcome = plan_dir(out, 2) / OUTCOME
    data = json.loads(outcome.read_text())
    data["case"]["world_sizes"] = [8]
    outcome.write_text(json.dumps(data))
    with pytest.raises(LedgerError, match="draws a different plan 2"):
        Campaign(RecordingEngine(), out, spec).run(budget_s=60, plans=2, finished=finished_outcomes(out))
    with pytest.raises(LedgerError, match="no readable campaign.json"):
        read_ledger(tmp_path / "elsewhere")


def test_resume_refuses_a_new_out_or_seed_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "campaign"
    write_ledger(out, CampaignSpec(seed=3))
    assert cli.main(["chaos", "--resume", str(out), "--seed", "4"]) == 2
    assert "keeps its own directory and seed" in capsys.readouterr().err


def test_a_local_engine_names_its_host_for_run_json(tmp_path: Path) -> None:
    engine: Any = LocalEngine(EngineOptions())
    assert engine.node["engine"] == "local" and engine.node["host"]
    with pytest.raises(Exception, match="--engine ray"):
        LocalEngine(EngineOptions(address="auto"))


@pytest.mark.slow
def test_a_driver_killed_mid_campaign_resumes_without_rerunning_its_finished_plans(
        tmp_path: Path, golden_cache: Path, warm_launcher: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import signal
    import subprocess
    import time

    from trainwreck.harness.judge.cache_dir import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(golden_cache))
    out = tmp_path / "campaign"
    driver = subprocess.Popen([sys.executable, "-m", "trainwreck.harness.cli", "chaos", "--plans", "3", "--seed", "7",
                               "--budget", "10m", "--out", str(out)], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (plan_dir(out, 1) / OUTCOME).exists():  # the first plan judged: kill the driver now
            assert driver.poll() is None and time.monotonic() < deadline, "the driver ended before plan 1"
            time.sleep(0.05)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    judged = {p.parent.name: p.stat().st_ino for p in out.glob(f"plan-*/{OUTCOME}")}
    assert judged and len(judged) < 3, judged

    assert cli.main(["chaos", "--resume", str(out), "--plans", "3", "--budget", "10m"]) == 0
    printed = capsys.readouterr().out
    assert f"resuming, {len(judged)} plan(s) already judged" in printed
    assert "chaos summary: 3 plan(s)" in printed
    assert {name: (out / name / OUTCOME).stat().st_ino for name in judged} == judged, "finished plans were rerun"
    rerun = [line for line in printed.splitlines() if line.startswith("[")]
    assert [int(line[1:5]) for line in rerun] == list(range(len(judged) + 1, 4))
    assert sorted(p.name for p in out.glob("plan-*")) == ["plan-0001", "plan-0002", "plan-0003"]


@pytest.mark.parametrize("ranks, per_rank, largest, reserved", [
    (2, 1.0, 8.0, 2.0), (4, 1.0, 8.0, 4.0), (4, 1.0, 1.0, 1.0), (4, 1.0, 0.0, 4.0),
    (2, 0.25, 8.0, 0.5), (3, 0.5, 8.0, 2.0)])
def test_a_plan_reserves_its_ranks_cpus_but_never_more_than_the_largest_node(
        ranks: int, per_rank: float, largest: float, reserved: float) -> None:
    from trainwreck.harness.suites.rayengine import reservation  # Ray itself is imported only by the engine

    assert reservation(ranks, per_rank, largest) == reserved


def test_a_returned_run_directory_unpacks_whole_and_an_archive_escaping_it_is_refused(tmp_path: Path) -> None:
    import io
    import tarfile

    from trainwreck.harness.suites.rayengine import pack, unpack

    run = tmp_path / "node" / "plan-0001"
    (run / "events").mkdir(parents=True)
    (run / "events" / "harness.jsonl").write_text('{"kind": "end"}\n')
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "big.pt").write_bytes(b"x" * 100)
    landed = unpack(pack(run, skip=("checkpoints",)), tmp_path / "driver" / "plan-0001")
    assert (landed / "events" / "harness.jsonl").read_text() == '{"kind": "end"}\n'
    assert not (landed / "checkpoints").exists()

    hostile = io.BytesIO()
    with tarfile.open(fileobj=hostile, mode="w:gz") as tar:
        info = tarfile.TarInfo("plan-0002/../../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(tarfile.OutsideDestinationError):
        unpack(hostile.getvalue(), tmp_path / "driver" / "plan-0002")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "driver" / "escaped.txt").exists()


def test_the_casebook_counts_cases_and_verdicts_per_node_from_run_json(tmp_path: Path) -> None:
    from trainwreck.report import render_casebook
    from trainwreck.rundir.layout import RunDir

    runs = []
    for i, (node, valid) in enumerate([("aaaaaaaa11", True), ("bbbbbbbb22", True), ("aaaaaaaa11", False)]):
        run = tmp_path / f"plan-{i + 1:04d}"
        (run / "report").mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"format": "trainwreck-run/1",
                                                  "node": {"engine": "ray", "id": node, "ip": "10.0.0.9"}}))
        RunDir(run).report_file("report.json").write_text(json.dumps({"name": run.name, "valid": valid}))
        runs.append(run)
    render_casebook(tmp_path / "casebook", runs, "two nodes")
    book = (tmp_path / "casebook" / "index.md").read_text()
    assert "Per node: aaaaaaaa (10.0.0.9): 2 run(s), 1 valid, 1 invalid; bbbbbbbb (10.0.0.9): 1 run(s), 1 valid." in book
    assert 'id="nodes"' in (tmp_path / "casebook" / "index.html").read_text()


def test_an_address_where_no_cluster_answers_is_refused_at_once_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    pytest.importorskip("ray")  # the refusal comes from the engine, which needs the package first
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: connections are refused
        assert cli.main(["chaos", "--engine", "ray", "--address", f"127.0.0.1:{port}", "--budget", "1s"]) == 2
    err = capsys.readouterr().err
    assert f"--address 127.0.0.1:{port}: no Ray cluster answers there" in err and "Traceback" not in err


def test_a_casebook_of_runs_on_this_one_host_has_no_per_node_line(tmp_path: Path) -> None:
    from trainwreck.report import render_casebook
    from trainwreck.rundir.layout import RunDir

    run = tmp_path / "plan-0001"
    (run / "report").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"format": "trainwreck-run/1", "node": LocalEngine(EngineOptions()).node}))
    RunDir(run).report_file("report.json").write_text(json.dumps({"name": run.name, "valid": True}))
    render_casebook(tmp_path / "casebook", [run], "local")
    assert "Per node" not in (tmp_path / "casebook" / "index.md").read_text()


def test_a_damaged_outcome_is_refused_on_resume_naming_the_plan_to_delete(tmp_path: Path) -> None:
    out, spec = tmp_path / "campaign", CampaignSpec(seed=11)
    write_ledger(out, spec)
    Campaign(RecordingEngine(), out, spec).run(budget_s=60, plans=1)
    (plan_dir(out, 1) / OUTCOME).write_text('{"index": 1, "case": [')
    with pytest.raises(LedgerError, match="delete plan-0001 to run that plan again"):
        finished_outcomes(out)
