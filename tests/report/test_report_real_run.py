"""One real run end to end: the harness kills a rank, run_judged judges it and renders its report."""
from __future__ import annotations

import json
from pathlib import Path

from trainwreck.harness.judge.runner import run_judged, spec_for
from trainwreck.harness.supervise.scenarios import get_scenario


def test_a_real_kill_resume_run_gets_a_report_that_tells_its_story(tmp_path: Path) -> None:
    run_dir = tmp_path / "kill-resume"
    judged = run_judged(spec_for(get_scenario("kill-resume"), run_dir), "kill-resume",
                        golden_cache=tmp_path / "golden")
    html = run_dir / "report" / "report.html"
    assert html.exists(), "run_judged must render the report of every judged run"
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["valid"] is judged.judgement.valid is True
    assert report["judged_by"] == "verdicts.json" and report["golden"] == str(judged.golden_dir)
    assert report["reproduce"] == judged.reproduce and report["scenario"]["name"] == "kill-resume"
    assert report["root_cause"] is None, "a planned kill (and its peer's fallout) is not a crash of its own"
    assert judged.root_cause is None and "Root cause" not in html.read_text()
    (fault,) = report["faults"]
    assert fault["id"] == "kill-r1" and fault["rank"] == 1
    (row,) = report["recovery"]
    assert row["restored"]["checkpoint"] == "step-00000004"
    assert row["checkpoint_age_steps"] >= 1 and row["steps_redone"] >= 1 and row["samples_redone"] > 0
    assert 0 < row["resumed_after_s"] < 30
    assert [len(a["lanes"]) for a in report["attempts"]] == [2, 2]
    assert {p["rank"] for p in report["phases"]["ranks"]} == {0, 1}
    assert report["angles"][0]["question"] == "How do you know a resumed run is the same run?"
    text = html.read_text()
    assert 'class="tw-timeline"' in text and judged.reproduce.split(" --plan")[0] in text
