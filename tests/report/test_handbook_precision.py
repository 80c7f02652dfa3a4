"""The --full chapters (report/chapters_precision.py): mixed precision, omission, a poisoned
communicator, activations. One real run of the four chapters (11 runs, two new golden runs, from an
empty golden cache) is made once per module; each test checks a sentence against the run it quotes,
so a chapter that says what its run contradicts fails here.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from tests.report.handbooks import make_handbook
from trainwreck.report.chapters_precision import PRECISION_CHAPTERS
from trainwreck.report.truth import check_handbook
from trainwreck.harness.suites.handbook import CHAPTERS, default_chapters

SLUGS = [c.slug for c in PRECISION_CHAPTERS]


@pytest.fixture(scope="module")
def handbook(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_handbook(tmp_path_factory, "handbook-full", SLUGS)


def report(handbook: dict[str, Any], run: str) -> dict[str, Any]:
    return json.loads(Path(handbook["json"]["runs"][run]["report"]).read_text())


def text(handbook: dict[str, Any], slug: str) -> str:
    rendered = [s["text"] for s in handbook["chapters"][slug]["sentences"] if s["text"]]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", " ".join(rendered)))


def test_the_full_chapters_are_left_out_of_the_default_handbook() -> None:
    assert all(c.full for c in PRECISION_CHAPTERS)
    assert [c.slug for c in CHAPTERS if c.slug in SLUGS] == SLUGS
    assert not {c.slug for c in default_chapters()} & set(SLUGS)


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_full_chapters_pass_answer_and_every_sentence_is_true(handbook: dict[str, Any]) -> None:
    assert handbook["code"] == 0 and handbook["json"]["valid"] == "VALID"
    assert all(handbook["chapters"][s]["answered"] for s in SLUGS)
    assert check_handbook(handbook["out"]) == []
    for chapter in handbook["json"]["chapters"]:
        for claim in chapter["claims"]:
            value: Any = report(handbook, claim["run"]) if claim["run"] != "activations" else json.loads(
                Path(handbook["json"]["runs"]["activations"]["report"]).read_text())
            for part in claim["path"]:
                value = value[part]
            assert value == claim["value"] or (isinstance(value, float) and math.isnan(value)), claim


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_precision_chapter_says_bf16_resumes_exactly_and_the_lost_scaler_is_caught_at_the_restore(
        handbook: dict[str, Any]) -> None:
    assert report(handbook, "bf16-resume")["verdicts"]["continuity"]["valid"] is True
    assert report(handbook, "fp16-resume")["verdicts"]["continuity"]["valid"] is True
    lost = report(handbook, "scaler_not_saved")
    assert lost["verdicts"]["continuity"]["valid"] is False
    assert lost["facts"]["continuity"]["first_kind"] == "restore_digest"
    said = text(handbook, "precision")
    assert lost["facts"]["continuity"]["first"] in said and "the restore itself is caught" in said


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_precision_chapter_says_no_invariant_sees_underflow_only_the_golden_comparison(
        handbook: dict[str, Any]) -> None:
    unscaled = report(handbook, "fp16_unscaled")
    assert unscaled["verdicts"]["continuity"]["valid"] is False
    assert unscaled["facts"]["continuity"]["first_kind"] in ("golden_digest", "golden_loss")
    said = text(handbook, "precision")
    assert "No invariant sees underflow as such" in said
    equal_loss = "its loss equals the scaled run's at every update" in said
    assert equal_loss == (unscaled["loss"]["golden"]["max_gap"] == 0.0)


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_omission_chapter_quotes_the_ids_never_covered_beside_a_valid_control(handbook: dict[str, Any]) -> None:
    control, omitted = report(handbook, "resume"), report(handbook, "truncate_uneven_shards")
    assert control["verdicts"]["coverage"]["valid"] is True
    counts = omitted["verdicts"]["coverage"]["counts"]
    assert omitted["verdicts"]["coverage"]["valid"] is False and counts["ids_not_covered"] > 0
    assert counts["duplicated_ids"] == 0  # omission, not duplication
    assert f"{counts['ids_not_covered']} id(s) never used" in text(handbook, "omission")
    assert handbook["json"]["runs"]["truncate_uneven_shards"]["status"] == "CAUGHT"
    assert handbook["json"]["runs"]["resume"]["status"] == "VALID"


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_poison_chapter_says_replicas_agree_only_when_the_nan_went_through_the_all_reduce(
        handbook: dict[str, Any]) -> None:
    reduced, local = report(handbook, "nan-reduced"), report(handbook, "nan-local")
    assert reduced["verdicts"]["replicas"]["valid"] is False
    assert local["verdicts"]["replicas"]["valid"] is True  # every rank took the same poisoned step
    assert reduced["verdicts"]["continuity"]["valid"] is False and local["verdicts"]["continuity"]["valid"] is False
    assert local["loss"]["steps"][-1] < local["spec"]["total_steps"]  # later losses were not finite
    said = text(handbook, "poison")
    assert "the replicas agree bit for bit" in said and "the replica check catches the ranks disagreeing" in said
    skip = report(handbook, "skip-collective")
    assert skip["hangs"] and 1 in skip["hangs"][0]["ranks"] and skip["outcome"] == "completed"


@pytest.mark.slow  # runs the --full chapters (a minute or more on 2 cores): nightly
def test_the_activations_chapter_quotes_the_measured_bytes_and_says_how_they_were_measured(
        handbook: dict[str, Any]) -> None:
    measured = json.loads(Path(handbook["json"]["runs"]["activations"]["report"]).read_text())
    said = text(handbook, "activations")
    assert "mallinfo2" in said and "tracemalloc" in said
    assert measured["segments"]["held_after_forward_bytes"] < measured["none"]["held_after_forward_bytes"]
    assert "chapter pipeline counts them on real stage processes" in said
