"""Write one run's report: report.json, report.md and report.html under RUN_DIR/report/.

Its own module, so the casebook (which renders a missing report) imports it without importing
the package that re-exports both."""
from __future__ import annotations

from itertools import chain
from pathlib import Path
from typing import Iterable

from trainwreck.report.html import render_html
from trainwreck.report.json_text import iterencode
from trainwreck.report.markdown import render_markdown
from trainwreck.report.model import build_report_and_plots
from trainwreck.rundir.files import write_atomic
from trainwreck.rundir.layout import RunDir


def render_report(run_dir: Path) -> Path:
    """Write RUN_DIR/report/{report.json,report.md,report.html}; return the HTML's path.

    Raises NotARun when RUN_DIR is not a trainwreck run directory."""
    run_dir = Path(run_dir)
    report, plots = build_report_and_plots(run_dir)
    out = RunDir(run_dir).report
    out.mkdir(exist_ok=True)
    # Written as the encoder makes it: json.dumps of a 16 M-event run's report held the text and the
    # list of its millions of pieces at once.
    _write(out / "report.json", chain(iterencode(report, indent=1), ["\n"]))
    _write(out / "report.md", render_markdown(report))
    html = out / "report.html"
    _write(html, render_html(report, plots))
    return html


def _write(path: Path, text: str | Iterable[str]) -> None:
    """Write then rename, so a reader (a browser, a casebook) never sees half a report; through
    rundir/files.py, so a planted link (report.md.tmp, a report/ linked elsewhere) is never written through."""
    write_atomic(path, text, root=path.parent.parent)
