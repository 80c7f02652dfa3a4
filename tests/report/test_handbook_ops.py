"""The handbook's operations chapters (report/chapters_ops.py), made once per module from an
empty golden cache: each test reads what the runs measured and what the page says about it, and the
claim check must fail when a report is made to say something else."""
from __future__ import annotations

import json
import re
import shutil
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from tests.report.handbooks import make_handbook
from trainwreck.harness.cli import main as cli
from trainwreck.report.truth import check_handbook
from trainwreck.harness.suites.handbook import CHAPTERS, get_chapter
from tests.report.test_handbook import SOURCE, misquoted, page_claims

OPS_CHAPTERS = ("period", "metrics", "loader")


@pytest.fixture(scope="module")
def handbook(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_handbook(tmp_path_factory, "handbook-ops", OPS_CHAPTERS)


def plain(handbook: dict[str, Any], slug: str) -> str:
    section = re.search(rf'<section class="chapter" id="{slug}">(.*?)</section>', handbook["html"], re.S)
    assert section, f"chapter {slug} is not on the page"
    return unescape(re.sub(r"<[^>]+>", "", re.sub(r"<svg.*?</svg>", "", section.group(1), flags=re.S)))


def series(report: dict[str, Any], where: str) -> dict[str, Any]:
    return next(s for s in report["slowdowns"]["series"] if s["where"] == where)


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_operations_chapters_pass_and_every_sentence_is_true(handbook: dict[str, Any]) -> None:
    assert handbook["code"] == 0
    assert [c["answered"] for c in handbook["json"]["chapters"]] == [True] * len(OPS_CHAPTERS)
    assert check_handbook(handbook["out"]) == []


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_every_number_these_chapters_quote_is_the_value_at_the_field_its_tooltip_names(
        handbook: dict[str, Any]) -> None:
    claims = page_claims(handbook["html"])
    for slug in OPS_CHAPTERS:
        sourced = [SOURCE.fullmatch(t) for s, t, _ in claims if s == slug and SOURCE.fullmatch(t)]
        assert sourced and {m.group(1) for m in sourced} <= set(get_chapter(slug).runs), slug
    assert misquoted(handbook["html"], handbook["json"]["runs"]) == []


def test_the_default_handbook_leaves_out_the_full_chapters_and_full_runs_them() -> None:
    assert get_chapter("period").full
    assert {c.slug for c in CHAPTERS if c.full} >= {"period", "loader"} and not get_chapter("metrics").full


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_period_chapter_finds_the_planned_period_and_tells_one_slow_rank_from_slow_storage(
        handbook: dict[str, Any]) -> None:
    neighbour, storage = handbook["reports"]["noisy-neighbour"], handbook["reports"]["slow-storage"]
    fault = neighbour["plan"][0]
    burst = series(neighbour, "update")
    assert burst["period_steps"] == fault["every"]
    assert (burst["scope"], burst["ranks"]) == ("localized", [fault["rank"]])
    saves = series(storage, "checkpoint")
    assert saves["period_steps"] == storage["spec"]["ckpt_interval"]
    assert (saves["scope"], saves["ranks"]) == ("systemic", [0, 1])
    text = plain(handbook, "period")
    assert f"every {fault['every']} updates in {burst['regular_gaps']} of {burst['gaps']} gaps" in text
    assert f"only rank {fault['rank']} did more of its own work" in text and "so the slowdown is localized" in text
    assert f"every {saves['period_steps']} updates in" in text and "so the slowdown is systemic" in text


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_period_chapter_finds_a_background_writers_period_apart_from_the_save_interval(
        handbook: dict[str, Any]) -> None:
    writer = handbook["reports"]["disk-contention"]
    [fired] = writer["faults"]
    assert fired["kind"] == "disk_contention" and "(O_DIRECT)" in fired["detail"], fired
    found = series(writer, "checkpoint")
    assert found["period_steps"] == writer["plan"][0]["every"] != writer["spec"]["ckpt_interval"]
    assert (found["scope"], found["ranks"]) == ("systemic", [0, 1])
    text = plain(handbook, "period")
    assert f"every {found['period_steps']} updates in {found['regular_gaps']} of {found['gaps']} gaps" in text
    assert "the writer's period, not the saves'" in text and "look for what else writes to that disk" in text


def _check_tampered(handbook: dict[str, Any], tmp_path: Path, run_key: str, where: str, field: str,
                    value: Any) -> list[str]:
    """check_handbook on a copy whose run `run_key` reports `value` at `field` of its `where` series."""
    copy = tmp_path / "hb"
    shutil.copytree(handbook["out"], copy, ignore=shutil.ignore_patterns("runs"))
    record = json.loads((copy / "handbook.json").read_text())
    run = record["runs"][run_key]
    report = json.loads(Path(run["report"]).read_text())
    i = next(i for i, s in enumerate(report["slowdowns"]["series"]) if s["where"] == where)
    report["slowdowns"]["series"][i][field] = value
    fake = tmp_path / f"{run_key}.json"
    fake.write_text(json.dumps(report))
    run["report"] = str(fake)
    (copy / "handbook.json").write_text(json.dumps(record))
    return check_handbook(copy)


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_claim_check_fails_when_the_neighbour_run_is_made_to_say_every_rank_was_slow(
        handbook: dict[str, Any], tmp_path: Path) -> None:
    problems = _check_tampered(handbook, tmp_path, "noisy-neighbour", "update", "scope", "systemic")
    assert any(p.startswith("period: period.") and "scope" in p for p in problems), problems


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_claim_check_fails_when_the_writers_period_is_made_the_save_interval(
        handbook: dict[str, Any], tmp_path: Path) -> None:
    problems = _check_tampered(handbook, tmp_path, "disk-contention", "checkpoint", "period_steps", 1)
    assert any(p.startswith("period: period.") and "period_steps" in p for p in problems), problems


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_metrics_chapter_quotes_progress_per_world_size_and_the_one_restart(handbook: dict[str, Any]) -> None:
    report = handbook["reports"]["shrink-world"]
    metrics = report["metrics"]
    assert [a["world_size"] for a in metrics["attempts"]] == report["spec"]["world_sizes"][:2]
    assert metrics["restarts"] == 1 and metrics["checkpoint_age_max_s"] >= metrics["checkpoint_age_end_s"] > 0
    text = plain(handbook, "metrics")
    for a in metrics["attempts"]:
        assert f"attempt {a['attempt']} on {a['world_size']} ranks trained" in text
    assert "Its restart counter reads 1" in text


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_report_metrics_writes_openmetrics_a_prometheus_parser_reads_back_as_the_reports_numbers(
        handbook: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    run = tmp_path / "shrink"
    shutil.copytree(handbook["json"]["runs"]["shrink-world"]["run_dir"], run, symlinks=True)
    assert cli(["report", str(run), "--metrics"]) == 0
    prom = run / "report" / "metrics.prom"
    assert str(prom) in capsys.readouterr().out
    samples = {(s.name, s.labels.get("attempt")): s.value
               for family in text_string_to_metric_families(prom.read_text()) for s in family.samples}
    metrics = json.loads((run / "report" / "report.json").read_text())["metrics"]
    assert samples[("trainwreck_restarts_total", None)] == metrics["restarts"] == 1
    assert samples[("trainwreck_checkpoint_age_max_seconds", None)] == metrics["checkpoint_age_max_s"]
    for a in metrics["attempts"]:
        assert samples[("trainwreck_samples_per_second", str(a["attempt"]))] == a["samples_per_s"]


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_loader_chapter_says_the_sampler_position_loses_exactly_the_batches_in_flight(
        handbook: dict[str, Any]) -> None:
    measured = handbook["reports"]["loader-kill"]
    assert measured["in_flight_batches"] == measured["workers"] * measured["prefetch_factor"]
    positions = measured["positions"]
    assert (positions["consumed"]["lost"], positions["consumed"]["replayed"]) == (0, 0)
    assert positions["dispatched"]["lost"] == measured["in_flight_batches"] * measured["batch"]
    text = plain(handbook, "loader")
    assert f"{measured['in_flight_batches']} batches" in text and "the sampler's own position" in text
    if measured["torchdata"] is not None:
        assert (positions["stateful"]["lost"], positions["stateful"]["replayed"]) == (0, 0)
        assert "StatefulDataLoader" in text
