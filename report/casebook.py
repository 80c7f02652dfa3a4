"""The casebook: one index page over many runs (a demo, a chaos session, a sweep).

Each row is a case: its verdict, what happened in one sentence, and a link to its
report. Above the table, the interview questions the cases answer, each linking
to the runs that answer it, so the casebook reads as a study guide too. When the
runs came from a cluster (run.json's "node", written by harness/suites/engines.py), a
line counts the cases and their verdicts per node, so a node that judges
differently from the others shows.
"""
from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any

from trainwreck.report.html import CSS
from trainwreck.report.model import NotARun
from trainwreck.report.presentation import ordered
from trainwreck.report.render import render_report
from trainwreck.invariants.verdict import compose, verdict_word, word_validity
from trainwreck.rundir.files import EVENTS_LIMIT, read_json
from trainwreck.rundir.layout import RunDir, read_run_json



def load_case(run_dir: Path) -> dict[str, Any]:
    """A run's report.json, rendering it first when it is missing or unreadable."""
    path = RunDir(run_dir).report_file("report.json")
    try:
        return read_json(path, EVENTS_LIMIT, root=RunDir(run_dir).report)
    except (OSError, ValueError, RecursionError):
        pass
    try:
        render_report(run_dir)
        return read_json(path, EVENTS_LIMIT, root=RunDir(run_dir).report)
    except NotARun as exc:
        return _unreadable(run_dir, f"not a run directory: {exc}")
    except Exception as exc:  # noqa: BLE001 - one bad report must not cost a chaos session its casebook
        return _unreadable(run_dir, f"the report could not be rendered: {type(exc).__name__}: {exc}")


def _unreadable(run_dir: Path, why: str) -> dict[str, Any]:
    """A casebook row for a run without a report: UNKNOWN, never a pass."""
    return {"name": run_dir.name, "run_dir": str(run_dir), "valid": "unknown", "error": why, "verdicts": {},
            "headline": why, "attempts": [], "totals": {}, "angles": [], "recovery": []}


def render_casebook(out_dir: Path, run_dirs: list[Path], title: str) -> Path:
    """Write OUT_DIR/index.html and OUT_DIR/index.md over `run_dirs`; return the HTML's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = [(Path(d), load_case(Path(d))) for d in run_dirs]
    html = out_dir / "index.html"
    html.write_text(casebook_html(out_dir, cases, title), encoding="utf-8")
    (out_dir / "index.md").write_text(casebook_markdown(out_dir, cases, title), encoding="utf-8")
    return html


def _link(out_dir: Path, run_dir: Path, name: str) -> str:
    return os.path.relpath(RunDir(run_dir).report_file(name), out_dir).replace(os.sep, "/")


def _tally(cases: list[tuple[Path, dict[str, Any]]]) -> dict[str, int]:
    tally = {"VALID": 0, "INVALID": 0, "UNKNOWN": 0}
    for _, case in cases:
        tally[verdict_word(case.get("valid"))] += 1
    return tally


def node_label(node: dict[str, Any]) -> str:
    """How a run.json "node" is named: a Ray node by its id's head and address, a host by its name."""
    if node.get("engine") == "ray" and node.get("id"):
        return f"{str(node['id'])[:8]} ({node.get('ip', '?')})"
    return str(node.get("host") or node.get("id") or "unknown node")


def _node_of(run_dir: Path) -> dict[str, Any]:
    try:
        node = read_run_json(run_dir).get("node")
    except Exception:  # noqa: BLE001 - an unreadable run.json is already an UNKNOWN row
        return {}
    return node if isinstance(node, dict) else {}


def per_node(cases: list[tuple[Path, dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """Node label -> verdict word -> cases; empty when every run ran on this one host (nothing to compare)."""
    counts: dict[str, dict[str, int]] = {}
    engines = set()
    for run_dir, case in cases:
        node = _node_of(run_dir)
        if node:
            engines.add(node.get("engine"))
            tally = counts.setdefault(node_label(node), {"VALID": 0, "INVALID": 0, "UNKNOWN": 0})
            tally[verdict_word(case.get("valid"))] += 1
    return counts if len(counts) > 1 or engines - {"local"} else {}


def _per_node_line(cases: list[tuple[Path, dict[str, Any]]]) -> str:
    return "; ".join(f"{label}: {sum(t.values())} run(s), " + ", ".join(f"{n} {w.lower()}" for w, n in t.items() if n)
                     for label, t in per_node(cases).items())


def _questions(cases: list[tuple[Path, dict[str, Any]]]) -> dict[str, list[int]]:
    """Interview question -> the indices of the cases that answer it, in first-seen order."""
    found: dict[str, list[int]] = {}
    for i, (_, case) in enumerate(cases):
        for angle in case.get("angles", []):
            found.setdefault(angle["question"], [])
            if i not in found[angle["question"]]:
                found[angle["question"]].append(i)
    return found


def _overall(tally: dict[str, int]) -> str:
    """The casebook's word: the cases' validities composed, false > unknown > true."""
    return verdict_word(compose(word_validity(word) for word, n in tally.items() if n))


def casebook_html(out_dir: Path, cases: list[tuple[Path, dict[str, Any]]], title: str) -> str:
    tally = _tally(cases)
    rows = [_row_html(out_dir, i, run_dir, case) for i, (run_dir, case) in enumerate(cases)]
    questions = "".join(
        f"<li><strong>{escape(q)}</strong> — "
        + ", ".join(f'<a href="{escape(_link(out_dir, cases[i][0], "report.html"))}#angle">'
                    f'{escape(cases[i][1].get("name", ""))}</a>' for i in idx) + "</li>"
        for q, idx in _questions(cases).items())
    summary = ", ".join(f"{n} {w.lower()}" for w, n in tally.items() if n) or "no runs"
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{escape(title)}: casebook'
            f"</title><style>{CSS}.minis{{white-space:nowrap}}.minis span{{display:inline-block;width:11px;"
            "height:11px;margin-right:2px;padding:0;border-radius:2px}}td.num{{white-space:nowrap}}</style></head>\n"
            f'<body><main data-verdict="{_overall(tally)}"><header><span class="badge {_overall(tally)}">'
            f"{_overall(tally)}</span><h1>{escape(title)}</h1><p class=\"headline {_overall(tally)}\">{len(cases)} "
            f"run(s): {escape(summary)}.</p>"
            + (f'<p class="small" id="nodes">Per node: {escape(_per_node_line(cases))}.</p>' if per_node(cases) else "")
            + "</header>\n"
            + (f"<h2>Questions these cases answer</h2><ul>{questions}</ul>" if questions else "")
            + "<h2>Cases</h2><table><thead><tr><th>#</th><th>run</th><th>verdict</th><th>invariants</th>"
              "<th>what happened</th><th class=num>attempts</th><th class=num>wall</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>"
            + '<p class="small muted">Each run directory holds its own report (report.html, report.md, '
              "report.json); <code>trainwreck report RUN_DIR</code> re-renders one.</p></main></body></html>\n")


def _row_html(out_dir: Path, i: int, run_dir: Path, case: dict[str, Any]) -> str:
    word = verdict_word(case.get("valid"))
    minis = "".join(
        f'<span class="badge {verdict_word(v.get("valid"))}" title="{escape(n)}: {escape(v.get("summary", ""))}">'
        "</span>" for n, v in ordered(case.get("verdicts", {})))
    scenario = (case.get("scenario") or {}).get("name")
    wall = case.get("wall_s")
    return (f'<tr class="case" data-valid="{word}"><td>{i + 1}</td><td><a href="'
            f'{escape(_link(out_dir, run_dir, "report.html"))}">{escape(case.get("name", run_dir.name))}</a>'
            + (f'<div class="small muted">{escape(scenario)}</div>' if scenario else "")
            + f'</td><td><span class="badge {word}">{word}</span></td><td class="minis">{minis}</td>'
              f'<td class="small">{escape(case.get("headline", ""))}</td>'
              f'<td class=num>{case.get("totals", {}).get("attempts", "—")}</td>'
              f'<td class=num>{f"{wall:.1f} s" if isinstance(wall, (int, float)) else "—"}</td></tr>')


def casebook_markdown(out_dir: Path, cases: list[tuple[Path, dict[str, Any]]], title: str) -> str:
    tally = _tally(cases)
    out = [f"# {title}: {_overall(tally)}", "",
           f"{len(cases)} run(s): " + ", ".join(f"{n} {w.lower()}" for w, n in tally.items() if n) + ".", ""]
    if per_node(cases):
        out += [f"Per node: {_per_node_line(cases)}.", ""]
    questions = _questions(cases)
    if questions:
        out += ["## Questions these cases answer", ""]
        out += [f"- **{q}** — " + ", ".join(f"[{cases[i][1].get('name', '')}]({_link(out_dir, cases[i][0], 'report.md')})"
                                            for i in idx) for q, idx in questions.items()]
        out.append("")
    out += ["## Cases", "", "| # | run | verdict | what happened |", "|---:|---|---|---|"]
    for i, (run_dir, case) in enumerate(cases):
        story = str(case.get("headline", "")).replace("|", "\\|")
        out.append(f"| {i + 1} | [{case.get('name', run_dir.name)}]({_link(out_dir, run_dir, 'report.md')}) | "
                   f"**{verdict_word(case.get('valid'))}** | {story} |")
    return "\n".join(out) + "\n"
