"""report.md: the same facts as the HTML, as text (for a terminal, a PR comment, a diff)."""
from __future__ import annotations

import json
from typing import Any

from trainwreck.report.html import RECOVERY_COLUMNS, fmt
from trainwreck.invariants.verdict import overall_word, verdict_word


def _cell(text: Any) -> str:
    """A table cell: pipes and newlines would break the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: dict[str, Any]) -> str:
    word = overall_word(report["valid"], report.get("interrupted"))
    out = [f"# {report['name']}: {word}", ""]
    scenario = report.get("scenario")
    if scenario:
        out += [f"Scenario **{scenario['name']}**" + (f": {scenario['summary']}" if scenario.get("summary") else ""), ""]
    out += [f"> {report['headline']}", ""]
    if report.get("cause") and not report.get("root_cause"):
        out += [f"**{_cell(report['cause'])}**", ""]
    out += _root_cause(report)
    if report.get("error"):
        out += [f"**{report['error']}**", ""]
    out += _verdicts(report) + _timeline(report) + _recovery(report) + _phases(report) + _angles(report)
    out += _reproduce(report)
    out += ["", "Pictures (timeline, wall clock, phases): [report.html](report.html). Machine view: "
            "[report.json](report.json).", ""]
    return "\n".join(out)


def _root_cause(report: dict[str, Any]) -> list[str]:
    """An unplanned crash first: without it the verdicts below read as if the faults were tested."""
    cause = report.get("root_cause")
    if not cause:
        return []
    # The cause claim's own text (violation_cause.py), so the truth check finds the one root-cause sentence it derives.
    said = report.get("cause") or f"Root cause: {cause['sentence']}."
    out = ["## Root cause", "", f"**{_cell(said)}**", "",
           f"- first failed rank: {cause['rank']} (attempt {cause['attempt']}, exit code {cause['code']})",
           f"- error: `{cause['line']}`",
           f"- full traceback: [{cause['log']}](../{cause['log']})" if cause["log"] else "- full traceback: no log file"]
    return out + [""]


def _verdicts(report: dict[str, Any]) -> list[str]:
    judged = f"Judged by {report['judged_by']}" + (f" against the golden run `{report['golden']}`"
                                                   if report.get("golden") else "") + "."
    out = ["## Verdicts", "", judged, "", "| invariant | verdict | summary |", "|---|---|---|"]
    for name, v in report["verdicts"].items():
        out.append(f"| {name} | **{verdict_word(v.get('valid'))}** | {_cell(v.get('summary', ''))} |")
    for name, v in report["verdicts"].items():
        if v.get("evidence"):
            out += ["", f"Evidence for **{name}**:", ""] + [f"- `{e}`" for e in v["evidence"]]
    if report["unfired_faults"]:
        out += ["", f"Planned fault(s) that never fired: {', '.join(map(str, report['unfired_faults']))}."]
    out += [""] + [f"- note: {n}" for n in list(report["notes"]) + list(report.get("raw_notes", []))]
    return out + [""]


def _timeline(report: dict[str, Any]) -> list[str]:
    out = ["## Timeline", "", "| attempt | ranks | restored | updates (lineage / redo) | ended |", "|---|---|---|---|---|"]
    for att in report["attempts"]:
        restored = f"{att['restored']['checkpoint']} (step {att['restored']['step']})" if att["restored"] else "fresh"
        lineage = sorted({tuple(r) for ln in att["lanes"] for r in ln["lineage"]})
        redo = sorted({tuple(r) for ln in att["lanes"] for r in ln["redo"]})
        work = ", ".join(f"{lo}-{hi}" for lo, hi in lineage) or "none"
        if redo:
            work += " / redo " + ", ".join(f"{lo}-{hi}" for lo, hi in redo)
        out.append(f"| {att['attempt']} | {att['world_size']} | {restored} | {work} | {att['ended']} |")
    events = [(f["t_s"], f"fault {f['id']} ({f['signal'] or f['kind']}): {f['detail'] or ''}") for f in report["faults"]]
    events += [(h["t_s"], f"hang declared: suspects {h['ranks']}, waiting {h['waiting']}, "
                          f"{h['detected_after_s']} s without progress") for h in report["hangs"]]
    events += [(s["t_s"], f"save {s['checkpoint']} committed by attempt {s['attempt']}") for s in report["saves"]]
    events += [(a["start_s"], f"attempt {a['attempt']} started"
                + (f" (ranks started cold, not forked warm: {a['cold_reason']})" if a.get("cold_reason") else ""))
               for a in report["attempts"]]
    events = sorted((t, e) for t, e in events if t is not None)
    if events:
        out += ["", "| +seconds | event |", "|---:|---|"] + [f"| {t:.3f} | {_cell(e)} |" for t, e in events[:60]]
        if len(events) > 60:
            out.append(f"| | ... and {len(events) - 60} more |")
    return out + [""]


def _recovery(report: dict[str, Any]) -> list[str]:
    if not report["recovery"]:
        return ["## Recovery", "", report.get("recovery_text") or "", ""]
    out = ["## Recovery", "", report.get("recovery_text") or "", "", "| " + " | ".join(label for _, label, _ in RECOVERY_COLUMNS) + " |",
           "|" + "---|" * len(RECOVERY_COLUMNS)]
    for row in report["recovery"]:
        out.append("| " + " | ".join(_cell(fmt(row[k], unit)) for k, _, unit in RECOVERY_COLUMNS) + " |")
    return out + [""]


def _phases(report: dict[str, Any]) -> list[str]:
    phases = report["phases"]
    if not phases["ranks"]:
        return []
    names = phases["phase_names"]
    out = ["## Step phases (seconds, whole run)", "", "| rank | steps | " + " | ".join(names) + " | own work |",
           "|---|---:|" + "---:|" * (len(names) + 1)]
    for r in phases["ranks"]:
        mark = " **(slowest)**" if r["rank"] == phases["slowest_rank"] else ""
        out.append(f"| {r['rank']}{mark} | {r['steps']} | " + " | ".join(f"{r['totals'].get(n, 0):.3f}" for n in names)
                   + f" | {r['own_s']:.3f} |")
    out += ["", "`checkpoint` of update k is the save after update k-1; own work = data + forward + optimizer."]
    return out + [""]


def _angles(report: dict[str, Any]) -> list[str]:
    out = ["## Interview angle", ""]
    scenario = report.get("scenario") or {}
    if scenario.get("question"):
        out += [f"This case was built to answer: **{scenario['question']}**", ""]
    for angle in report["angles"]:
        out += [f"### {angle['question']}", "", angle["answer"], ""]
    return out


def _reproduce(report: dict[str, Any]) -> list[str]:
    check = f"trainwreck check {report['run_dir']}" + (f" --golden {report['golden']}" if report.get("golden") else "")
    out = ["## Reproduce", ""]
    if report.get("reproduce"):
        out += ["```sh", report["reproduce"], "```", ""]
    out += ["Re-judge this directory:", "", "```sh", check, "```", "", "Plan:", "", "```json",
            json.dumps(report["plan"], indent=1), "```"]
    return out
