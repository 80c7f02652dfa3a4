"""trainwreck report RUN_DIR [--metrics]: (re)render a run's report; exit 0/1/2 per the run's verdict.

--metrics also writes RUN_DIR/report/metrics.prom: forward progress, checkpoint age and restarts as
OpenMetrics text (report/metrics.py; needs the `metrics` extra, prometheus_client)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainwreck.report import NotARun, render_report
from trainwreck.report.metrics import METRICS_FILE, openmetrics
from trainwreck.invariants.verdict import exit_code, overall_word, word_validity
from trainwreck.rundir.errors import InputError
from trainwreck.rundir.files import describe


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a run directory (it holds run.json and events/)")
    parser.add_argument("--metrics", action="store_true",
                        help=f"also write report/{METRICS_FILE}: samples/s, checkpoint age and restarts as OpenMetrics "
                             "text a Prometheus scraper reads (needs prometheus_client: the `metrics` extra)")


def main(args: argparse.Namespace) -> int:
    try:
        html = render_report(args.run_dir)
    except NotARun as exc:
        raise InputError(f"{args.run_dir} is not a run directory: {exc}") from None
    except OSError as exc:  # events/ unreadable, report/ unwritable, a full disk: which one, and the fix
        raise InputError(f"cannot report on {args.run_dir}: {describe(exc)}") from None
    word = verdict_of(html)
    print(f"{word}  {html}")
    print(f"      {html.with_name('report.md')}")
    if args.metrics:
        prom = html.with_name(METRICS_FILE)
        prom.write_bytes(openmetrics(json.loads(html.with_name("report.json").read_text())))
        print(f"      {prom}")
    return exit_code(word_validity(word))


def verdict_of(html: Path) -> str:
    """The verdict the report states (report.json sits beside the HTML)."""
    report = json.loads(html.with_name("report.json").read_text())
    return overall_word(report["valid"], report.get("interrupted"))
