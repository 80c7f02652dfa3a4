"""The self-contained HTML report: inline CSS and SVG, no script, no network.

Readable top to bottom without JavaScript: the verdict and a one-line story
first, then the evidence, the pictures, the figures, the interview angle and
the command that reproduces the run.
"""
from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from trainwreck.invariants.verdict import overall_word, verdict_word
from trainwreck.report.plots import PLOTS
from trainwreck.report.svg import phases_svg, timeline_svg, wallclock_svg
from trainwreck.rundir.layout import RunDir

CSS = """
:root { --valid:#15803d; --invalid:#b91c1c; --unknown:#b45309; --ink:#1f2937; --muted:#6b7280; --line:#e5e7eb; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); margin: 0;
       background: #f8fafc; }
main { max-width: 1000px; margin: 0 auto; padding: 20px 20px 60px; background: #fff; }
h1 { font-size: 24px; margin: 6px 0; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 14px 0 4px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 4px; color: #fff; font-weight: 700;
         font-size: 13px; letter-spacing: .04em; }
.badge.VALID { background: var(--valid); } .badge.INVALID { background: var(--invalid); }
.badge.UNKNOWN { background: var(--unknown); }
.headline { font-size: 16px; background: #f1f5f9; padding: 10px 12px; border-left: 4px solid #64748b; }
.headline.INVALID { border-color: var(--invalid); background: #fef2f2; }
.headline.UNKNOWN { border-color: var(--unknown); background: #fffbeb; }
.muted { color: var(--muted); } .small { font-size: 13px; }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th, td { text-align: left; vertical-align: top; padding: 5px 8px; border-bottom: 1px solid var(--line); }
th { background: #f8fafc; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.slowest td { background: #fef2f2; font-weight: 600; }
ul.evidence { margin: 4px 0 0; padding-left: 18px; font: 12.5px/1.45 ui-monospace, Menlo, monospace;
              color: #7f1d1d; }
pre, code { font: 13px/1.45 ui-monospace, Menlo, Consolas, monospace; }
pre { background: #0f172a; color: #e2e8f0; padding: 10px 12px; border-radius: 4px; overflow-x: auto;
      white-space: pre-wrap; word-break: break-all; }
dl.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 6px 14px;
             margin: 12px 0; }
dl.figures div { border: 1px solid var(--line); border-radius: 4px; padding: 6px 8px; }
dl.figures dt { font-size: 12px; color: var(--muted); } dl.figures dd { margin: 0; font-size: 17px; font-weight: 600; }
nav a { margin-right: 12px; font-size: 14px; }
figure { margin: 10px 0; overflow-x: auto; } figcaption { font-size: 13px; color: var(--muted); }
.angle { border-left: 3px solid #7c3aed; padding: 2px 12px; margin: 12px 0; }
.angle p { margin: 4px 0; }
"""


def render_html(report: dict[str, Any], plots: Any = None) -> str:
    """The report as one HTML page; `plots` is what the plots are drawn from (report/plots.py
    RunEvents: the checker's columns, from build_report_and_plots), else they read the run's events."""
    word = overall_word(report["valid"], report.get("interrupted"))
    body = [
        _header(report, word),
        _nav(),
        _verdicts(report),
        _timeline(report),
        _plots(report, plots),
        _recovery(report),
        _phases(report),
        _angles(report),
        _reproduce(report),
        _files(report),
        '<footer class="muted small"><p>Written by <code>trainwreck report</code> from the run directory alone '
        f'(format {escape(report["format"])}); the machine-readable view is <a href="report.json">report.json</a>, '
        'the text view <a href="report.md">report.md</a>.</p></footer>',
    ]
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(report['name'])}: {word} · trainwreck report</title><style>{CSS}</style></head>\n"
            f'<body><main data-verdict="{word}">\n' + "\n".join(body) + "\n</main></body></html>\n")


def _header(report: dict[str, Any], word: str) -> str:
    scenario = report.get("scenario")
    lines = [f'<header><span class="badge {word}" id="verdict">{word}</span>',
             f"<h1>{escape(report['name'])}</h1>"]
    if scenario:
        lines.append(f'<p class="muted">scenario <strong>{escape(scenario["name"])}</strong>'
                     f'{": " + escape(scenario["summary"]) if scenario.get("summary") else ""}</p>')
    lines.append(f'<p class="headline {word}">{escape(report["headline"])}</p>')
    if report.get("cause") and not report.get("root_cause"):  # the first screen says why it failed
        lines.append(f'<p id="cause" class="headline INVALID"><strong>{escape(report["cause"])}</strong></p>')
    if report.get("error"):
        lines.append(f'<p class="headline UNKNOWN">{escape(report["error"])}</p>')
    lines.append(_root_cause(report))
    totals, figures = report["totals"], []
    figures.append(("attempts", str(totals["attempts"])))
    figures.append(("wall clock", f"{report['wall_s']:.2f} s" if report["wall_s"] is not None else "—"))
    figures.append(("final step", f"{totals['final_step']} / {report['spec'].get('total_steps')}"))
    figures.append(("redone", f"{totals['redo_steps']} steps · {totals['samples_redone']} samples"))
    for row in report["recovery"][:2]:
        if row["resumed_after_s"] is not None:
            figures.append((f"attempt {row['attempt']}: fault → training again", f"{row['resumed_after_s']:.2f} s"))
    figures.append(("judged by", "golden run" if report.get("golden") else "no golden run"))
    lines.append('<dl class="figures">' + "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>"
                                                  for k, v in figures) + "</dl></header>")
    return "\n".join(lines)


def _root_cause(report: dict[str, Any]) -> str:
    """An unplanned crash, above the verdicts: they judge a run that this crash may have emptied."""
    cause = report.get("root_cause")
    if not cause:
        return ""
    log = (f'<a href="../{escape(cause["log"])}"><code>{escape(cause["log"])}</code></a>'
           if cause["log"] else "no log file")
    return (f'<section id="root-cause" class="headline INVALID" data-rank="{cause["rank"]}">'
            f'<strong>Root cause.</strong> {escape(cause["sentence"])}'
            f'<br>first failed rank <strong>{cause["rank"]}</strong> (attempt {cause["attempt"]}, exit code '
            f'{escape(str(cause["code"]))}): <code>{escape(cause["line"])}</code>; full traceback in {log}</section>')


def _nav() -> str:
    links = [("verdicts", "Verdicts"), ("timeline", "Timeline"), ("plots", "Plots"), ("recovery", "Recovery"), ("phases", "Step phases"),
             ("angle", "Interview angle"), ("reproduce", "Reproduce"), ("files", "Files")]
    return "<nav>" + "".join(f'<a href="#{k}">{v}</a>' for k, v in links) + "</nav>"


def _verdicts(report: dict[str, Any]) -> str:
    rows = []
    for name, v in report["verdicts"].items():
        word = verdict_word(v.get("valid"))
        evidence = "".join(f"<li>{escape(str(e))}</li>" for e in v.get("evidence") or [])
        counts = ", ".join(f"{k} {n}" for k, n in (v.get("counts") or {}).items())
        rows.append(f'<tr class="verdict" data-name="{escape(name)}" data-valid="{word}"><td><strong>{escape(name)}'
                    f'</strong></td><td><span class="badge {word}">{word}</span></td><td>{escape(v.get("summary", ""))}'
                    + (f'<ul class="evidence">{evidence}</ul>' if evidence else "")
                    + (f'<div class="muted small">{escape(counts)}</div>' if counts else "") + "</td></tr>")
    out = ['<section id="verdicts"><h2>Verdicts</h2>',
           f'<p class="small muted">Judged by {escape(str(report["judged_by"]))}'
           + (f' against the golden run <code>{escape(str(report["golden"]))}</code>' if report.get("golden") else "")
           + ". Composition: one invalid verdict fails the run; an unknown one (missing evidence, a planned fault "
             "that never fired) is never a pass.</p>",
           "<table><thead><tr><th>invariant</th><th>verdict</th><th>summary and evidence</th></tr></thead><tbody>",
           *rows, "</tbody></table>"]
    if report["unfired_faults"]:
        out.append(f'<p class="headline UNKNOWN">Planned fault(s) that never fired: '
                   f'{escape(", ".join(map(str, report["unfired_faults"])))}. The run did not test them.</p>')
    notes = list(report["notes"]) + list(report.get("raw_notes", []))
    if notes:
        out.append('<ul class="small muted">' + "".join(f"<li>note: {escape(str(n))}</li>" for n in notes) + "</ul>")
    out.append("</section>")
    return "\n".join(out)


def _timeline(report: dict[str, Any]) -> str:
    lineage = report.get("lineage") or {}
    segs = ", ".join(f"attempt {s['attempt']}: updates {s['first']}-{s['last']}" for s in lineage.get("segments", []))
    return "\n".join([
        '<section id="timeline"><h2>Timeline</h2>',
        "<figure>", timeline_svg(report),
        "<figcaption>One lane per rank per attempt, by update number. Solid: updates on the lineage (the ones "
        "that shaped the final model" + (f" — {escape(segs)}" if segs else "") + "); hatched: work redone after a "
        "restart. Diamonds: checkpoint saves (committed by rank 0); hollow: a save that was due but never "
        "committed. Red shading: a fault, from the update it hit to the end of its attempt. Hover a mark for "
        "times.</figcaption></figure>",
        "<figure>", wallclock_svg(report),
        "<figcaption>The same run on the wall clock: start-up, training, and the time between a failure and the "
        "end of its attempt (a hang costs the watchdog's timeout here).</figcaption></figure>",
        "</section>"])


PLOT_CAPTIONS = {
    "loss": "The loss at every lineage update against the golden run (an uninterrupted run of the same "
            "spec); a marker where the trajectory first leaves it.",
    "coverage": "Sample coverage per update: ids seen twice in an epoch and ids an epoch never saw.",
    "progress": "Forward progress over wall-clock time, per rank: a flat line is a rank making none.",
    "ckpt_age": "Checkpoint age over time: the work a failure at that moment would cost.",
}


def _plots(report: dict[str, Any], data: Any = None) -> str:
    """The single-run plots (docs/REPORTS.md explains each); a plot that cannot be drawn is left out."""
    run_dir = Path(report["run_dir"])
    golden = Path(report["golden"]) if isinstance(report.get("golden"), str) else None
    figures = []
    for name, draw in PLOTS.items():
        try:
            svg = draw(run_dir, golden, data) if name == "loss" else draw(run_dir, data)
        except Exception:  # noqa: BLE001 - a picture must never cost the report
            continue
        figures.append(f"<figure>{svg}<figcaption>{escape(PLOT_CAPTIONS[name])}</figcaption></figure>")
    return '<section id="plots"><h2>Plots</h2>' + "".join(figures) + "</section>" if figures else ""


RECOVERY_COLUMNS = [
    ("attempt", "failed attempt", None), ("cause", "cause", None),
    ("progress_at_failure", "last update applied", None), ("checkpoint", "newest checkpoint", None),
    ("checkpoint_age_steps", "checkpoint age (steps)", None), ("checkpoint_age_s", "checkpoint age (s)", "s"),
    ("detected_after_s", "failure seen after", "s"), ("restart_after_s", "next attempt started after", "s"),
    ("resumed_after_s", "training again after", "s"), ("recovered_after_s", "back at the last update applied after", "s"),
    ("steps_redone", "steps redone", None), ("samples_redone", "samples redone", None),
]


def fmt(value: Any, unit: str | None) -> str:
    if value is None:
        return "—"
    if unit == "s" and isinstance(value, (int, float)):
        return f"{value:.3f} s"
    return str(value)


def _recovery(report: dict[str, Any]) -> str:
    rows = report["recovery"]
    if not rows:
        return (f'<section id="recovery"><h2>Recovery</h2><p>{escape(report.get("recovery_text") or "")}</p>'
                "</section>")
    # One column per failed attempt, one row per figure: the cause is a sentence, not a cell.
    head = "".join(f"<th class=num>attempt {row['attempt']}</th>" for row in rows)
    body = "".join(f"<tr><th>{escape(label)}</th>" + "".join(
        f'<td class="{"" if key == "cause" else "num"}">{escape(fmt(row[key], unit))}</td>' for row in rows)
        + "</tr>" for key, label, unit in RECOVERY_COLUMNS[1:])
    return ('<section id="recovery"><h2>Recovery</h2>'
            f'<p>{escape(report.get("recovery_text") or "")}</p><p class="small muted">Times are measured from the failure '
            "(the fault event, else the hang, else the first rank death). Checkpoint age: updates and seconds since "
            "the newest committed checkpoint when the attempt failed: the work a restart must redo.</p>"
            f'<table class="recovery"><thead><tr><th>failed</th>{head}</tr></thead><tbody>{body}</tbody></table>'
            "</section>")


def _phases(report: dict[str, Any]) -> str:
    phases = report["phases"]
    if not phases["ranks"]:
        return '<section id="phases"><h2>Step phases</h2><p>No step event carried <code>phases</code>.</p></section>'
    names = phases["phase_names"]
    head = "<th>rank</th><th class=num>steps</th>" + "".join(f"<th class=num>{escape(n)}</th>" for n in names) + \
        "<th class=num>mean step</th><th class=num>own work</th>"
    rows = []
    for r in phases["ranks"]:
        slow = r["rank"] == phases["slowest_rank"]
        cells = "".join(f"<td class=num>{r['totals'].get(n, 0.0):.3f}</td>" for n in names)
        rows.append(f'<tr class="{"slowest" if slow else ""}"><td>rank {r["rank"]}{" (slowest)" if slow else ""}</td>'
                    f"<td class=num>{r['steps']}</td>{cells}<td class=num>{r['mean_step_s'] * 1000:.1f} ms</td>"
                    f"<td class=num>{r['own_s']:.3f}</td></tr>")
    saves = phases["save_seconds"]
    save_line = (f"{saves['count']} committed save(s) took {saves['mean']:.3f} s on average (max {saves['max']:.3f} s)."
                 if saves["count"] else "No save recorded its duration.")
    return "\n".join([
        '<section id="phases"><h2>Step phases</h2>', "<figure>", phases_svg(report), "</figure>",
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>",
        '<p class="small muted">Seconds summed over every step event of each rank, redo work included. '
        "<code>checkpoint</code> of update k is the save after update k-1 (rank 0 writes, the others wait at the "
        "barrier). The slowest rank is the one with the most <em>own work</em> (data, forward, optimizer): the "
        "others' extra backward and sync time is mostly waiting for it inside the all-reduce. "
        + (f"Median step (without saves): {phases['median_step_s'] * 1000:.1f} ms. " if phases.get("median_step_s")
           else "") + escape(save_line) + "</p>",
        "</section>"])


def _angles(report: dict[str, Any]) -> str:
    out = ['<section id="angle"><h2>Interview angle</h2>']
    scenario = report.get("scenario") or {}
    if scenario.get("question"):
        out.append(f'<p class="muted">This case was built to answer: <strong>{escape(scenario["question"])}'
                   "</strong></p>")
    if not report["angles"]:
        out.append("<p>No fault fired and nothing failed: this run is a baseline, not a case.</p>")
    for angle in report["angles"]:
        out.append(f'<div class="angle" data-topic="{escape(angle["topic"])}"><h3>{escape(angle["question"])}</h3>'
                   f'<p>{escape(angle["answer"])}</p><p class="small muted">raised by: '
                   f'{escape("; ".join(angle["raised_by"]))}</p></div>')
    out.append("</section>")
    return "\n".join(out)


def _reproduce(report: dict[str, Any]) -> str:
    check = f"trainwreck check {report['run_dir']}" + (f" --golden {report['golden']}" if report.get("golden") else "")
    spec_rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(json.dumps(v))}</td></tr>"
                        for k, v in report["spec"].items())
    return "\n".join([
        '<section id="reproduce"><h2>Plan and reproduce</h2>',
        "<h3>Reproduce the run</h3>",
        f'<pre id="reproduce-command">{escape(report["reproduce"])}</pre>' if report.get("reproduce") else
        "<p>This run directory records no reproduce command (it was not written by <code>run_judged</code>); "
        "the plan and spec below are what a rerun needs.</p>",
        "<h3>Re-judge this directory</h3>", f"<pre>{escape(check)}</pre>",
        "<h3>The plan</h3>", f"<pre>{escape(json.dumps(report['plan'], indent=1))}</pre>",
        "<h3>The spec</h3>", f"<table><tbody>{spec_rows}</tbody></table>",
        "</section>"])


def _files(report: dict[str, Any]) -> str:
    run_dir = Path(report["run_dir"])
    paths = RunDir(run_dir)
    groups = []
    for folder in (paths.events, paths.stacks, paths.logs):
        sub = folder.name
        names = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        if names:
            shown = names[:40]
            links = ", ".join(f'<a href="../{sub}/{escape(n)}">{escape(n)}</a>' for n in shown)
            more = f" and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
            groups.append(f"<li><code>{sub}/</code>: {links}{more}</li>")
    for path in (paths.run_json, paths.verdicts):
        name = path.name
        if path.is_file():
            groups.append(f'<li><a href="../{name}">{name}</a></li>')
    return ('<section id="files"><h2>Files</h2><p class="small muted">Links are relative to this report, inside '
            f"the run directory <code>{escape(str(run_dir))}</code>.</p><ul>" + "".join(groups) + "</ul></section>")
