"""trainwreck handbook: every chapter a question, every quoted number the number in its run's report.json.

One real handbook (all chapters, 23 runs, from an empty golden cache: 89-196 s of wall clock
on the 2 shared cores, at load averages 7-26, 60-82 CPU-seconds; docs/REPORTS.md gives
each measurement with its date and load) is made once per module; the tests read what it
wrote. The claim checker is also run on a tampered report, so a check that could not fail
would show.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import replace
from html import escape, unescape
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.report.handbooks import make_handbook
from trainwreck.invariants.continuity import DEFAULT_LOSS_TOLERANCE
from trainwreck.harness.cli import main as cli
from trainwreck.harness.suites.defects import Row, get_defect
from trainwreck.harness.suites.handbook import MTBF_ASSUMED_S, CaseResult, default_chapters, fmt, get_case, handbook_word
from trainwreck.report.angles import MTBF_ASSUMED_S as REPORT_MTBF_S
from trainwreck.report.plots import coverage_svg, loss_svg
from trainwreck.report.chapters import FLIGHT_RECORDER_ENTRIES, NCCL_ASYNC_ERROR_HANDLING, NCCL_TIMEOUT_MIN, on_gpus
from trainwreck.report.handbook import Evidence
from trainwreck.report.truth import check_handbook
from trainwreck.rundir.layout import MEASUREMENT_FORMAT

MIN_CAUGHT = 3
CHAPTERS = tuple(default_chapters())
"""What `trainwreck handbook` runs without --full (the --full chapters' tests have their own modules)."""
DEFAULT_CHAPTERS = CHAPTERS

# One worker builds the default handbook (about two minutes of 23 runs) for every test here:
# spread over both, each worker built its own copy of the module fixture (tests/scheduling.py).


@pytest.fixture(scope="module")
def handbook(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_handbook(tmp_path_factory, "handbook", None)  # `trainwreck handbook`, no --chapters


def resolve(report: dict[str, Any], path: list[Any]) -> Any:
    value: Any = report
    for part in path:
        value = value[part]
    return value


def mismatched_claims(record: dict[str, Any]) -> list[str]:
    """Claims whose value is not the value at their path in their run's report.json."""
    bad = []
    for chapter in record["chapters"]:
        for claim in chapter["claims"]:
            report = json.loads(Path(record["runs"][claim["run"]]["report"]).read_text())
            try:
                actual = resolve(report, claim["path"])
            except (KeyError, IndexError):
                actual = "<missing>"
            if actual != claim["value"]:
                bad.append(f"{chapter['slug']}: {claim['run']} {claim['path']}: quoted {claim['value']!r}, "
                           f"report.json has {actual!r}")
    return bad


def chapter_text(html: str, slug: str) -> str:
    section = re.search(rf'<section class="chapter" id="{re.escape(slug)}">(.*?)</section>', html, re.S)
    assert section, f"chapter {slug} is not on the page"
    return unescape(re.sub(r"<svg.*?</svg>", "", section.group(1), flags=re.S))


def test_the_handbook_passes_and_answers_at_least_ten_questions(handbook: dict[str, Any]) -> None:
    assert handbook["code"] == 0
    assert handbook["json"]["valid"] == "VALID"
    answered = [c for c in handbook["json"]["chapters"] if c["answered"]]
    assert len(answered) >= 10 and len(answered) == len(DEFAULT_CHAPTERS)


def test_the_handbook_writes_the_same_sentences_as_markdown(handbook: dict[str, Any]) -> None:
    md = (handbook["out"] / "index.md").read_text(encoding="utf-8")
    assert md.startswith(f"# trainwreck handbook: {handbook['json']['valid']}\n")
    for n, chapter in enumerate(handbook["json"]["chapters"], 1):
        assert f"## {n}. {chapter['question']}" in md
        for sentence in (s for s in chapter["sentences"] if s["rendered"]):
            text = unescape(re.sub(r"<[^>]+>", "", sentence["text"]))
            assert text in md, (chapter["slug"], text)
    assert all(f"| {key} |" in md for key in handbook["json"]["runs"])


def test_every_chapter_title_is_a_question(handbook: dict[str, Any]) -> None:
    for chapter in handbook["json"]["chapters"]:
        assert chapter["question"].endswith("?"), chapter["question"]
        assert f"<h2>{chapter['question']}</h2>" in handbook["html"].replace("&#x27;", "'")


def test_every_quoted_number_is_the_number_in_its_runs_report_json(handbook: dict[str, Any]) -> None:
    record = handbook["json"]
    assert all(c["claims"] for c in record["chapters"]), "a chapter quotes nothing from its runs"
    assert mismatched_claims(record) == []
    for chapter in record["chapters"]:
        text = chapter_text(handbook["html"], chapter["slug"])
        for claim in chapter["claims"]:
            if not isinstance(claim["value"], (dict,)):
                assert fmt(claim["value"]) in text, f"{chapter['slug']}: {claim} is not in the chapter's text"


def test_the_claim_check_fails_on_a_report_that_says_something_else(handbook: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    record = json.loads(json.dumps(handbook["json"]))
    claim = next(c for ch in record["chapters"] for c in ch["claims"] if isinstance(c["value"], (int, float))
                 and not isinstance(c["value"], bool))
    tampered = tmp_path / "report.json"
    report = json.loads(Path(record["runs"][claim["run"]]["report"]).read_text())
    holder = resolve(report, claim["path"][:-1])
    holder[claim["path"][-1]] = claim["value"] + 1
    tampered.write_text(json.dumps(report))
    record["runs"][claim["run"]]["report"] = str(tampered)
    assert any(claim["run"] in line for line in mismatched_claims(record))


def test_derived_numbers_are_computed_from_quoted_ones(handbook: dict[str, Any]) -> None:
    chapters = {c["slug"]: c for c in handbook["json"]["chapters"]}
    interval = next(d for d in chapters["interval"]["derived"] if d["label"] == "young_daly_interval_s")
    quoted = {tuple(c["path"]): c["value"] for c in chapters["interval"]["claims"] if c["run"] == "resume"}
    cost = quoted[("phases", "save_seconds", "interval_mean")]
    assert interval["inputs"] == {"save_cost_s": cost, "mtbf_s": MTBF_ASSUMED_S}
    assert math.isclose(interval["value"], math.sqrt(2 * cost * MTBF_ASSUMED_S))
    assert fmt(interval["value"]) in chapter_text(handbook["html"], "interval")


def test_the_interval_chapter_names_young_and_daly_and_shows_where_they_part(handbook: dict[str, Any]) -> None:
    derived = _derived(handbook, "interval")
    text = plain(handbook, "interval")
    cost = next(d for d in handbook["json"]["chapters"] if d["slug"] == "interval")
    cost = next(d["inputs"]["save_cost_s"] for d in cost["derived"] if d["label"] == "daly_interval_s")
    x = cost / (2 * MTBF_ASSUMED_S)  # Daly (2006), written out here independently of angles.daly_interval
    daly = math.sqrt(2 * cost * MTBF_ASSUMED_S) * (1 + math.sqrt(x) / 3 + x / 9) - cost
    assert math.isclose(derived["daly_interval_s"], daly)
    assert "Young's first-order optimum" in text and "Daly's refinement keeps the higher-order terms" in text
    close = abs(derived["young_daly_interval_s"] - daly) <= cost
    assert ("the two agree to within the save cost" in text) == close
    big = 0.1 * MTBF_ASSUMED_S
    xb = big / (2 * MTBF_ASSUMED_S)
    daly_big = math.sqrt(2 * big * MTBF_ASSUMED_S) * (1 + math.sqrt(xb) / 3 + xb / 9) - big
    assert math.isclose(derived["young_over_daly_example"], math.sqrt(2 * big * MTBF_ASSUMED_S) / daly_big)
    assert derived["young_over_daly_example"] > 1.1  # they do part there: the sentence shows a real gap


def test_at_least_three_broken_trainers_are_caught_beside_valid_controls(handbook: dict[str, Any]) -> None:
    runs = handbook["json"]["runs"]
    caught = {k: r for k, r in runs.items() if r["status"] == "CAUGHT"}
    assert len(caught) >= MIN_CAUGHT
    for key, run in caught.items():
        assert run["kind"] == "defect" and run["control_valid"] is True and run["expect"] == "CAUGHT"
        report = json.loads(Path(run["report"]).read_text())
        assert report["verdicts"][run["invariant"]]["valid"] is False, key  # caught by the named invariant
        assert report["unfired_faults"] == [] and report["faults"], f"{key}: its fault did not fire"
    others = {k: r for k, r in runs.items() if r["kind"] != "defect"}
    assert all(r["passed"] and r["status"] == r["expect"] for r in others.values())
    # a restart loop must be failed; the benchmark jobs are measured, not judged
    assert {r["expect"] for r in others.values()} == {"VALID", "INVALID", "MEASURED"}
    loop = json.loads(Path(runs["restart-loop"]["report"]).read_text())
    assert loop["verdicts"]["progress"]["valid"] is False and loop["outcome"] == "no_progress"


def test_a_caught_broken_trainer_is_never_shown_among_the_valid_runs(handbook: dict[str, Any]) -> None:
    html = handbook["html"]
    reference = html.split("<h2>Reference runs</h2>")[1].split("</table>")[0]
    caught = html.split("<h2>Broken trainers, caught</h2>")[1].split("</table>")[0]
    for key, run in handbook["json"]["runs"].items():
        if run["kind"] == "defect":
            assert f">{key}</a>" not in reference and 'badge VALID' not in caught
            assert f">{run['name']}</a>" in caught
    assert caught.count("badge CAUGHT") >= MIN_CAUGHT


def test_every_run_has_its_reproduce_command_on_the_page(handbook: dict[str, Any]) -> None:
    for key, run in handbook["json"]["runs"].items():
        assert run["reproduce"].startswith(("trainwreck ", "python -m trainwreck.")), key
        assert run["reproduce"].replace("'", "&#x27;").replace('"', "&quot;") in handbook["html"], key


def test_every_svg_parses_as_xml_and_each_report_gets_its_plots(handbook: dict[str, Any]) -> None:
    out = handbook["out"]
    files = sorted(out.rglob("*.svg"))
    judged = [r for r in handbook["json"]["runs"].values() if r["kind"] != "measure"]
    assert len(files) >= 4 * len(judged)
    for path in files:
        assert ET.parse(path).getroot().tag == "{http://www.w3.org/2000/svg}svg", path
    inline = re.findall(r"<svg.*?</svg>", handbook["html"], re.S)
    assert len(inline) >= len(CHAPTERS)
    for svg in inline:
        ET.fromstring(svg)


def test_the_coverage_plot_counts_what_the_coverage_invariant_counts(handbook: dict[str, Any]) -> None:
    runs = handbook["json"]["runs"]
    for key in ("resume", "sampler_not_saved"):
        counts = json.loads(Path(runs[key]["report"]).read_text())["verdicts"]["coverage"]["counts"]
        label = ET.fromstring(coverage_svg(Path(runs[key]["run_dir"]))).get("aria-label")
        assert label.startswith(f"Sample coverage: {counts['duplicated_ids']} repeated use(s)"), (key, label)
    assert counts["duplicated_ids"] > 0  # the defect's plot has red in it: the plot can show a failure


def test_the_loss_plot_marks_a_divergence_only_where_the_trajectory_left_the_golden_run(
        handbook: dict[str, Any]) -> None:
    runs = handbook["json"]["runs"]
    golden = {k: Path(json.loads(Path(r["report"]).read_text())["golden"]) for k, r in runs.items()
              if r["kind"] != "measure"}
    good = ET.fromstring(loss_svg(Path(runs["resume"]["run_dir"]), golden["resume"])).get("aria-label")
    bad = ET.fromstring(loss_svg(Path(runs["optimizer_not_saved"]["run_dir"]), golden["optimizer_not_saved"]))
    assert "matches the golden run at every step" in good
    assert "first diverges from the golden run at step" in bad.get("aria-label")


def test_an_unknown_chapter_is_refused_with_exit_2_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["handbook", "--out", str(tmp_path / "h"), "--chapters", "step,nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown chapter 'nope'" in err and "known chapters: step," in err
    assert not (tmp_path / "h").exists()


def test_a_non_empty_out_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert cli(["handbook", "--out", str(tmp_path)]) == 2
    assert "pick another --out" in capsys.readouterr().err


def test_the_command_ends_by_printing_the_casebook_path(handbook: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # The module fixture's output is gone by now; a one-chapter handbook prints the same way.
    monkeypatch.setenv("TRAINWRECK_GOLDEN_CACHE", str(handbook["out"].parent / "golden"))  # already warm
    out = handbook["out"].parent / "one"
    shutil.rmtree(out, ignore_errors=True)
    assert cli(["handbook", "--out", str(out), "--chapters", "resume"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"casebook: {out / 'index.html'}"


class _Judged:
    """Stands in for a JudgedRun: CaseResult reads only judgement.valid of a reference run."""

    class judgement:  # noqa: N801 - mirrors JudgedRun.judgement
        valid = True


def test_a_defect_the_suite_misses_is_shown_as_missed_and_fails_the_handbook(tmp_path: Path) -> None:
    row = Row(get_defect("sampler_not_saved"), True, False, "", True, tmp_path / "d", tmp_path / "c", 0.0)
    control = CaseResult(get_case("resume"), tmp_path / "c", _Judged())  # type: ignore[arg-type]
    caught = CaseResult(get_case("sampler_not_saved"), tmp_path / "d", _Judged(), row=row)  # type: ignore[arg-type]
    missed = CaseResult(caught.case, caught.run_dir, _Judged(),  # type: ignore[arg-type]
                        row=replace(row, caught=False))
    bad_control = CaseResult(caught.case, caught.run_dir, _Judged(),  # type: ignore[arg-type]
                             row=replace(row, control_valid=False))
    answered = [{"answered": True}]
    assert caught.status == "CAUGHT" and handbook_word({"a": control, "b": caught}, answered) == "VALID"
    assert missed.status == "MISSED" and handbook_word({"a": control, "b": missed}, answered) == "INVALID"
    assert not bad_control.passed  # caught, but beside a failing control it proves nothing
    assert handbook_word({"a": control, "b": bad_control}, answered) == "INVALID"
    assert handbook_word({"a": control, "b": caught}, [{"answered": False}]) == "UNKNOWN"


def test_a_benchmark_job_that_did_not_finish_leaves_the_handbook_unknown(tmp_path: Path) -> None:
    measured = CaseResult(get_case("bytes-ddp"), tmp_path, None, measured={"format": MEASUREMENT_FORMAT})
    failed = CaseResult(get_case("bytes-ddp"), tmp_path, None, error="the harness failed: RuntimeError: exited 1")
    answered = [{"answered": True}]
    assert measured.status == "MEASURED" and measured.passed
    assert failed.status == "UNKNOWN" and not failed.passed
    assert handbook_word({"m": measured}, answered) == "VALID"
    assert handbook_word({"m": failed}, answered) == "UNKNOWN"


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="chromium is not installed (CI: apt-get install -y --no-install-recommends chromium)")
def test_in_a_real_browser_the_caught_badges_and_the_plots_are_drawn(handbook: dict[str, Any], tmp_path: Path) -> None:
    from tests.report.test_report_browser import chromium, colours, near, read_png

    index = handbook["out"] / "index.html"
    dom = chromium(tmp_path, "--dump-dom", index.as_uri())
    assert dom.count('class="badge CAUGHT"') >= MIN_CAUGHT and dom.count("<svg") >= len(CHAPTERS)
    shot = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1100,1900", index.as_uri())
    _, _, rows = read_png(shot)
    page = colours(rows)
    assert near(page, (0x7C, 0x3A, 0xED)) > 500  # the purple CAUGHT badges, near the top of the page
    assert near(page, (0x15, 0x80, 0x3D)) > 200  # the green VALID badges of the reference runs


# ----- every highlighted number, read back from the page alone ----------------------------------

CLAIM = re.compile(r'<b class="claim" title="([^"]*)">([^<]*)</b>')
SOURCE = re.compile(r"(\S+): (?:report|measurement)\.json (\S+)")


def page_claims(html: str) -> list[tuple[str, str, str]]:
    """(chapter slug, tooltip, text) of every highlighted number on the page, from the HTML alone."""
    found = []
    for slug, body in re.findall(r'<section class="chapter" id="([^"]+)">(.*?)</section>', html, re.S):
        found += [(slug, unescape(title), unescape(text)) for title, text in CLAIM.findall(body)]
    return found


def misquoted(html: str, runs: dict[str, Any]) -> list[str]:
    """Highlighted numbers whose text is not the value at the field their tooltip names, read from that
    run's report.json (measurement.json for a benchmark job). Derived numbers ("label = formula") are
    checked against their inputs by the tests below."""
    bad = []
    for slug, title, text in page_claims(html):
        source = SOURCE.fullmatch(title)
        if source is None:
            continue
        run, path = source.group(1), [int(p) if p.isdigit() else p for p in source.group(2).split(".")]
        report = json.loads(Path(runs[run]["report"]).read_text())
        try:
            value = fmt(resolve(report, path))
        except (KeyError, IndexError, TypeError):
            value = "<missing>"
        if text not in (value, value + " s"):
            bad.append(f"{slug}: {title}: the page says {text!r}, the file holds {value!r}")
    return bad


def test_every_number_a_chapter_quotes_is_the_value_at_the_field_its_tooltip_names(handbook: dict[str, Any]) -> None:
    claims = page_claims(handbook["html"])
    for chapter in DEFAULT_CHAPTERS:
        sourced = [SOURCE.fullmatch(t) for slug, t, _ in claims if slug == chapter.slug and SOURCE.fullmatch(t)]
        assert sourced, f"chapter {chapter.slug} quotes no number from its runs"
        assert {m.group(1) for m in sourced} <= set(chapter.runs), chapter.slug  # only from its own runs
    assert misquoted(handbook["html"], handbook["json"]["runs"]) == []


def test_the_page_check_catches_a_quoted_number_altered_in_any_chapter(handbook: dict[str, Any]) -> None:
    html, runs = handbook["html"], handbook["json"]["runs"]
    for chapter in DEFAULT_CHAPTERS:
        slug, title, text = next(c for c in page_claims(html) if c[0] == chapter.slug and SOURCE.fullmatch(c[1]))
        section = re.search(rf'<section class="chapter" id="{slug}">.*?</section>', html, re.S)
        assert section is not None
        original = f'title="{escape(title)}">{escape(text)}</b>'
        assert original in section.group(0), (slug, original)
        altered = section.group(0).replace(original, f'title="{escape(title)}">9{escape(text)}</b>', 1)
        tampered = html[:section.start()] + altered + html[section.end():]
        assert any(line.startswith(f"{slug}: {title}:") for line in misquoted(tampered, runs)), slug


# ----- chapter 11: asynchronous checkpoints, DDP against FSDP -----------------------------------


def _report(handbook: dict[str, Any], run: str) -> dict[str, Any]:
    return json.loads(Path(handbook["json"]["runs"][run]["report"]).read_text())


def test_the_wide_runs_train_the_model_the_benchmark_measures() -> None:
    from trainwreck.benchmarks.fsdp import SPEC
    from trainwreck.harness.suites.handbook import WIDE

    assert WIDE == {k: getattr(SPEC, k) for k in WIDE}


def test_chapter_11_contrasts_the_steps_checkpoint_time_with_sync_and_async_saves(handbook: dict[str, Any]) -> None:
    chapter = next(c for c in handbook["json"]["chapters"] if c["slug"] == "async")
    assert chapter["answered"] and chapter["question"] == CHAPTERS[[c.slug for c in CHAPTERS].index("async")].question
    derived = {d["label"]: d for d in chapter["derived"]}
    for run in ("wide-sync", "wide-async"):
        report = _report(handbook, run)
        assert report["valid"] is True and report["spec"]["ckpt_mode"] == run.split("-")[1]
        rank0 = next(r for r in report["phases"]["ranks"] if r["rank"] == 0)
        per_save = derived[f"{run}_stall_per_save_s"]
        # every save but the one after the last update lands in the next step's checkpoint phase
        assert rank0["checkpoint_steps"] == report["phases"]["save_seconds"]["count"] - 1
        assert per_save["inputs"] == {"checkpoint_phase_s": rank0["totals"]["checkpoint"],
                                      "saves": rank0["checkpoint_steps"]}
        assert math.isclose(per_save["value"], rank0["totals"]["checkpoint"] / rank0["checkpoint_steps"])
        assert fmt(per_save["value"]) in chapter_text(handbook["html"], "async")
    # No timing assertion: which is faster on a shared machine is what the page reports, not what we assert.


def test_chapter_11_shows_a_kill_during_the_background_persist_losing_only_the_save_in_flight(
        handbook: dict[str, Any]) -> None:
    report = _report(handbook, "async-kill-persist")
    fired = [f for f in report["faults"] if f["id"] == "kill-persist-8"]
    assert fired and report["unfired_faults"] == [], "the kill during the persist did not fire"
    row = report["recovery"][0]
    assert row["fault_id"] == "kill-persist-8" and row["restored"]["checkpoint"] == row["checkpoint"]
    assert row["restored"]["step"] < 8 and row["steps_redone"] > 0  # the step-8 save in flight was lost
    assert report["verdicts"]["atomicity"]["valid"] is True and report["valid"] is True
    text = re.sub(r"<[^>]+>", "", chapter_text(handbook["html"], "async"))
    assert f"loaded {row['restored']['checkpoint']}" in text and f"redid {row['steps_redone']} update(s)" in text


def test_chapter_11_compares_ddp_and_fsdp_bytes_step_time_and_loss_from_the_runs(handbook: dict[str, Any]) -> None:
    from trainwreck.invariants.continuity import losses_match

    ddp, fsdp = _report(handbook, "bytes-ddp"), _report(handbook, "bytes-fsdp")
    for measured, world_share in ((ddp, 1), (fsdp, 2)):
        assert measured["bytes_per_param"]["state"] == round((measured["params"] + measured["optimizer"])
                                                             / measured["numel"], 3)
        assert measured["bytes_per_param"]["state"] == pytest.approx(12 / world_share, rel=1e-3)
    chapter = next(c for c in handbook["json"]["chapters"] if c["slug"] == "async")
    gap = next(d for d in chapter["derived"] if d["label"] == "fsdp_vs_ddp_max_loss_gap")
    runs = {k: _report(handbook, k)["loss"] for k in ("wide-sync", "wide-fsdp")}
    assert runs["wide-sync"]["steps"] == runs["wide-fsdp"]["steps"] and runs["wide-sync"]["steps"]
    gaps = [abs(f - d) / max(1.0, abs(d)) for f, d in zip(runs["wide-fsdp"]["values"], runs["wide-sync"]["values"])]
    assert gap["value"] == max(gaps)
    assert all(losses_match(f, d, DEFAULT_LOSS_TOLERANCE)
               for f, d in zip(runs["wide-fsdp"]["values"], runs["wide-sync"]["values"]))
    state = _report(handbook, "wide-fsdp")["state"]
    assert state["parallelism"] == "fsdp" and len(state["rank_bytes"]) == 2
    assert state["rank_share"] == pytest.approx(0.5, abs=0.01)  # each rank wrote half, framing aside
    assert "OUTSIDE" not in chapter_text(handbook["html"], "async")


def test_fsdp_and_async_reports_answer_their_interview_angle_with_their_own_numbers(
        handbook: dict[str, Any]) -> None:
    def angle(run: str, topic: str) -> str:
        found = [a["answer"] for a in _report(handbook, run)["angles"] if a["topic"] == topic]
        assert found, f"{run} has no {topic} angle"
        return found[0]

    state = _report(handbook, "wide-fsdp")["state"]
    answer = angle("wide-fsdp", "sharding")
    assert f"{state['rank_bytes'][0]:,}" in answer and "12/2 = 6" in answer
    shrink = _report(handbook, "fsdp-shrink-world")
    assert [f["id"] for f in shrink["faults"]] == ["node-loss"] and shrink["unfired_faults"] == []
    assert [a["world_size"] for a in shrink["attempts"]] == [4, 2] and shrink["valid"] is True
    restored = shrink["attempts"][1]["restored"]["checkpoint"]
    assert (f"Attempt 1 on 2 rank(s) restored {restored}, written as shards by attempt 0 on 4 rank(s)"
            in angle("fsdp-shrink-world", "sharding"))
    kill = _report(handbook, "async-kill-persist")
    answer = angle("async-kill-persist", "async")
    assert f"loaded {kill['recovery'][0]['restored']['checkpoint']}" in answer
    assert f"{kill['phases']['save_seconds']['mean']:.3f} s on average in the background" in answer
    topics = {a["topic"] for a in _report(handbook, "resume")["angles"]}
    assert not topics & {"sharding", "async"}  # a plain DDP run with sync saves raises neither


# ----- words as true as the verdicts (issue 23) -------------------------------------------------


def plain(handbook: dict[str, Any], slug: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", chapter_text(handbook["html"], slug)))


def test_every_sentence_of_the_handbook_and_of_its_runs_reports_is_true(handbook: dict[str, Any]) -> None:
    assert all(c["sentences"] for c in handbook["json"]["chapters"])
    assert check_handbook(handbook["out"]) == []


def test_the_handbook_check_fails_on_a_sentence_whose_verdict_is_turned_over(handbook: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    copy = tmp_path / "hb"
    shutil.copytree(handbook["out"], copy, ignore=shutil.ignore_patterns("runs"))
    record = json.loads((copy / "handbook.json").read_text())
    run = record["runs"]["resume"]
    verdicts = json.loads((Path(run["run_dir"]) / "verdicts.json").read_text())
    verdicts["verdicts"]["continuity"]["valid"] = False
    fake = tmp_path / "resume"
    shutil.copytree(run["run_dir"], fake, symlinks=True)
    (fake / "verdicts.json").write_text(json.dumps(verdicts))
    run["run_dir"] = str(fake)
    (copy / "handbook.json").write_text(json.dumps(record))
    problems = check_handbook(copy)
    assert any(p.startswith("resume: resume.") and "verdicts.continuity.valid == True" in p for p in problems)


def test_chapter_1_says_the_trainer_reduces_in_parameter_order_not_bucket_by_bucket(handbook: dict[str, Any]) -> None:
    text = plain(handbook, "step")
    assert "lays them out in the module's parameter order, as one flat all-reduce" in text
    assert "one all-reduce per parameter when it does not" in text and "trainer/gradsync.py" in text


def test_chapter_2_says_where_the_sampler_went_back_not_from_its_start(handbook: dict[str, Any]) -> None:
    back = _report(handbook, "sampler_not_saved")["facts"]["coverage"]["went_back"]
    text = plain(handbook, "partition")
    assert f"sampler went back from epoch {back['from_epoch']} to epoch {back['to_epoch']}" in text
    assert "from its start" not in text and "(epoch, id) pair(s)" in text


def test_chapter_3_names_the_restore_digest_when_that_is_what_caught_the_optimizer(handbook: dict[str, Any]) -> None:
    report = _report(handbook, "optimizer_not_saved")
    text = plain(handbook, "state")
    if report["facts"]["continuity"]["first_kind"] == "restore_digest":
        assert "caught at the restore itself" in text and "only the steps after the restore" not in text
    else:
        assert "only the steps after the restore" in text and "caught at the restore itself" not in text


def test_chapter_8_quotes_the_loss_gap_to_the_golden_run_and_whether_the_curves_end_together(
        handbook: dict[str, Any]) -> None:
    """One update's loss moves with its batch's samples: the largest gap is that, not a divergence;
    whether the duplication shows on the curve is the final gap, against continuity's tolerance."""
    gold = _report(handbook, "pad_uneven_shards")["loss"]["golden"]
    assert gold and gold["max_gap"] != 0
    text = plain(handbook, "silent")
    assert f"by up to {fmt(100 * gold['max_gap'])} % at update {gold['max_gap_step']}" in text
    together = gold["final_gap"] < DEFAULT_LOSS_TOLERANCE
    assert ("The curves end together" in text) == together and ("They end " in text) == (not together)
    assert "keeps falling" not in text


def test_chapter_9_uses_the_periodic_saves_the_reports_mtbf_and_says_how_far_from_optimal(
        handbook: dict[str, Any]) -> None:
    assert MTBF_ASSUMED_S == REPORT_MTBF_S == 3600.0
    report = _report(handbook, "resume")
    chapter = next(c for c in handbook["json"]["chapters"] if c["slug"] == "interval")
    ratio = next(d for d in chapter["derived"] if d["label"] == "saves_more_often_than_optimum")
    steps = math.sqrt(2 * report["phases"]["save_seconds"]["interval_mean"] * 3600) / report["phases"]["median_step_s"]
    assert math.isclose(ratio["value"], steps / report["spec"]["ckpt_interval"])
    assert "one failure an hour" in plain(handbook, "interval") and "a day" not in plain(handbook, "interval")


def test_chapter_11_counts_the_gradients_and_tells_fp32_from_mixed_precision(handbook: dict[str, Any]) -> None:
    ddp = _report(handbook, "bytes-ddp")["bytes_per_param"]
    chapter = next(c for c in handbook["json"]["chapters"] if c["slug"] == "async")
    held = next(d for d in chapter["derived"] if d["label"] == "ddp_max_params_80gb_billions")
    assert math.isclose(held["value"], 80 / (ddp["params"] + ddp["grads"] + ddp["optimizer"]))
    assert "16 with the gradients" in plain(handbook, "async") and "Mixed precision also comes to 16" in plain(
        handbook, "async")


def test_the_progress_line_says_the_bytes_per_parameter_leave_out_the_gradients() -> None:
    from trainwreck.harness.commands.handbook import measured_bytes

    per = {"params": 4.0, "grads": 4.0, "optimizer": 8.0, "state": 12.0}  # what bytes-ddp measures in fp32
    line = measured_bytes({"bytes_per_param": per})
    assert line == ("rank 0 measured 12 bytes per parameter of weights and optimizer state (4 + 8), gradients not "
                    "included: 4 more (16 in all)")
    assert measured_bytes({"seconds": 0.01}) == "measured"


def test_chapter_10_and_12_say_configured_or_measured_and_name_the_slow_rank(handbook: dict[str, Any]) -> None:
    hang = plain(handbook, "hang")
    assert "sooner than gloo" not in hang and "not one measured here" in hang
    paging, slowdowns = plain(handbook, "paging"), _report(handbook, "straggler")["slowdowns"]
    updates = [s for s in slowdowns["series"] if s["where"] == "update"]
    if not updates:  # on a loaded machine the 0.3 s straggle can stay under 3x a slow median
        assert "nothing to page on" in paging
        return
    longest = max(updates, key=lambda s: s["steps_per_episode"])
    line = next(li for li in paging.split("throughput collapse (straggler): ")[1:])
    assert line.startswith(f"rank(s) {', '.join(map(str, longest['ranks']))} took over")
    # the straggle lasts updates 3-6, fewer than the rule's window: a ticket, not a page
    assert longest["steps_per_episode"] <= 8 and "→ no page" in line


# ----- chapters comm and memory: communication cost, bytes per parameter, ZeRO, pipeline bubble --------


def _derived(handbook: dict[str, Any], slug: str) -> dict[str, float]:
    chapter = next(c for c in handbook["json"]["chapters"] if c["slug"] == slug)
    return {d["label"]: d["value"] for d in chapter["derived"]}


def test_the_comm_chapter_quotes_the_measured_all_reduce_and_the_ring_arithmetic(handbook: dict[str, Any]) -> None:
    measured = _report(handbook, "allreduce-cost")
    n, big, small, model = (measured["world_size"], measured["sizes"][-1], measured["sizes"][0], measured["model"])
    derived, text = _derived(handbook, "comm"), plain(handbook, "comm")
    assert measured["backend"] == "gloo" and n == 2 and len(measured["sizes"]) >= 3
    assert math.isclose(derived["ring_factor"], 2 * (n - 1) / n)
    assert math.isclose(derived["ring_bytes_per_rank"], 2 * (n - 1) / n * big["bytes"])
    assert math.isclose(derived["allreduce_ns_per_byte"],
                        (big["seconds"] - small["seconds"]) / (big["bytes"] - small["bytes"]) * 1e9)
    assert math.isclose(derived["per_parameter_over_bucketed"], model["per_parameter_s"] / model["bucketed_s"])
    assert f"{fmt(big['bytes'])} bytes took {fmt(big['seconds'])} s" in text
    wins, loses = "Bucketing wins because", "Here one all-reduce per parameter was not slower"
    assert (wins in text) == (model["per_parameter_s"] > model["bucketed_s"]) and (loses in text) != (wins in text)
    # The model measured is past DDP's first bucket, so the trainer's hook would reduce it per parameter.
    assert model["bytes"] >= model["one_bucket_bytes"] and model["hook"] == "per_parameter"
    assert f"does for a model past DDP's first bucket of {fmt(model['one_bucket_bytes'])} bytes, as this one is" in text


def test_the_memory_chapter_computes_zero_stages_from_the_measured_bytes(handbook: dict[str, Any]) -> None:
    ddp, fsdp = _report(handbook, "bytes-ddp"), _report(handbook, "bytes-fsdp")
    n, held = ddp["world_size"], ddp["params"] + ddp["grads"] + ddp["optimizer"]
    derived, text = _derived(handbook, "memory"), plain(handbook, "memory")
    assert math.isclose(derived["fp32_bytes_per_param"], held / ddp["numel"])
    assert math.isclose(derived["zero1_bytes_per_rank"], ddp["params"] + ddp["grads"] + ddp["optimizer"] / n)
    assert math.isclose(derived["zero2_bytes_per_rank"], ddp["params"] + (ddp["grads"] + ddp["optimizer"]) / n)
    assert math.isclose(derived["zero3_bytes_per_rank"], held / n)
    numel = ddp["numel"]  # the mixed-precision table: 2 + 2 + 12 bytes per parameter, its own stages
    assert derived["mixed_zero1_bytes_per_rank"] == round(4 * numel + 12 * numel / n)
    assert derived["mixed_zero2_bytes_per_rank"] == round(2 * numel + 14 * numel / n)
    assert derived["mixed_zero3_bytes_per_rank"] == round(16 * numel / n)
    assert "in the fp32 accounting measured above (4 + 4 + 8 bytes per parameter)" in text
    assert "In the mixed-precision accounting (2 + 2 + 12 bytes per parameter, computed, not measured)" in text
    assert math.isclose(derived["fsdp_bytes_per_rank"], fsdp["params"] + fsdp["grads"] + fsdp["optimizer"])
    assert math.isclose(derived["bubble_percent_p4_m4"], 100 * 3 / 7)
    assert math.isclose(derived["bubble_percent_p8_m16"], 100 * 7 / 23)
    assert derived["onef1b_inflight_p4_m16"] == 4 and derived["gpipe_inflight_p4_m16"] == 16
    assert "computed here for depths a 2-core machine cannot give a core per stage" in text and "2 (half-precision weights) + 2" in text
    assert "chapter pipeline, under --full, measures it" in text  # the measured bubble: test_handbook_pipeline.py


def test_the_handbook_check_catches_an_altered_all_reduce_time_and_an_altered_byte_count(
        handbook: dict[str, Any], tmp_path: Path) -> None:
    for run, path in (("allreduce-cost", ("model", "bucketed_s")), ("bytes-ddp", ("optimizer",))):
        copy = tmp_path / run / "hb"
        shutil.copytree(handbook["out"], copy, ignore=shutil.ignore_patterns("runs"))
        record = json.loads((copy / "handbook.json").read_text())
        measured = json.loads(Path(record["runs"][run]["report"]).read_text())
        target = measured
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = target[path[-1]] * 2
        fake = tmp_path / run / "measurement.json"
        fake.write_text(json.dumps(measured))
        record["runs"][run]["report"] = str(fake)
        (copy / "handbook.json").write_text(json.dumps(record))
        problems = check_handbook(copy)
        assert any(f"from {run}: {'.'.join(path)}" in p for p in problems), (run, problems)


def test_the_async_chapter_compares_saves_not_medians_and_says_whether_its_two_fsdp_ratios_agree(
        handbook: dict[str, Any]) -> None:
    derived, text = _derived(handbook, "async"), plain(handbook, "async")
    sync, fsdp = _report(handbook, "wide-sync"), _report(handbook, "wide-fsdp")
    assert "A median update cannot show either" in text and "with synchronous saves and" not in text
    bench = _report(handbook, "bytes-fsdp")["step_s"] / _report(handbook, "bytes-ddp")["step_s"]
    runs = fsdp["phases"]["median_step_s"] / sync["phases"]["median_step_s"]
    assert math.isclose(derived["fsdp_over_ddp_step_benchmark"], bench)
    assert math.isclose(derived["fsdp_over_ddp_step_runs"], runs)
    agree = (bench > 1) == (runs > 1) and max(bench, runs) / min(bench, runs) <= 1.5
    assert ("in the runs: they agree." in text) == agree
    assert ("they disagree, because each is one measurement" in text) != agree


def test_the_review_corrections_read_as_the_runs_show(handbook: dict[str, Any]) -> None:
    """Sentences an expert review called wrong (2026-11-27), each re-derived from the runs."""
    resume, hang = _report(handbook, "resume"), _report(handbook, "hang-sigstop")
    restores = resume["verdicts"]["continuity"]["counts"]["restores_checked"]
    assert f"The reference run's {restores} restore(s) (one per rank that resumed)" in plain(handbook, "state")
    assert f"no rank completed update {hang['hangs'][0]['last_step']};" in plain(handbook, "health")
    assert "can all look healthy while a peer is stopped (general behaviour, not measured" in plain(handbook, "health")
    redo = resume["totals"]["redo_steps"]
    assert (f"The {redo} update(s) attempt 0 applied after its last checkpoint, lost with the kill, are outside the "
            "lineage") in plain(handbook, "resume")
    gap = _derived(handbook, "async")["fsdp_vs_ddp_max_loss_gap"]
    assert ("(the losses are identical at every update)" in plain(handbook, "async")) == (gap == 0)


def test_the_coverage_plot_draws_an_epochs_end_only_where_an_epoch_ended() -> None:
    from trainwreck.report.plots import epoch_ends

    grid = [(1, 0, [0, 1]), (2, 0, [2, 3]), (3, 1, [1, 0])]  # 4 ids, 2 an update; the run stops mid-epoch 1
    assert [epoch_ends(grid, col, 4, counts) for col, counts in
            ((0, {0: 1, 1: 1}), (1, {0: 1, 1: 1, 2: 1, 3: 1}), (2, {0: 1, 1: 1}))] == [False, True, False]
    assert epoch_ends(grid[:2], 1, 5, {0: 1, 1: 1, 2: 1, 3: 1})  # one id left, less than an update: dropped


def test_a_chapter_its_runs_cannot_answer_says_which_run_and_why() -> None:
    from trainwreck.report.handbook import Chapter, build_chapter

    chapter = Chapter("x", "Why?", ("gone", "broken", "invalid"), lambda ev: [[ev.s("answered")]])
    reports = {"broken": {"verdicts": {}, "error": "the run could not be judged: bad events"},
               "invalid": {"verdicts": {"coverage": {"valid": False}}, "error": None}}
    built = build_chapter(chapter, reports)
    assert built["answered"] is False
    assert built["paragraphs"] == ["Not answered: gone produced no report; broken has no verdicts to quote "
                                   "(the run could not be judged: bad events)."]


C10D = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" / "c10d"


# ----- the hang chapter: its sentences against its own runs' evidence -----

def plain_hang(handbook: dict[str, Any]) -> str:
    """The chapter's rendered sentences without their markup (a quoted number sits in a <b> with its source)."""
    return unescape(re.sub(r"<[^>]+>", "", " ".join(s["text"] for s in handbook["chapters"]["hang"]["sentences"]
                                                    if s["rendered"])))


def test_the_hang_chapter_says_which_rank_monitored_barrier_named_in_its_own_run(handbook: dict[str, Any]) -> None:
    barrier = handbook["reports"]["monitored-barrier"]
    first, second = barrier["ranks"]
    assert first["names"] == [barrier["stalled_rank"]]  # torch's error named the rank held back
    text = plain_hang(handbook)
    assert f"with rank {barrier['stalled_rank']} of {barrier['world_size']} gloo ranks held back" in text
    assert f"its error named rank(s) {barrier['stalled_rank']}, the one held back" in text
    assert f"Rank {second['rank']}, which did arrive, raised too, naming rank(s) 0" in text


def test_the_gil_hang_credits_faulthandler_with_the_stack_its_dump_holds(handbook: dict[str, Any], tmp_path: Path) -> None:
    (stack,) = [s for s in handbook["reports"]["hang-holding-gil"]["hangs"][0]["stacks"] if s["rank"] == 0]
    assert stack["faulthandler"] and stack["frame"] == "faults/blocking.py:31 holding_gil", stack
    text = plain_hang(handbook)
    assert "an in-process watchdog thread cannot help" not in text and "no stack of a suspect" not in text
    assert "faulthandler's handler for the watchdog's SIGUSR1 is C code run from the signal, which needs no GIL" \
        in text
    # The sentence presumes the dump is faulthandler's: a report saying otherwise fails the page's check.
    out = tmp_path / "hb"
    shutil.copytree(handbook["out"], out, symlinks=True)
    record = json.loads((out / "handbook.json").read_text())
    report_path = Path(record["runs"]["hang-holding-gil"]["report"])
    report = json.loads(report_path.read_text())
    for s in report["hangs"][0]["stacks"]:
        s["faulthandler"] = False
    tampered = tmp_path / "report.json"
    tampered.write_text(json.dumps(report))
    record["runs"]["hang-holding-gil"]["report"] = str(tampered)
    (out / "handbook.json").write_text(json.dumps(record))
    assert any("faulthandler" in p and "does not hold" in p for p in check_handbook(out))


def test_what_the_hang_chapter_says_of_nccl_is_what_the_installed_torch_declares() -> None:
    if not (C10D / "ProcessGroupNCCL.hpp").is_file():
        pytest.skip(f"this torch ships no c10d headers ({C10D})")
    headers = (C10D / "ProcessGroupNCCL.hpp").read_text() + (C10D / "FlightRecorder.hpp").read_text()
    text = " ".join(c.template for c in on_gpus(Evidence(reports={})))
    for name in set(re.findall(r"TORCH_NCCL_[A-Z_]+", text)):
        assert f'"{name}"' in headers, f"{name} is not a variable torch {torch.__version__} reads"
    assert re.search(r"kProcessGroupNCCLDefaultTimeout =\s*std::chrono::milliseconds\((\d+) \* 60 \* 1000\)",
                     headers).group(1) == str(NCCL_TIMEOUT_MIN)
    assert f'"TORCH_NCCL_TRACE_BUFFER_SIZE"}}, {FLIGHT_RECORDER_ENTRIES})' in headers
    assert f"the default value ({NCCL_ASYNC_ERROR_HANDLING} - SkipCleanUp)" in headers
