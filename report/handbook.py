"""The handbook's page: chapters whose every sentence is a claim over the runs' reports.

harness/suites/handbook.py runs the cases (its data: scenarios, plans, defects, benchmark jobs);
this module turns their report.json files into chapters and writes the page. A chapter is a
declaration (`Chapter`: a question, the runs it quotes, an answer function, its plots); an
answer function returns paragraphs of claims made through `Evidence`: a number only through
`Evidence.q` (the report field it came from, shown as the number's tooltip) or
`Evidence.derive` (the formula and its inputs), a sentence only through `Evidence.s`, which
records its template, facts and presumptions (report/claims.py) in handbook.json
and renders it only when they hold.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from html import escape, unescape
from pathlib import Path
from typing import Any, Callable, Sequence

from trainwreck.report.claims import F, Claim, Claims, Presume
from trainwreck.invariants.verdict import verdict_word
from trainwreck.rundir.layout import MEASUREMENT_FORMAT, RunDir


def fmt(value: Any) -> str:
    """One spelling of a quoted value, used by the text and by the tests that find it there."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return verdict_word(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1 else f"{value:,.1f}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def claim_html(text: str, source: str) -> str:
    return f'<b class="claim" title="{escape(source)}">{escape(text)}</b>'


def source_file(report: dict[str, Any]) -> str:
    """The file a claim's number was read from, as the page's tooltip names it."""
    paths = RunDir(Path())
    return (paths.measurement_json if report.get("format") == MEASUREMENT_FORMAT else paths.report_file("report.json")).name


Paragraph = list[Claim]


@dataclass
class Evidence:
    """The runs' reports and what a chapter says about them: its sentences (claims), the numbers
    they quote (run, field, value) and the numbers derived from those (formula, inputs)."""

    reports: dict[str, dict[str, Any]]
    slug: str = ""
    claims: list[dict[str, Any]] = field(default_factory=list)
    """Quoted numbers of rendered sentences: {run, path, value} (the page's tooltips)."""
    derived: list[dict[str, Any]] = field(default_factory=list)
    sentences: list[Claim] = field(default_factory=list)
    facts: dict[str, tuple[Any, str, str, dict[str, Any] | None]] = field(default_factory=dict)
    """Placeholder -> (value, unit, tooltip, quote or None)."""

    def get(self, run: str, *path: str | int) -> Any:
        """A report.json value for a computation; a sentence that shows it quotes it with q()."""
        value: Any = self.reports[run]
        for part in path:
            value = value[part]
        return value

    def q(self, run: str, *path: str | int, unit: str = "") -> str:
        """A placeholder for the value at `path` of run's report, for a sentence made with s()."""
        value = self.get(run, *path)
        name = f"f{len(self.facts)}"
        tooltip = f"{run}: {source_file(self.reports[run])} {'.'.join(map(str, path))}"
        self.facts[name] = (value, unit, tooltip, {"run": run, "path": list(path), "value": value})
        return "{" + name + "}"

    def derive(self, label: str, value: float, formula: str, inputs: dict[str, float], unit: str = "") -> str:
        """A placeholder for a number computed from quoted ones (say, the Young/Daly interval)."""
        name = f"f{len(self.facts)}"
        self.facts[name] = (value, unit, f"{label} = {formula}", None)
        self.derived.append({"label": label, "value": value, "formula": formula, "inputs": inputs})
        return "{" + name + "}"

    def s(self, template: str, *presumes: Presume) -> Claim:
        """One sentence: `template` with q()/derive() placeholders, rendered when `presumes` hold."""
        say = Claims(reports=dict(self.reports))
        names = re.findall(r"\{(f\d+)\}", template)
        sourced = {n: F(".".join(map(str, self.facts[n][3]["path"])), self.facts[n][3]["run"])
                   for n in names if self.facts[n][3] is not None}
        plain = {n: self.facts[n][0] for n in names if n not in sourced}
        claim = say(f"{self.slug}.{len(self.sentences)}", template, *presumes, **sourced, **plain)
        for n in names:  # the sourced value as quoted, even where the path walks a list
            claim.facts[n] = self.facts[n][0]
        self.sentences.append(claim)
        if claim.rendered:
            self.claims.extend(self.facts[n][3] for n in names if self.facts[n][3] is not None)
        return claim

    def html(self, claim: Claim) -> str:
        return claim.render(fmt, lambda name, text: claim_html(text + self.facts[name][1], self.facts[name][2]))


@dataclass(frozen=True)
class Chapter:
    slug: str
    question: str
    runs: tuple[str, ...]
    """Case keys the chapter quotes, in the order it shows them."""
    answer: Callable[[Evidence], list[Paragraph]]
    """Paragraphs of claims built from the evidence; a paragraph whose claims all fail is left out."""
    plots: tuple[tuple[str, str], ...] = ()
    """(case key, plot name in report.plots.PLOTS) shown under the answer."""
    list_paragraphs: tuple[int, ...] = ()
    """Paragraphs drawn as a bulleted list, one claim an item."""
    full: bool = False
    """True: an expensive chapter that only `trainwreck handbook --full` (or --chapters) runs, so the
    default handbook stays within its time budget."""


def unusable_because(report: dict[str, Any] | None) -> str:
    """Why a run cannot answer: no report at all, or one that says the run could not be judged (an
    INVALID run is usable: its verdicts are the answer)."""
    if report is None:
        return "produced no report"
    return f"has no verdicts to quote ({report.get('error') or 'neither judged nor measured'})"


def usable(report: dict[str, Any] | None) -> bool:
    """A judged run's report.json without an error, or a finished measurement."""
    if report is None:
        return False
    return report.get("format") == MEASUREMENT_FORMAT or ("verdicts" in report and not report.get("error"))


def build_chapter(chapter: Chapter, reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The chapter's paragraphs (HTML), its sentences as claims, and the numbers they quote; a run
    without a report, or a number the runs lack, leaves it unanswered, saying which."""
    base = {"slug": chapter.slug, "question": chapter.question, "runs": list(chapter.runs), "full": chapter.full}
    missing = [k for k in chapter.runs if not usable(reports.get(k))]
    if missing:
        why = "; ".join(f"{k} {unusable_because(reports.get(k))}" for k in missing)
        return {**base, "paragraphs": [escape(f"Not answered: {why}.")],
                "claims": [], "derived": [], "sentences": [], "answered": False}
    evidence = Evidence(reports, chapter.slug)
    try:
        paragraphs = chapter.answer(evidence)
    except (KeyError, IndexError, TypeError, ZeroDivisionError, StopIteration) as exc:  # a run did not show it
        return {**base, "paragraphs": [f"Not answered: the runs lack a number this answer quotes "
                                       f"({type(exc).__name__}: {escape(str(exc))}); see their reports."],
                "claims": [], "derived": [], "sentences": [], "answered": False}
    html = []
    for i, para in enumerate(paragraphs):
        shown = [evidence.html(c) for c in para if c.rendered]
        if shown and i in chapter.list_paragraphs:
            html.append("<ul>" + "".join(f"<li>{s}</li>" for s in shown) + "</ul>")
        elif shown:
            html.append(" ".join(shown))
    return {**base, "paragraphs": html, "claims": evidence.claims, "derived": evidence.derived,
            "sentences": [{**c.to_json(), "text": evidence.html(c) if c.rendered else None}
                          for c in evidence.sentences], "answered": bool(html)}


def sentence_text(claim: dict[str, Any]) -> str:
    """A handbook sentence as plain text (tags stripped), as the truth test compares it with the page."""
    return unescape(re.sub(r"<[^>]+>", "", claim["text"] or ""))


# ----- the page ----------------------------------------------------------------------------------

EXTRA_CSS = """
.badge.CAUGHT { background: #7c3aed; } .badge.MISSED { background: #dc2626; }
.badge.MEASURED { background: #0e7490; }
.chapter { border-top: 1px solid #e5e7eb; margin-top: 28px; padding-top: 4px; }
.claim { background: #eef2ff; padding: 0 3px; border-radius: 3px; font-weight: 600; }
figure { margin: 12px 0; } figure svg { max-width: 100%; height: auto; border: 1px solid #e5e7eb; }
figcaption { font-size: 12px; color: #6b7280; }
.runs li { margin: 4px 0; } code.repro { font-size: 11px; word-break: break-all; color: #374151; }
.page.yes { color: #fff; background: #dc2626; padding: 0 4px; border-radius: 3px; font-weight: 700; }
.page.no { color: #166534; font-weight: 600; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; } .plots figure { flex: 1 1 420px; }
"""


@dataclass(frozen=True)
class RunRow:
    """One run as the page shows it (harness/suites/handbook.py fills it from a case and its result)."""

    key: str
    kind: str
    name: str
    status: str
    expect: str
    passed: bool
    summary: str
    reproduce: str
    run_dir: Path
    link: Path
    """The report.html (or a measurement's measurement.json) the page links to."""
    report: Path
    bug: str | None = None
    invariant: str | None = None
    control_valid: bool | None = None


def page_word(rows: Sequence[RunRow], chapters: list[dict[str, Any]]) -> str:
    """VALID when every reference run is as expected, every defect caught and every chapter answered;
    UNKNOWN when something could not be judged; INVALID otherwise."""
    if all(r.passed for r in rows) and all(c["answered"] for c in chapters):
        return "VALID"
    unjudged = any(r.status == "UNKNOWN" for r in rows) or not all(c["answered"] for c in chapters)
    return "UNKNOWN" if unjudged else "INVALID"


def render_handbook(out: Path, rows: Sequence[RunRow], chapters: list[dict[str, Any]],
                    plots: dict[tuple[str, str], str], wall_s: float,
                    chapter_plots: dict[str, tuple[tuple[str, str], ...]],
                    not_answered: Sequence[tuple[str, str]] = ()) -> Path:
    """Write OUT/index.html and OUT/handbook.json (the claims, machine-readable); return index.html."""
    from trainwreck.report.html import CSS  # the reports' look, so a click feels like one site

    out.mkdir(parents=True, exist_ok=True)
    by_key = {r.key: r for r in rows}
    links = {r.key: _rel(out, r.link) for r in rows}
    word = page_word(rows, chapters)
    caught = [r for r in rows if r.kind == "defect"]
    reference = [r for r in rows if r.kind != "defect"]
    headline = _headline(caught, reference, chapters, wall_s)
    body = [f'<header><span class="badge {word}">{word}</span><h1>trainwreck handbook</h1>'
            f'<p class="headline {word}">{escape(headline)}</p></header>',
            "<h2>Questions</h2><ol>" + "".join(f'<li><a href="#{c["slug"]}">{escape(c["question"])}</a>'
                                               + (" <em>(--full)</em>" if c.get("full") else "") + "</li>"
                                               for c in chapters) + "</ol>"]
    # The caught broken trainers come first, in their own table: a failure shown as what it is.
    body.append(_caught_table(caught, links) + _reference_table(reference, links))
    body += [_chapter_html(c, by_key, links, plots, chapter_plots.get(c["slug"], ())) for c in chapters]
    body.append(_not_answered_html(not_answered))
    html = out / "index.html"
    html.write_text(f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
                    f'content="width=device-width, initial-scale=1"><title>trainwreck handbook</title><style>{CSS}'
                    f'{EXTRA_CSS}</style></head>\n<body><main data-verdict="{word}">' + "\n".join(body)
                    + "</main></body></html>\n", encoding="utf-8")
    record = {"format": "trainwreck-handbook/1", "valid": word, "wall_s": round(wall_s, 2), "chapters": chapters,
              "runs": {r.key: {"kind": r.kind, "name": r.name, "status": r.status, "expect": r.expect,
                               "passed": r.passed, "run_dir": str(r.run_dir), "report": str(r.report),
                               "reproduce": r.reproduce, "control_valid": r.control_valid, "invariant": r.invariant}
                       for r in rows},
              "plots": [{"run": k, "plot": n, "file": p} for (k, n), p in plots.items()]}
    (out / "handbook.json").write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    (out / "index.md").write_text(handbook_markdown(word, headline, chapters, rows, links), encoding="utf-8")
    return html


def _headline(caught: Sequence[RunRow], reference: Sequence[RunRow], chapters: list[dict[str, Any]],
              wall_s: float) -> str:
    return (f"{len(chapters)} questions answered by {len(caught) + len(reference)} runs made on the spot in {wall_s:.0f} s: "
            f"{sum(r.passed for r in reference)}/{len(reference)} reference-trainer runs judged as expected "
            f"({sum(r.status == 'VALID' for r in reference)} VALID, "
            f"{sum(r.status == 'INVALID' and r.passed for r in reference)} INVALID by design, "
            f"{sum(r.status == 'MEASURED' for r in reference)} benchmark measurements), "
            f"{sum(r.status == 'CAUGHT' for r in caught)}/{len(caught)} planted broken trainers caught. A broken "
            "trainer that trainwreck catches is the suite passing.")


def handbook_markdown(word: str, headline: str, chapters: list[dict[str, Any]], rows: Sequence[RunRow],
                      links: dict[str, str]) -> str:
    """OUT/index.md: the same page as text, for a terminal, a diff or a pull request; each chapter's
    paragraphs are the HTML's with the markup taken out, so both say the same sentences."""
    out = [f"# trainwreck handbook: {word}", "", headline, ""]
    for n, c in enumerate(chapters, 1):
        out += [f"## {n}. {c['question']}" + (" (--full)" if c.get("full") else ""), ""]
        out += [unescape(re.sub(r"<[^>]+>", "", para)) + "\n" for para in c["paragraphs"]]
    out += ["## Runs", "", "| run | what | status | report |", "|---|---|---|---|"]
    out += [f"| {r.key} | {r.name} | {r.status} | {links[r.key]} |" for r in rows]
    return "\n".join(out) + "\n"


def _rel(out: Path, path: Path) -> str:
    return os.path.relpath(path, out).replace(os.sep, "/")


def _run_item(row: RunRow, link: str) -> str:
    return (f'<li><span class="badge {row.status}">{row.status}</span> <a href="{escape(link)}">'
            f"{escape(row.key)}</a>: {escape(row.summary)}<br><code class=repro>"
            f"{escape(row.reproduce)}</code></li>")


def _chapter_html(chapter: dict[str, Any], rows: dict[str, RunRow], links: dict[str, str],
                  plots: dict[tuple[str, str], str], wanted: tuple[tuple[str, str], ...]) -> str:
    figures = "".join(
        f'<figure>{(Path(path).read_text(encoding="utf-8"))}<figcaption>{escape(name)} of '
        f'<a href="{escape(links[key])}">{escape(key)}</a> ({rows[key].status})</figcaption></figure>'
        for (key, name), path in plots.items() if (key, name) in wanted)
    runs = "".join(_run_item(rows[k], links[k]) for k in chapter["runs"] if k in rows)
    return (f'<section class="chapter" id="{escape(chapter["slug"])}"><h2>{escape(chapter["question"])}</h2>'
            + "".join(p if p.startswith("<ul>") else f"<p>{p}</p>" for p in chapter["paragraphs"])
            + (f'<div class="plots">{figures}</div>' if figures else "")
            + f'<h3>Runs</h3><ul class="runs">{runs}</ul></section>')


def _caught_table(caught: list[RunRow], links: dict[str, str]) -> str:
    if not caught:
        return ""
    rows = "".join(
        f'<tr><td><a href="{escape(links[r.key])}">{escape(r.name)}</a></td>'
        f"<td>{escape(r.bug or '?')}</td><td>{escape(r.invariant or '?')}</td>"
        f'<td><span class="badge {r.status}">{r.status}</span></td>'
        f'<td>{"control VALID" if r.control_valid else "control NOT valid"}</td>'
        f"<td><code class=repro>{escape(r.reproduce)}</code></td></tr>" for r in caught)
    return ("<h2>Broken trainers, caught</h2><p>Planted defects from <code>trainwreck defects</code>. CAUGHT means the "
            "named invariant judged the broken run invalid, every planned fault fired, and the reference trainer "
            "passed the same scenario.</p><table><thead><tr><th>defect</th><th>bug</th><th>invariant</th>"
            f"<th>status</th><th>control</th><th>reproduce</th></tr></thead><tbody>{rows}</tbody></table>")


def _reference_table(reference: list[RunRow], links: dict[str, str]) -> str:
    rows = "".join(f'<tr><td><a href="{escape(links[r.key])}">{escape(r.key)}</a></td>'
                   f'<td><span class="badge {r.status}">{r.status}</span></td><td>{r.expect}'
                   f'{"" if r.passed else " (NOT as expected)"}</td><td>{escape(r.summary)}</td>'
                   f"<td><code class=repro>{escape(r.reproduce)}</code></td></tr>" for r in reference)
    return ("<h2>Reference runs</h2><p>The correct trainer under faults. A job that cannot make progress must be "
            "judged INVALID: that verdict is the expected one for it. MEASURED rows are benchmark jobs "
            "(benchmarks/fsdp.py), quoted for what a rank holds, not judged.</p><table><thead><tr><th>run</th><th>verdict"
            "</th><th>expected</th><th>what happens</th><th>reproduce</th></tr></thead><tbody>"
            f"{rows}</tbody></table>")


def _not_answered_html(not_answered: Sequence[tuple[str, str]]) -> str:
    if not not_answered:
        return ""
    return "<h2>Not answered yet</h2><ul>" + "".join(
        f"<li><strong>{escape(q)}</strong> {escape(why)}</li>" for q, why in not_answered) + "</ul>"
