"""Verdicts, their three-valued composition, and evidence formatting."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

Validity = bool | Literal["unknown"]
UNKNOWN: Literal["unknown"] = "unknown"

# Evidence is for a human reading a failure report: the first few pieces say
# where to look; the counts say how much there is.
MAX_EVIDENCE = 10


@dataclass(frozen=True)
class Verdict:
    """What one checker concluded about one run."""

    name: str
    valid: Validity
    summary: str
    counts: dict[str, int] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "summary": self.summary,
            "counts": dict(self.counts),
            "evidence": list(self.evidence),
        }


def compose(values: Iterable[Validity]) -> Validity:
    """false > unknown > true: one violation is enough to fail, and a pass
    needs every part to pass. Nothing at all to compose is no evidence."""
    seen_any = False
    unknown = False
    for value in values:
        seen_any = True
        if value is False:
            return False
        if value != True:  # noqa: E712 - "unknown" and anything odd
            unknown = True
    if not seen_any or unknown:
        return UNKNOWN
    return True


EXIT_VALID, EXIT_INVALID, EXIT_UNKNOWN = 0, 1, 2
"""The exit codes of every command (docs/DESIGN.md): valid, invalid, not judged."""
WORDS: dict[bool, str] = {True: "VALID", False: "INVALID"}
"""How a validity is written for people; anything but a bool is UNKNOWN."""


def verdict_word(valid: object) -> str:
    """VALID, INVALID or UNKNOWN: the one spelling of a validity in every output."""
    return WORDS[valid] if isinstance(valid, bool) else "UNKNOWN"


def overall_word(valid: object, interrupted: object = None) -> str:
    """The word for a whole run: INTERRUPTED when the harness was stopped (SIGINT, SIGTERM) before the
    job ended, whatever its verdicts say (an exit 2, never INVALID); else verdict_word."""
    return "INTERRUPTED" if interrupted else verdict_word(valid)


def word_validity(word: str) -> Validity:
    """The validity a word stands for (the inverse of verdict_word)."""
    return {"VALID": True, "INVALID": False}.get(word, UNKNOWN)


def exit_code(valid: object) -> int:
    """0 valid, 1 invalid, 2 unknown: the contract's exit code for a validity."""
    if isinstance(valid, bool):
        return EXIT_VALID if valid else EXIT_INVALID
    return EXIT_UNKNOWN


def check_safe(
    name: str, checker: Callable[..., Verdict], *args: Any, **kwargs: Any
) -> Verdict:
    """Run a checker; a crash is "unknown" - a checker that could not finish
    has not shown anything, so it must never read as a pass."""
    try:
        verdict = checker(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any crash becomes "unknown"
        return Verdict(
            name=name,
            valid=UNKNOWN,
            summary=f"checker crashed: {type(exc).__name__}: {exc}",
        )
    if not isinstance(verdict, Verdict):
        return Verdict(name, UNKNOWN, f"checker returned {type(verdict).__name__}, not a Verdict")
    return verdict


def intervals(ids: Iterable[int], limit: int = 20) -> str:
    """Sample ids as compact intervals: [3, 4, 5, 9] -> "3-5,9".

    Long lists are cut after `limit` intervals with a "(+N more ids)" tail so
    that one bad epoch cannot flood a report."""
    ordered = sorted(set(ids))
    parts: list[str] = []
    shown = 0
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if len(parts) == limit:
            break
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        shown = j + 1
        i = j + 1
    text = ",".join(parts)
    if shown < len(ordered):
        text += f" (+{len(ordered) - shown} more ids)"
    return text


def absent_intervals(present: Iterable[int], size: int, limit: int = 20) -> str:
    """The ids of 0..size-1 not in `present`, as intervals ("0-2,7"), in time and memory
    proportional to `present`, not to `size` (a dataset can be huge)."""
    parts: list[str] = []
    missing = 0
    nxt = 0
    for x in sorted(x for x in set(present) if 0 <= x < size) + [size]:
        if x > nxt:
            missing += x - nxt
            if len(parts) < limit:
                parts.append(str(nxt) if x - nxt == 1 else f"{nxt}-{x - 1}")
        nxt = x + 1
    shown = sum(1 if "-" not in p else int(p.split("-")[1]) - int(p.split("-")[0]) + 1 for p in parts)
    return ",".join(parts) + (f" (+{missing - shown} more ids)" if missing > shown else "")


class Evidence:
    """Collects evidence lines, keeping the first MAX_EVIDENCE and counting all."""

    def __init__(self, limit: int = MAX_EVIDENCE) -> None:
        self.lines: list[str] = []
        self.total = 0
        self._limit = limit

    def add(self, line: str) -> None:
        self.total += 1
        if len(self.lines) < self._limit:
            self.lines.append(line)

    def __bool__(self) -> bool:
        return self.total > 0

    def listing(self) -> list[str]:
        if self.total > len(self.lines):
            return self.lines + [f"... and {self.total - len(self.lines)} more"]
        return list(self.lines)
