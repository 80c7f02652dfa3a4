"""Invariant checkers over trainwreck run directories (format `trainwreck-run/1`).

Standard library only: the checkers judge any trainer that writes the format,
without torch. `load_history` reads a run directory; each `check_*` is a pure
function from a History (and an optional golden History) to a three-valued
`Verdict`; `judge` runs them all and composes false > unknown > true.

    from trainwreck.invariants import load_history, judge
    judgement = judge(load_history("runs/r1"), golden=load_history("runs/golden"))
    judgement.valid   # True, False or "unknown"

The rules, evidence and tolerances are documented in docs/INVARIANTS.md.
"""

from trainwreck.invariants.atomicity import check_atomicity
from trainwreck.invariants.continuity import check_continuity
from trainwreck.invariants.coverage import check_coverage
from trainwreck.invariants.hang import check_hang
from trainwreck.invariants.history import FORMAT, History, InputError, RankLog
from trainwreck.invariants.loader import load_history
from trainwreck.invariants.judge import CHECKERS, Judgement, judge
from trainwreck.invariants.lineage import Lineage, Segment, walk_lineage
from trainwreck.invariants.progress import check_progress
from trainwreck.invariants.replicas import check_replicas
from trainwreck.invariants.verdict import (EXIT_INVALID, EXIT_UNKNOWN, EXIT_VALID, UNKNOWN, Verdict, check_safe,
                                           compose, exit_code, intervals, verdict_word, word_validity)

__all__ = [
    "EXIT_INVALID",
    "EXIT_UNKNOWN",
    "EXIT_VALID",
    "CHECKERS",
    "FORMAT",
    "UNKNOWN",
    "History",
    "InputError",
    "Judgement",
    "Lineage",
    "RankLog",
    "Segment",
    "Verdict",
    "check_atomicity",
    "check_continuity",
    "check_coverage",
    "check_hang",
    "check_progress",
    "check_replicas",
    "check_safe",
    "compose",
    "exit_code",
    "intervals",
    "judge",
    "load_history",
    "verdict_word",
    "walk_lineage",
    "word_validity",
]
