"""Each invariant's presentation is declared once (report/presentation.py), and every table that
knows an invariant by name is tied to the checkers here, so a new checker cannot go unshown."""
from __future__ import annotations

import pytest

from trainwreck.invariants.judge import CHECKERS
from trainwreck.invariants.replica_groups import REPLICA_CHECKERS
from trainwreck.report.angles import QUESTIONS
from trainwreck.report.violation_cause import CAUSES
from trainwreck.report.facts import FACTS
from trainwreck.report.presentation import PRESENTATIONS, UNDECLARED_COST, cost_of, ordered

CHECKED = set(CHECKERS) | set(REPLICA_CHECKERS)


def undeclared(names: set[str]) -> set[str]:
    return names - set(PRESENTATIONS)


def test_every_checker_has_a_presentation_and_every_presentation_a_checker() -> None:
    assert undeclared(CHECKED) == set()
    assert set(PRESENTATIONS) <= CHECKED


def test_a_checker_added_without_a_presentation_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CHECKERS, "monotonic_lr", lambda history: None)
    assert undeclared(set(CHECKERS) | set(REPLICA_CHECKERS)) == {"monotonic_lr"}


@pytest.mark.parametrize("table", [CAUSES, FACTS], ids=["root-cause claims", "facts"])
def test_every_keyed_table_names_only_declared_invariants(table: dict) -> None:
    assert set(table) <= set(PRESENTATIONS)


def test_every_declared_topic_is_an_interview_question() -> None:
    assert {p.topic for p in PRESENTATIONS.values()} <= set(QUESTIONS)


def test_an_invariant_of_another_tool_is_listed_last_with_the_generic_cost() -> None:
    verdicts = {"theirs": {}, "hang": {}, "coverage": {}}
    assert [name for name, _ in ordered(verdicts)] == ["coverage", "hang", "theirs"]
    assert cost_of("theirs") == UNDECLARED_COST and cost_of("hang") != UNDECLARED_COST


def test_every_plot_has_a_caption_and_every_caption_a_plot() -> None:
    from trainwreck.report.html import PLOT_CAPTIONS
    from trainwreck.report.plots import PLOTS

    assert set(PLOT_CAPTIONS) == set(PLOTS)
