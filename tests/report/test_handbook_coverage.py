"""docs/HANDBOOK.md's coverage table (seed question -> chapter, runs, test) says only what the handbook runs.

A row is a promise that `trainwreck handbook` answers the question with those runs: its chapter must
be declared, each run must be one that chapter quotes (so `cases_for` runs it and the page lists it),
and the test that holds the answer must exist. Reads declarations only; runs nothing.
"""
from __future__ import annotations

import re
from pathlib import Path

from trainwreck.harness.suites.handbook import CASES, CHAPTERS, cases_for, default_chapters, get_chapter

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "HANDBOOK.md"


def coverage_rows(text: str) -> list[dict[str, object]]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("seed", "---") or not re.fullmatch(r"\d{3}", cells[0]):
            continue
        rows.append({"seed": cells[0], "question": cells[1], "chapter": cells[2],
                     "runs": re.findall(r"`([^`]+)`", cells[3]), "test": cells[4].strip("`")})
    return rows


def problems(rows: list[dict[str, object]], tests_source: str) -> list[str]:
    found = []
    for row in rows:
        slugs = {c.slug for c in CHAPTERS}
        if row["chapter"] not in slugs:
            found.append(f"{row['question']}: chapter {row['chapter']!r} is not in CHAPTERS")
            continue
        chapter = get_chapter(str(row["chapter"]))
        ran = {c.key for c in cases_for([chapter])}
        found += [f"{row['question']}: run {r!r} is not run by chapter {chapter.slug}"
                  for r in row["runs"] if r not in chapter.runs or r not in ran]  # type: ignore[union-attr]
        if not row["runs"]:
            found.append(f"{row['question']}: names no run")
        if f"def {row['test']}(" not in tests_source:
            found.append(f"{row['question']}: test {row['test']!r} does not exist")
    return found


def _tests_source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("test_*.py"))


def test_every_row_of_the_coverage_table_names_a_chapter_its_runs_and_a_test_that_exist() -> None:
    rows = coverage_rows(DOC.read_text(encoding="utf-8"))
    assert len(rows) >= 15, "the coverage table was not parsed"
    assert problems(rows, _tests_source()) == []


def test_every_chapter_appears_in_the_coverage_table() -> None:
    listed = {r["chapter"] for r in coverage_rows(DOC.read_text(encoding="utf-8"))}
    assert {c.slug for c in CHAPTERS} <= listed


def test_the_coverage_check_fails_on_a_run_chapter_or_test_that_does_not_exist() -> None:
    rows = coverage_rows(DOC.read_text(encoding="utf-8"))
    source = _tests_source()
    comm = next(r for r in rows if r["chapter"] == "comm")
    assert problems([{**comm, "runs": ["allreduce-cost", "bytes-ddp"]}], source)  # a run of another chapter
    assert problems([{**comm, "runs": ["no-such-run"]}], source)
    assert problems([{**comm, "chapter": "no-such-chapter"}], source)
    assert problems([{**comm, "test": "test_that_was_never_written"}], source)
    assert problems([comm], source) == []
    assert "allreduce-cost" in {c.key for c in CASES}


ISSUE_25_ITEMS = 11


def item_rows(text: str) -> dict[int, list[str]]:
    """Issue 25's item table: item number -> the chapters named for it."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"\d{1,2}", cells[0]):
            rows[int(cells[0])] = [c.strip() for c in cells[2].split(",")]
    return rows


def test_every_item_of_issue_25_names_chapters_that_exist_and_have_a_coverage_row() -> None:
    text = DOC.read_text(encoding="utf-8")
    items = item_rows(text)
    assert sorted(items) == list(range(1, ISSUE_25_ITEMS + 1))
    covered = {r["chapter"] for r in coverage_rows(text)}
    slugs = {c.slug for c in CHAPTERS}
    assert [(n, c) for n, chapters in items.items() for c in chapters if c not in slugs or c not in covered] == []


def test_the_item_tables_default_sentence_names_exactly_its_default_chapters() -> None:
    text = DOC.read_text(encoding="utf-8")
    named = {c for chapters in item_rows(text).values() for c in chapters}
    default = sorted(named & {c.slug for c in default_chapters()})
    sentence = re.search(r"Of the chapters above, (.+?) (?:is|are) in the\s+default handbook", text)
    assert sentence, "the sentence saying which chapters are in the default handbook is missing"
    assert sorted(re.findall(r"`([^`]+)`", sentence.group(1))) == default
