"""Claims: every sentence a report or the handbook prints, as data that a test can re-derive.

A report used to build its prose with f-strings, so a sentence could quote true numbers and
still say something the run contradicts ("each lineage step matches the golden run" under an
INVALID continuity verdict). Here a sentence is a `Claim`: a text template, the facts it
fills in (each with the report field it came from, when it came from one) and what it
presumes (verdicts, or facts such as "no restore digest differs"). A claim whose presumption
does not hold against its report is recorded but not rendered, so the words can only say
what the verdicts and the events say. report.json and handbook.json hold every claim;
tests/report/test_truth.py re-derives them.

    say = Claims(report)
    say("resume.golden", "Each of the {n} lineage steps matches the golden run.",
        verdict("continuity"), n=F("verdicts.continuity.counts.golden_steps_checked"))
    text = say.text("resume")     # the rendered sentences of one section, joined
"""
from __future__ import annotations

import operator
import re
import string
from dataclasses import dataclass, field
from typing import Any, Callable

OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "in": lambda a, b: a in b, "not in": lambda a, b: a not in b, "contains": lambda a, b: b in a,
}
MISSING = object()


def resolve(data: Any, path: str) -> Any:
    """The value at a dotted path ("verdicts.coverage.counts.epochs", "hangs.0.ranks"); MISSING if absent."""
    value = data
    for part in path.split(".") if path else []:
        if isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return MISSING
    return value


@dataclass(frozen=True)
class Presume:
    """What a claim takes for granted: the value at `path` of a report compares with `value` by `op`.
    `run` names the report in a handbook (None: the report the claim is in)."""

    path: str
    op: str
    value: Any
    run: str | None = None

    def holds(self, reports: dict[str | None, Any]) -> bool:
        actual = resolve(reports.get(self.run), self.path)
        if self.op == "empty":
            return actual is MISSING or not actual
        if actual is MISSING:
            return False
        try:
            return bool(OPS[self.op](actual, self.value))
        except TypeError:
            return False

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "op": self.op, "value": self.value, **({"run": self.run} if self.run else {})}

    def __str__(self) -> str:
        return f"{self.run + ': ' if self.run else ''}{self.path} {self.op} {self.value!r}"


def verdict(name: str, valid: bool | str = True, run: str | None = None) -> Presume:
    """The claim presumes invariant `name` was judged `valid` (True, False or "unknown")."""
    return Presume(f"verdicts.{name}.valid", "==", valid, run)


def fact(path: str, op: str, value: Any, run: str | None = None) -> Presume:
    return Presume(path, op, value, run)


@dataclass(frozen=True)
class F:
    """A fact read from a report field: the claim records the path, the truth test reads it back."""

    path: str
    run: str | None = None


@dataclass
class Claim:
    key: str
    template: str
    facts: dict[str, Any]
    sources: dict[str, str]
    presumes: tuple[Presume, ...]
    rendered: bool
    failed: list[str] = field(default_factory=list)

    def render(self, fmt: Callable[[Any], str] = str,
               wrap: Callable[[str, str], str] = lambda name, text: text) -> str:
        """The template filled in: a field with a format spec uses it, one without uses `fmt`; `wrap`
        marks each filled-in fact (the handbook highlights them, with their source as a tooltip)."""
        out = []
        for literal, name, spec, conv in string.Formatter().parse(self.template):
            out.append(literal)
            if name is None:
                continue
            value = self.facts[name]
            if conv:
                value = {"r": repr, "s": str, "a": ascii}[conv](value)
            out.append(wrap(name, format(value, spec) if spec and value is not None else fmt(value)))
        return "".join(out)

    @property
    def text(self) -> str:
        return self.render()

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "template": self.template, "facts": self.facts, "sources": self.sources,
                "presumes": [p.to_json() for p in self.presumes], "rendered": self.rendered,
                "text": self.text if self.rendered else None,
                **({"failed": self.failed} if self.failed else {})}


class Claims:
    """The claims of one report (or one handbook chapter), in the order they were made.

    `reports` maps a run name (None: this report) to its report dict; facts given as F(path)
    are read from it and presumptions are checked against it when the claim is made."""

    def __init__(self, report: dict[str, Any] | None = None, reports: dict[str | None, Any] | None = None):
        self.reports: dict[str | None, Any] = dict(reports or {})
        if report is not None:
            self.reports[None] = report
        self.made: list[tuple[str, Claim]] = []
        self.section = ""

    def __call__(self, key: str, template: str, *presumes: Presume, **facts: Any) -> Claim:
        values, sources = {}, {}
        for name, value in facts.items():
            if isinstance(value, F):
                sources[name] = (f"{value.run}: " if value.run else "") + value.path
                value = resolve(self.reports.get(value.run), value.path)
                if value is MISSING:
                    value = None
                    presumes = (*presumes, Presume(sources[name].split(": ")[-1], "!=", None, _run_of(sources[name])))
            values[name] = value
        failed = [str(p) for p in presumes if not p.holds(self.reports)]
        claim = Claim(key, template, values, sources, tuple(presumes), not failed, failed)
        self.made.append((self.section, claim))
        return claim

    def of(self, section: str) -> list[Claim]:
        return [c for s, c in self.made if s == section]

    def text(self, section: str) -> str:
        return " ".join(c.text for c in self.of(section) if c.rendered)

    def to_json(self) -> list[dict[str, Any]]:
        return [{"section": s, **c.to_json()} for s, c in self.made]


def _run_of(source: str) -> str | None:
    return source.split(": ")[0] if ": " in source else None


def claim_from_json(data: dict[str, Any]) -> Claim:
    presumes = tuple(Presume(p["path"], p["op"], p["value"], p.get("run")) for p in data["presumes"])
    return Claim(data["key"], data["template"], dict(data["facts"]), dict(data["sources"]), presumes,
                 bool(data["rendered"]), list(data.get("failed", [])))


def template_pattern(template: str) -> re.Pattern[str]:
    """A regex that finds the template's sentence in any rendered text, whatever its facts were:
    how the truth test reads a report that recorded no claims (one written before they existed)."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(r".{0,200}?")
    return re.compile("".join(parts), re.S)
