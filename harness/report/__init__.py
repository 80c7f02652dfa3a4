"""Failure reports: one per run (report.json, report.md, report.html) and a casebook over many.

    from trainwreck.harness.report import render_report, render_casebook
    html = render_report(Path("trainwreck-out/run-1"))          # RUN_DIR/report/report.html
    index = render_casebook(Path("out/casebook"), run_dirs, "demo")

A report reads only its run directory (and verdicts.json when present; otherwise
it judges the run itself, without a golden run). Standard library only: no torch.
"""
from __future__ import annotations

import json
from pathlib import Path

from trainwreck.harness.report.casebook import render_casebook
from trainwreck.harness.report.html import render_html
from trainwreck.harness.report.markdown import render_markdown
from trainwreck.harness.report.model import NotARun, build_report
from trainwreck.invariants.verdict import verdict_word
from trainwreck.trainer.files import write_atomic
from trainwreck.trainer.rundir import RunDir

__all__ = ["NotARun", "build_report", "render_casebook", "render_report", "verdict_word"]


def render_report(run_dir: Path) -> Path:
    """Write RUN_DIR/report/{report.json,report.md,report.html}; return the HTML's path.

    Raises NotARun when RUN_DIR is not a trainwreck run directory."""
    run_dir = Path(run_dir)
    report = build_report(run_dir)
    out = RunDir(run_dir).report
    out.mkdir(exist_ok=True)
    _write(out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    _write(out / "report.md", render_markdown(report))
    html = out / "report.html"
    _write(html, render_html(report))
    return html


def _write(path: Path, text: str) -> None:
    """Write then rename, so a reader (a browser, a casebook) never sees half a report; through
    trainer/files.py, so a planted link (report.md.tmp, a report/ linked elsewhere) is never written through."""
    write_atomic(path, text, root=path.parent.parent)
