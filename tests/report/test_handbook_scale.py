"""trainwreck handbook --full's scale chapters (report/chapters_scale.py): every sentence agrees with its runs.

One handbook of the four chapters (batch, accum, restart-scope, scale; 14 runs, a few minutes on 2 shared
cores from an empty golden cache) is made once per module. The checks recompute what a sentence says from
the run's own report, and tamper with a report to show a sentence its run contradicts is not rendered.
"""
from __future__ import annotations

import copy
import math
import re
from html import unescape
from typing import Any

import pytest

from tests.report.handbooks import make_handbook
from trainwreck.report.chapters_scale import LR_RUNS, NETWORK_RATIO, SCALE_CHAPTERS
from trainwreck.report.handbook import MEASUREMENT_FORMAT, build_chapter, fmt
from trainwreck.report.truth import check_handbook
from trainwreck.harness.suites.handbook import CHAPTERS, default_chapters, get_chapter

SLUGS = [c.slug for c in SCALE_CHAPTERS]


@pytest.fixture(scope="module")
def handbook(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_handbook(tmp_path_factory, "handbook-scale", SLUGS)


def chapter(handbook: dict[str, Any], slug: str) -> dict[str, Any]:
    return next(c for c in handbook["json"]["chapters"] if c["slug"] == slug)


def text(handbook: dict[str, Any], slug: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", " ".join(chapter(handbook, slug)["paragraphs"])))


def test_the_scale_chapters_are_behind_full_and_the_default_handbook_leaves_them_out() -> None:
    assert all(c.full for c in SCALE_CHAPTERS) and [c.slug for c in CHAPTERS if c.slug in SLUGS] == SLUGS
    assert not {c.slug for c in default_chapters()} & set(SLUGS)


@pytest.mark.slow  # runs the --full chapters (two minutes or more on 2 cores): nightly
def test_the_scale_chapters_pass_the_truth_check_and_every_run_is_as_expected(handbook: dict[str, Any]) -> None:
    assert handbook["code"] == 0 and handbook["json"]["valid"] == "VALID"
    assert all(chapter(handbook, s)["answered"] for s in SLUGS)
    assert check_handbook(handbook["out"]) == []


@pytest.mark.slow  # runs the --full chapters (two minutes or more on 2 cores): nightly
def test_the_batch_chapter_quotes_each_rules_multiplier_and_loss_gap_from_its_run(handbook: dict[str, Any]) -> None:
    said, derived = text(handbook, "batch"), {d["label"]: d["value"] for d in chapter(handbook, "batch")["derived"]}
    for run in LR_RUNS:
        report = handbook["reports"][run]
        a0, a1 = report["attempts"][0], report["attempts"][1]
        assert (a0["rank_batch"] * a0["world_size"], a1["rank_batch"] * a1["world_size"]) == (16, 8)
        ratio = a1["rank_batch"] * a1["world_size"] / report["spec"]["global_batch"]
        rule = report["spec"]["lr_scaling"]
        assert derived[f"{run}_lr_multiplier"] == pytest.approx({"none": 1, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule])
        assert f"gap of {fmt(report['loss']['golden']['final_gap'])}" in said
        assert report["verdicts"]["continuity"]["counts"]["global_batch_after_change"] == 8
    best = min(LR_RUNS, key=lambda r: abs(handbook["reports"][r]["loss"]["golden"]["final_gap"]))
    assert f"Closest to the golden run at the end: {best}," in said
    assert handbook["reports"]["lr-linear-rewarm"]["spec"]["lr_rewarmup"] > 0


@pytest.mark.slow  # runs the --full chapters (two minutes or more on 2 cores): nightly
def test_the_accum_chapter_says_caught_only_while_coverage_judges_the_mid_window_save_invalid(
        handbook: dict[str, Any]) -> None:
    said, bad = text(handbook, "accum"), handbook["reports"]["ckpt_mid_window"]
    assert f"{fmt(bad['verdicts']['coverage']['counts']['ids_not_covered'])} id(s) never trained on in their epoch" in said
    assert handbook["reports"]["accum"]["spec"]["grad_accum"] == 4
    tampered = copy.deepcopy(handbook["reports"])
    tampered["ckpt_mid_window"]["verdicts"]["coverage"]["valid"] = True  # a defect the judge missed
    rebuilt = build_chapter(get_chapter("accum"), tampered)
    shown = unescape(re.sub(r"<[^>]+>", "", " ".join(rebuilt["paragraphs"])))
    assert "CAUGHT" not in shown and "Nothing double-counted" in shown


@pytest.mark.slow  # runs the --full chapters (two minutes or more on 2 cores): nightly
def test_the_scale_chapter_tells_the_three_slowdowns_apart_by_their_phases(handbook: dict[str, Any]) -> None:
    said, reports = text(handbook, "scale"), handbook["reports"]
    net, model = reports["slow-network"]["phases"]["ranks"], reports["slow-model"]["phases"]["ranks"]
    assert all(r["totals"]["backward"] > NETWORK_RATIO * r["own_s"] for r in net)
    assert all(r["totals"]["forward"] > r["totals"]["backward"] for r in model)
    assert "A slow network is systemic" in said and "A regression in the model is systemic" in said
    tampered = copy.deepcopy(reports)
    for r in tampered["slow-model"]["phases"]["ranks"]:
        r["totals"]["forward"] = 0.0  # the slowdown moved out of forward: the sentence must go
    rebuilt = build_chapter(get_chapter("scale"), tampered)
    assert "A regression in the model is systemic" not in unescape(" ".join(rebuilt["paragraphs"]))


def test_without_torchft_the_restart_scope_chapter_says_it_was_not_measured() -> None:
    skipped = {"format": MEASUREMENT_FORMAT, "measure": "restart",
               "skipped": "torchft is not installed (pip install 'trainwreck[torchft]')"}
    built = build_chapter(get_chapter("restart-scope"), {"restart-scope": skipped})
    assert built["answered"] and "torchft is not installed" in unescape(built["paragraphs"][0])


@pytest.mark.slow  # runs the --full chapters (two minutes or more on 2 cores): nightly
def test_the_restart_scope_chapter_quotes_both_scopes_lost_work(handbook: dict[str, Any]) -> None:
    rows, said = handbook["reports"]["restart-scope"]["rows"], text(handbook, "restart-scope")
    assert (f"the group restart redid {rows['group']['figures']['updates_redone']} update(s), the job restart "
            f"{rows['job']['figures']['updates_redone']}") in said
