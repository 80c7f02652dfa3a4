"""The truth check: every sentence a report prints is re-derived from verdicts.json and the events.

`check_report(run_dir)` rebuilds the report from the run directory alone and compares:

- the claims report.json recorded with the claims rebuilt now (same text, same rendered state);
- each rendered claim's presumptions against verdicts.json itself (for verdicts) and the rebuilt
  report (for facts), and each fact it quotes from a field with the value at that field;
- the prose of report.md (headline, root cause, interview angle, recovery): every claim it
  renders is there, and no sentence of any known claim form appears there whose presumptions
  fail (this reads reports written before claims existed: the landed main's sampler_not_saved
  report says "each of the 16 lineage steps matches" under an INVALID continuity verdict);
- an INVALID report states exactly one root cause before its verdict table (the first screen), and
  it is the root-cause claim rebuilt from the run's facts.

It returns the problems, one line each; an empty list is a pass. tests/report/test_truth.py runs
it over every report the defects table, the demo, the frameworks table and the handbook write.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainwreck.report.claims import MISSING, Claim, claim_from_json, resolve, template_pattern
from trainwreck.report.model import build_report
from trainwreck.rundir.layout import RunDir

MIN_LITERAL = 12
"""A template whose fixed text is shorter than this ("{faults}") says nothing a scan could find."""


def check_report(run_dir: Path, markdown: str | None = None) -> list[str]:
    """Problems with RUN_DIR's report (its report.md unless `markdown` is given), one line each."""
    run_dir = Path(run_dir)
    paths = RunDir(run_dir)
    verdicts = json.loads(paths.verdicts.read_text())
    stored = json.loads(paths.report_file("report.json").read_text())
    text = markdown if markdown is not None else paths.report_file("report.md").read_text(encoding="utf-8")
    rebuilt = build_report(run_dir)
    claims = [claim_from_json(c) for c in rebuilt["claims"]]
    problems = _stored_agrees(stored, rebuilt)
    for claim in claims:
        if claim.rendered:
            problems += [f"{claim.key}: {p}" for p in _claim_problems(claim, rebuilt, verdicts)]
            if _flat(claim.text) not in _flat(text):
                problems.append(f"{claim.key}: rendered claim missing from report.md: {claim.text!r}")
    problems += scan_text(text, claims, rebuilt, verdicts)
    problems += _first_screen(text, verdicts, rebuilt)
    return problems


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\\|", "|"))


def _stored_agrees(stored: dict[str, Any], rebuilt: dict[str, Any]) -> list[str]:
    if "claims" not in stored:
        return ["report.json records no claims: its prose is not backed by data"]
    old = [(c["key"], c["rendered"], c.get("text")) for c in stored["claims"]]
    new = [(c["key"], c["rendered"], c.get("text")) for c in rebuilt["claims"]]
    if old != new:
        diff = next(((a, b) for a, b in zip(old, new) if a != b), (old[len(new):] or None, new[len(old):] or None))
        return [f"report.json's claims differ from the ones its run directory gives now: {diff[0]!r} vs {diff[1]!r}"]
    return []


def _claim_problems(claim: Claim, report: dict[str, Any], verdicts: dict[str, Any]) -> list[str]:
    out = []
    for p in claim.presumes:
        source = verdicts if p.path.startswith("verdicts.") or p.path == "valid" else report
        if not p.holds({None: source}):
            out.append(f"presumes {p} but it is {resolve(source, p.path)!r}")
    for name, path in claim.sources.items():
        actual = resolve(report, path)
        if actual is not MISSING and actual != claim.facts[name]:
            out.append(f"quotes {name}={claim.facts[name]!r} from {path}, which holds {actual!r}")
    return out


def scan_text(text: str, claims: list[Claim], report: dict[str, Any], verdicts: dict[str, Any]) -> list[str]:
    """Sentences of a known claim form in `text` whose presumptions do not hold (a report written by
    any version of the code: the forms are those the current code knows)."""
    rendered = {c.template for c in claims if c.rendered}
    said = [_flat(c.text) for c in claims if c.rendered]
    flat = _flat(text)
    out, seen = [], set()
    for claim in claims:
        literal = "".join(part for part in re.split(r"\{[^}]*\}", claim.template))
        if claim.rendered or claim.template in rendered or len(literal) < MIN_LITERAL or claim.template in seen:
            continue
        seen.add(claim.template)
        for found in template_pattern(claim.template).finditer(flat):
            if any(found.group(0) in sentence for sentence in said):  # part of a true sentence of another form
                continue
            failed = [str(p) for p in claim.presumes
                      if not p.holds({None: verdicts if p.path.startswith("verdicts.") else report})]
            if failed:
                out.append(f"{claim.key}: the text says {found.group(0)[:160]!r} but it presumes "
                           f"{'; '.join(failed)}, which does not hold")
                break
    return out


ROOT_CAUSE = re.compile(r"Root cause: ")
"""How a root-cause sentence opens (violation_cause.py): the first screen must hold exactly one."""


def _first_screen(text: str, verdicts: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """An INVALID report states one root cause before its verdict table, and it is the one derived now:
    a sentence the run's facts no longer give, or two causes side by side, is a problem."""
    if verdicts.get("valid") is not False:
        return []
    head = _flat(text.split("## Verdicts")[0])
    found = len(ROOT_CAUSE.findall(head))
    if not found:
        return ["INVALID, but no root-cause sentence before the verdicts (the first screen)"]
    derived = [_flat(c["text"]) for c in report["claims"]
               if c["section"] == "cause" and c["rendered"] and ROOT_CAUSE.match(c["text"])]
    if found != 1 or len(derived) != 1:
        return [f"the first screen holds {found} root-cause sentence(s) and the facts give {len(derived)}: "
                "there must be exactly one"]
    if derived[0] not in head:
        said = head[head.index("Root cause: "):][:160]
        return [f"the first screen's root cause {said!r} is not the one the run's facts give: {derived[0][:160]!r}"]
    return []


def flip(verdicts: dict[str, Any], name: str) -> dict[str, Any]:
    """verdicts.json with invariant `name`'s verdict turned over (VALID <-> INVALID), the run's word recomputed."""
    data = json.loads(json.dumps(verdicts))
    v = data["verdicts"][name]
    v["valid"] = v.get("valid") is not True
    words = [x.get("valid") for x in data["verdicts"].values()]
    data["valid"] = False if False in words else (True if all(w is True for w in words) else "unknown")
    return data


def check_handbook(out: Path) -> list[str]:
    """Problems with a handbook's page: every sentence it renders is a recorded claim whose presumptions
    hold against its runs' report.json and verdicts.json and whose quoted fields hold what it quotes,
    the chapter's text is exactly its rendered sentences, and every run's own report passes check_report."""
    from trainwreck.report.handbook import sentence_text

    out = Path(out)
    record = json.loads((out / "handbook.json").read_text())
    page = (out / "index.html").read_text(encoding="utf-8")
    reports = {k: json.loads(Path(r["report"]).read_text()) for k, r in record["runs"].items()
               if Path(r["report"]).is_file()}
    judged = {k: json.loads((Path(r["run_dir"]) / "verdicts.json").read_text()) for k, r in record["runs"].items()
              if (Path(r["run_dir"]) / "verdicts.json").is_file()}
    problems = []
    for chapter in record["chapters"]:
        slug, shown = chapter["slug"], []
        for data in chapter.get("sentences", []):
            claim = claim_from_json(data)
            if not claim.rendered:
                continue
            shown.append(sentence_text(data))
            for p in claim.presumes:
                source = judged.get(p.run) if p.path.startswith("verdicts.") else reports.get(p.run)
                if not p.holds({p.run: source}):
                    problems.append(f"{slug}: {claim.key}: presumes {p}, which does not hold")
            for name, src in claim.sources.items():
                run, _, path = src.partition(": ")
                actual = resolve(reports.get(run), path)
                if actual != claim.facts[name]:
                    problems.append(f"{slug}: {claim.key}: quotes {name}={claim.facts[name]!r} from {src}, "
                                    f"which holds {actual!r}")
        if _flat(" ".join(shown)).replace(" ", "") != _flat(_chapter_prose(page, slug)).replace(" ", ""):
            problems.append(f"{slug}: the page's text is not exactly its rendered sentences")
    for key, r in record["runs"].items():
        if key in judged:
            problems += [f"run {key}: {p}" for p in check_report(Path(r["run_dir"]))]
    return problems


def _chapter_prose(page: str, slug: str) -> str:
    """A chapter's paragraphs on the page, as plain text (its plots and its list of runs left out)."""
    from html import unescape

    found = re.search(rf'<section class="chapter" id="{re.escape(slug)}"><h2>.*?</h2>(.*?)(?:<div class="plots">|'
                      r"<h3>Runs</h3>)", page, re.S)
    return unescape(re.sub(r"<[^>]+>", " ", found.group(1))) if found else ""
