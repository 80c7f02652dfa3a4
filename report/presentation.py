"""How a report shows each invariant, declared once and keyed by the checker's name.

A checker (invariants/judge.py CHECKERS, and the replica-group ones) becomes prose in several
places: the interview topic its violation raises, what that violation costs in production,
where it sits in a casebook row, the facts drawn from its evidence and the claims that name
its root cause. The first three are declared here; the last two are functions keyed by the
same names (facts.py FACTS, violation_cause.py CAUSES). tests/report/test_presentation.py fails when a
checker has no declaration, or a keyed function names an invariant that has none.

A verdict of an invariant not declared here (a run judged by another tool) is still shown,
after the declared ones, with a generic cost: a report never fails on a name it does not know.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Presentation:
    topic: str
    """The interview topic a violation raises (report/angles.py QUESTIONS key)."""
    cost: str
    """What a violation costs in production: one lower-case clause, no final stop."""


PRESENTATIONS: dict[str, Presentation] = {  # in the order reports and casebooks list them
    "coverage": Presentation("resume", "samples were trained twice or never: the model silently saw a different "
                                       "data distribution, and no loss curve shows it"),
    "continuity": Presentation("resume", "the resumed run is not the run that was saved: its state or its "
                                         "trajectory left the one an uninterrupted run takes"),
    "atomicity": Presentation("silent", "a checkpoint that was not (or no longer) intact was loaded, or an intact "
                                        "newer one was skipped and its work thrown away"),
    "hang": Presentation("hang", "a hung rank went unnoticed, or the watchdog blamed the wrong rank or a healthy job"),
    "replicas": Presentation("silent", "DDP replicas diverged: each rank now trains its own model while the job "
                                       "looks healthy"),
    "progress": Presentation("frequency", "the job did not finish within its restart budget"),
}
UNDECLARED_COST = "the run broke an invariant"
"""The cost said of a violated invariant this module does not declare (another tool's)."""


def cost_of(name: str) -> str:
    declared = PRESENTATIONS.get(name)
    return declared.cost if declared else UNDECLARED_COST


def ordered(verdicts: dict[str, Any]) -> list[tuple[str, Any]]:
    """The verdicts in the declared order, then any undeclared ones in the order they came."""
    known = [(n, verdicts[n]) for n in PRESENTATIONS if n in verdicts]
    return known + [(n, v) for n, v in verdicts.items() if n not in PRESENTATIONS]
