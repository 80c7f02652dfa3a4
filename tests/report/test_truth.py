"""Words as true as the verdicts: every sentence a report prints is re-derived from verdicts.json and events.

The default part judges two planted defects (sampler_not_saved and resume_restarts_epoch, with
their controls) and two demo scenarios (hang-detect, corrupt-newest). The whole defects
table, the whole demo, the frameworks table and the handbook are swept by the `slow` tests.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.cli import main as cli
from trainwreck.report import build_report, render_report
from trainwreck.report.truth import check_report, flip

MAIN = Path(__file__).parent / "data" / "main-sampler_not_saved"
"""report.md and verdicts.json of the landed main's sampler_not_saved run, before claims existed."""
INVARIANTS = ("coverage", "continuity", "atomicity", "hang", "replicas", "progress")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("truth")
    assert cli(["defects", "--only", "sampler_not_saved,resume_restarts_epoch", "--out", str(root / "defects")]) == 0
    assert cli(["demo", "--scenarios", "hang-detect,corrupt-newest", "--out", str(root / "demo")]) == 0
    found = {p.name: p for p in (root / "defects").iterdir()}
    found.update({p.name.split("-", 1)[1]: p for p in (root / "demo" / "runs").iterdir()})
    return found


def all_reports(root: Path) -> list[Path]:
    return sorted(p.parent.parent for p in root.rglob("report/report.json") if (p.parent.parent / "verdicts.json").is_file())


def test_every_sentence_of_the_defect_and_demo_reports_is_true_to_its_verdicts_and_events(
        runs: dict[str, Path]) -> None:
    assert len(runs) == 5  # the two defects share the resume-mid-epoch control
    for name, run_dir in runs.items():
        assert check_report(run_dir) == [], name


def test_the_landed_mains_sampler_not_saved_report_fails_the_truth_check(runs: dict[str, Path]) -> None:
    old = (MAIN / "report.md").read_text(encoding="utf-8")
    problems = check_report(runs["defect-sampler_not_saved"], markdown=old)
    text = "\n".join(problems)
    # "each of the 16 lineage steps matches the golden run" under an INVALID continuity verdict
    assert "resume.golden: the text says 'Each of the 16 lineage steps matches" in text
    assert "verdicts.continuity.valid == True" in text
    # continuity blamed on "the resumed model is not the one that was saved" while both restore digests match
    assert "cost.continuity.state" in text and "facts.continuity.first_kind" in text
    assert "no root-cause sentence before the verdicts" in text


def test_an_invalid_report_names_its_root_cause_on_the_first_screen(runs: dict[str, Path]) -> None:
    report = json.loads((runs["defect-sampler_not_saved"] / "report" / "report.json").read_text())
    cause = report["cause"]
    assert "attempt 1 replayed samples the run had already trained on" in cause
    assert "sampler went back from epoch 1 to epoch 0" in cause
    assert "The restored model is not to blame: all 2 restore digest(s) equal what their saves recorded" in cause
    head = (runs["defect-sampler_not_saved"] / "report" / "report.md").read_text().split("## Verdicts")[0]
    assert cause in head
    html = (runs["defect-sampler_not_saved"] / "report" / "report.html").read_text()
    assert html.index('id="cause"') < html.index('id="verdicts"')


OLD_DUPLICATES = ("Root cause: the lineage used {n} (epoch, id) pair(s) twice without any restart going back an "
                  "epoch: the data pipeline itself deals some ids more than once per epoch.")
"""What the report said before the repeats' attempts were read: resume_restarts_epoch's repeats span the restart."""


def with_cause(run_dir: Path, sentence: str) -> str:
    """The run's report.md with its root-cause sentence replaced by `sentence`."""
    report = json.loads((run_dir / "report" / "report.json").read_text())
    first = next(c["text"] for c in report["claims"] if c["rendered"] and c["key"].startswith("cause."))
    text = (run_dir / "report" / "report.md").read_text(encoding="utf-8")
    assert first in text
    return text.replace(first, sentence)


def test_repeats_spanning_the_restart_are_not_blamed_on_the_pipeline_and_the_check_catches_the_old_words(
        runs: dict[str, Path]) -> None:
    run = runs["defect-resume_restarts_epoch"]
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["facts"]["coverage"]["twice_span"]["first"] == "attempt 0 rank 0 step 7"
    assert "attempt 1 was dealt samples that an earlier attempt had already trained on in the same epoch" \
        in report["cause"] and "data pipeline itself" not in report["cause"]
    n = report["verdicts"]["coverage"]["counts"]["duplicated_ids"]
    problems = "\n".join(check_report(run, markdown=with_cause(run, OLD_DUPLICATES.format(n=n))))
    assert "cause.coverage.duplicates: the text says 'Root cause: the lineage used" in problems
    assert "facts.coverage.twice_span == None" in problems
    assert "the first screen's root cause 'Root cause: the lineage used" in problems


def test_the_first_screen_must_hold_exactly_one_root_cause_the_facts_derive(runs: dict[str, Path]) -> None:
    run = runs["defect-sampler_not_saved"]
    report = json.loads((run / "report" / "report.json").read_text())
    first = next(c["text"] for c in report["claims"] if c["rendered"] and c["key"].startswith("cause."))
    twice = with_cause(run, f"{first} Root cause: coverage is violated.")
    assert any("holds 2 root-cause sentence(s)" in p for p in check_report(run, markdown=twice))
    other = with_cause(run, "Root cause: the disk was full.")
    assert any("is not the one the run's facts give" in p for p in check_report(run, markdown=other))


def test_counts_say_what_they_count_and_defaults_say_they_are_configured(runs: dict[str, Path]) -> None:
    sns = json.loads((runs["defect-sampler_not_saved"] / "report" / "report.json").read_text())
    assert sns["verdicts"]["coverage"]["summary"].startswith(
        "121 (epoch, id) pair(s) used twice within an epoch (epoch 0: 89, epoch 1: 32)")
    assert "An id counts once per epoch it repeats in (epoch 0: 89 ids, epoch 1: 32 ids), so the count of pairs " \
           "can exceed the 89 ids of the dataset." in (runs["defect-sampler_not_saved"] / "report" / "report.md").read_text()
    hang = json.loads((runs["hang-detect"] / "report" / "report.json").read_text())
    answer = next(a["answer"] for a in hang["angles"] if a["topic"] == "hang")
    assert "against a configured 3 s timeout" in answer and "a configured value, not measured here" in answer
    assert "sooner than gloo" not in answer


def test_the_hang_report_flags_no_waiting_rank_as_slowest_and_explains_the_injectors_frame(
        runs: dict[str, Path]) -> None:
    report = json.loads((runs["hang-detect"] / "report" / "report.json").read_text())
    assert report["hangs"][0]["ranks"] == [1] and report["phases"]["slowest_rank"] is None
    assert "slowest" not in (runs["hang-detect"] / "report" / "report.md").read_text()
    answer = next(a["answer"] for a in report["angles"] if a["topic"] == "hang")
    # The rank waits at its step until the harness has recorded the fault, so however late a loaded
    # harness polls, the SIGSTOP finds it in that wait (tests/faults/test_injectors.py holds the gate).
    (stack,) = [s for s in report["hangs"][0]["stacks"] if s["rank"] == 1]
    assert stack["in_injector"] and "_await_harness" in stack["frame"], stack
    assert "Rank 1's stack sits inside the fault injector (faults/inrank.py" in answer
    assert "the SIGSTOP found it there" in answer


def test_the_injector_sentences_follow_the_dumped_frame_not_the_fault(runs: dict[str, Path], tmp_path: Path) -> None:
    # CI once dumped the SIGSTOPped rank an update past the gate, waiting in the all-reduce like its
    # peer (recorded here from rank 0 of a hang-detect run): neither sentence may then be said.
    copy = tmp_path / "hang-detect"
    shutil.copytree(runs["hang-detect"], copy, symlinks=True)
    (dump,) = (copy / "stacks").glob("a000-r001-*.txt")
    dump.write_text((Path(__file__).parent / "data" / "stacks" / "sigstop-allreduce-rank0.txt").read_text())
    render_report(copy)
    report = json.loads((copy / "report" / "report.json").read_text())
    (stack,) = [s for s in report["hangs"][0]["stacks"] if s["rank"] == 1]
    assert stack["frame"] == "trainer/gradsync.py:37 per_parameter_allreduce" and not stack["in_injector"]
    answer = next(a["answer"] for a in report["angles"] if a["topic"] == "hang")
    assert "rank 1 at trainer/gradsync.py:37 per_parameter_allreduce" in answer
    assert "fault injector" not in answer and "the SIGSTOP found it there" not in answer
    assert check_report(copy) == []


def test_a_rejected_checkpoint_is_reported_with_the_reason_its_reject_event_gives(runs: dict[str, Path]) -> None:
    report = json.loads((runs["corrupt-newest"] / "report" / "report.json").read_text())
    assert report["facts"]["rejects"][0]["reason"] == "step-00000008/model.pt fails its blake3 check"
    answer = next(a["answer"] for a in report["angles"] if a["topic"] == "silent")
    said = "Attempt 1 rejected step-00000008 on load: step-00000008/model.pt fails its blake3 check."
    assert said in answer and said in report["recovery_text"]


def test_the_guide_counts_the_planted_defects_it_lists() -> None:
    from trainwreck.harness.suites.defects import DEFECTS

    readme = (Path(__file__).parents[2] / "docs" / "GUIDE.md").read_text(encoding="utf-8")
    found = re.search(r"`trainwreck defects` runs (\d+) deliberately broken variants", readme)
    assert found and int(found.group(1)) == len(DEFECTS)
    table = readme[found.end():].split("\n\n| defect |", 1)[1].split("\n\n", 1)[0]
    listed = {line.split("|")[1].strip().split()[-1].strip("`") if "watchdog" in line else line.split("|")[1].split()[0]
              for line in table.splitlines()[2:]}
    assert listed == {d.name for d in DEFECTS}


def flipped_copy(run_dir: Path, name: str, dest: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of the run with one verdict turned over, its report rebuilt: (before, after) report dicts."""
    copy = dest / f"{run_dir.name}-{name}"
    shutil.copytree(run_dir, copy, symlinks=True)
    before = build_report(copy)
    verdicts = json.loads((copy / "verdicts.json").read_text())
    (copy / "verdicts.json").write_text(json.dumps(flip(verdicts, name)))
    render_report(copy)
    return before, json.loads((copy / "report" / "report.json").read_text())


def presumed(report: dict[str, Any], name: str, valid: Any) -> list[str]:
    """Rendered claims that presume invariant `name` was judged `valid`."""
    return [c["text"] for c in report["claims"] if c["rendered"] for p in c["presumes"]
            if p["path"] == f"verdicts.{name}.valid" and p["op"] == "==" and p["value"] == valid]


@pytest.mark.parametrize("run", ["defect-sampler_not_saved", "hang-detect"])
def test_flipping_each_verdict_turns_the_prose_over_with_it(runs: dict[str, Path], run: str, tmp_path: Path) -> None:
    for name in INVARIANTS:
        before, after = flipped_copy(runs[run], name, tmp_path)
        was = before["verdicts"][name]["valid"]
        now = after["verdicts"][name]["valid"]
        assert now is (was is not True)
        assert presumed(before, name, was), f"{run}: no sentence stated {name}={was} before the flip"
        assert not presumed(after, name, was), f"{run}: a sentence of the {name}={was} form survived the flip"
        assert presumed(after, name, now), f"{run}: no sentence states {name}={now} after the flip"
        assert check_report(tmp_path / f"{runs[run].name}-{name}") == []


# ----- the whole sweep: everything the project renders ------------------------------------------


@pytest.mark.slow
def test_every_report_of_the_defects_table_and_the_demo_is_true(tmp_path: Path) -> None:
    assert cli(["defects", "--out", str(tmp_path / "defects")]) == 0
    assert cli(["demo", "--out", str(tmp_path / "demo")]) == 0
    from trainwreck.harness.commands.demo import demo_names
    from trainwreck.harness.suites.defects import DEFECTS

    reports = all_reports(tmp_path)
    assert len([p for p in reports if p.name.startswith("defect-")]) == len(DEFECTS)
    assert len([p for p in reports if p.parent.name == "runs"]) == len(demo_names())
    bad = {p.name: check_report(p) for p in reports}
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.slow
def test_every_report_of_the_frameworks_table_is_true(tmp_path: Path) -> None:
    cli(["frameworks", "--out", str(tmp_path / "fw")])  # its verdicts are its own tests' business
    reports = all_reports(tmp_path)
    assert reports
    bad = {p.name: check_report(p) for p in reports}
    assert {k: v for k, v in bad.items() if v} == {}
