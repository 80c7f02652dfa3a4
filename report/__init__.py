"""Failure reports: one per run (report.json, report.md, report.html) and a casebook over many.

    from trainwreck.report import render_report, render_casebook
    html = render_report(Path("trainwreck-out/run-1"))          # RUN_DIR/report/report.html
    index = render_casebook(Path("out/casebook"), run_dirs, "demo")

A report reads only its run directory (and verdicts.json when present; otherwise
it judges the run itself, without a golden run). Standard library only: no torch.
"""
from __future__ import annotations

from trainwreck.invariants.verdict import verdict_word
from trainwreck.report.casebook import render_casebook
from trainwreck.report.model import NotARun, build_report
from trainwreck.report.render import render_report

__all__ = ["NotARun", "build_report", "render_casebook", "render_report", "verdict_word"]
