"""The rendered files: well-formed SVG, self-contained HTML, aggregation of big runs, the casebook, the CLI."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from trainwreck.harness.cli import main as cli
from trainwreck.report import build_report, render_casebook, render_report
from trainwreck.report.svg import MAX_LANES, phases_svg, timeline_svg, wallclock_svg
from tests.report.rundirs import RunWriter, clean_run, duplicated_sample_run, hung_run, killed_run

SVG = "{http://www.w3.org/2000/svg}"


def _lanes(svg: str) -> list[ET.Element]:
    return [g for g in ET.fromstring(svg).iter(f"{SVG}g") if g.get("class") == "tw-lane"]


def test_every_picture_is_well_formed_svg(tmp_path: Path) -> None:
    for make in (clean_run, killed_run, hung_run, duplicated_sample_run):
        report = build_report(make(tmp_path / make.__name__))
        for draw in (timeline_svg, wallclock_svg, phases_svg):
            ET.fromstring(draw(report))  # raises on malformed XML


def test_the_timeline_has_a_lane_per_rank_per_attempt_and_marks_faults_saves_and_restores(tmp_path: Path) -> None:
    svg = timeline_svg(build_report(killed_run(tmp_path / "run")))
    assert [(g.get("data-attempt"), g.get("data-ranks")) for g in _lanes(svg)] == \
        [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    classes = [el.get("class") for el in ET.fromstring(svg).iter()]
    assert classes.count("tw-save") == 4  # saves at 2 and 4, then 6 and 8
    assert classes.count("tw-fault") == 1 and classes.count("tw-restore") == 1
    assert classes.count("tw-redo") == 2  # update 5 of attempt 0, on both ranks


def test_a_hang_is_drawn_on_the_suspect_lane(tmp_path: Path) -> None:
    root = ET.fromstring(timeline_svg(build_report(hung_run(tmp_path / "run"))))
    hangs = [el for el in root.iter() if el.get("class") == "tw-hang"]
    assert len(hangs) == 1 and "suspect rank 1" in "".join(hangs[0].itertext())


def test_more_than_eight_ranks_are_aggregated_into_lanes_of_ranks_that_did_the_same(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", global_batch=32, dataset_size=256)
    w.attempt(0, 16)
    w.train(0, 16, 1, 8)
    w.exits(0, {r: (-9 if r == 5 else 0) for r in range(16)})
    w.end()
    lanes = _lanes(timeline_svg(build_report(w.write())))
    assert len(lanes) <= MAX_LANES
    assert sorted(g.get("data-ranks") for g in lanes) == ["0-4,6-15", "5"]


def test_a_few_hundred_steps_stay_a_small_picture(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", total_steps=400, dataset_size=1600)
    w.attempt(0, 8)
    w.train(0, 8, 1, 400)
    w.exits(0, {r: 0 for r in range(8)})
    w.end()
    svg = timeline_svg(build_report(w.write()))
    assert len(_lanes(svg)) == 8
    assert len(svg) < 150_000  # bars per contiguous run, not a rect per step


def test_the_html_is_self_contained_and_readable_without_script(tmp_path: Path) -> None:
    html = render_report(hung_run(tmp_path / "run")).read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from a network
    assert "<link" not in html and "@import" not in html
    external = set(re.findall(r"https?://[^\s\"'<>]+", html)) - {"http://www.w3.org/2000/svg"}
    assert not external
    for section in ("verdicts", "timeline", "recovery", "phases", "angle", "reproduce", "files"):
        assert f'id="{section}"' in html


def test_the_markdown_carries_verdicts_recovery_angle_and_reproduce(tmp_path: Path) -> None:
    run = killed_run(tmp_path / "run")
    (run / "verdicts.json").write_text(json.dumps({
        "valid": True, "verdicts": {"coverage": {"valid": True, "summary": "fine"}},
        "reproduce": "trainwreck run kill-resume --plan '[]'"}))
    render_report(run)
    md = (run / "report" / "report.md").read_text()
    for heading in ("## Verdicts", "## Timeline", "## Recovery", "## Interview angle", "## Reproduce"):
        assert heading in md
    assert "trainwreck run kill-resume --plan '[]'" in md


def test_the_casebook_links_every_report_and_counts_the_verdicts(tmp_path: Path) -> None:
    runs = [clean_run(tmp_path / "a"), duplicated_sample_run(tmp_path / "b"), hung_run(tmp_path / "c")]
    index = render_casebook(tmp_path / "book", runs, "unit casebook")
    html = index.read_text()
    assert "3 run(s): 2 valid, 1 invalid." in html
    for run in runs:
        assert f'href="../{run.name}/report/report.html"' in html
        assert (run / "report" / "report.html").exists()  # rendered on demand
    assert html.count('class="case"') == 3
    assert "How do you find the rank that hangs?" in html
    md = (tmp_path / "book" / "index.md").read_text()
    assert "# unit casebook: INVALID" in md and "(../b/report/report.md)" in md


def test_trainwreck_report_exits_by_the_runs_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["report", str(clean_run(tmp_path / "ok"))]) == 0
    assert cli(["report", str(duplicated_sample_run(tmp_path / "bad"))]) == 1
    assert "INVALID" in capsys.readouterr().out


def test_trainwreck_report_on_a_directory_that_is_not_a_run_exits_2_with_a_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["report", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_a_casebook_row_for_a_directory_that_is_not_a_run_is_unknown_never_valid(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    index = render_casebook(tmp_path / "book", [clean_run(tmp_path / "ok"), tmp_path / "empty"], "mixed")
    html = index.read_text()
    assert "2 run(s): 1 valid, 1 unknown." in html and 'data-verdict="UNKNOWN"' in html
    assert "not a run directory" in html
