"""trainwreck frameworks [--json] [--out DIR] [--frameworks A,B] [--scenarios A,B]: judge real trainers.

Frameworks x scenarios (harness/suites/frameworks.py): each a real `trainwreck run --cmd` job, judged by every invariant against the
framework's golden run, a report per run, and a casebook (OUT/index.html). A framework whose extra
is not installed gets rows saying how to install it, valid "unknown". Exit per DESIGN: 0 every
row valid, 1 a row invalid, 2 a row not judged (and none invalid) or bad input.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from trainwreck.invariants.verdict import exit_code, verdict_word
from trainwreck.rundir.errors import InputError

if TYPE_CHECKING:
    from trainwreck.harness.suites.frameworks import Row


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="where the runs go (default ./trainwreck-out/frameworks-TIMESTAMP)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list, one row per run: framework, scenario, valid, invalid, report")
    parser.add_argument("--frameworks", help="comma-separated framework names instead of all of them")
    parser.add_argument("--scenarios", help="comma-separated scenario names instead of all of them")


def pick(text: str | None, known: list[str], option: str) -> list[str] | None:
    """--option a,b -> ['a', 'b'], each checked against `known`; None: all of them."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in known:
            raise InputError(f"{option} {name!r} is unknown; choose from {', '.join(known)}")
    if not names:
        raise InputError(f"{option} is empty; give comma-separated names from {', '.join(known)}")
    return names


def main(args: argparse.Namespace) -> int:
    from trainwreck.harness.suites.frameworks import EVERY_OP, FRAMEWORKS, REPLICA_FRAMEWORK, SCENARIOS
    from trainwreck.harness.suites.torchft_rows import SCENARIOS as REPLICA_SCENARIOS

    frameworks = pick(args.frameworks, [*FRAMEWORKS, REPLICA_FRAMEWORK], "--frameworks")
    scenarios = pick(args.scenarios, [*SCENARIOS, EVERY_OP, *(s for s in REPLICA_SCENARIOS if s not in SCENARIOS)],
                     "--scenarios")
    out = args.out or Path("trainwreck-out") / f"frameworks-{time.strftime('%Y%m%d-%H%M%S')}"
    return table(out, args.json, frameworks, scenarios)


def table(out: Path, as_json: bool, frameworks: list[str] | None, scenarios: list[str] | None) -> int:
    """Run and publish the frameworks x scenarios table (None: all of them); `trainwreck sweep
    --writer FRAMEWORK` runs its crash-every-op rows through here too."""
    from trainwreck.harness.suites.frameworks import cmd_runner, run_table, scripts_missing

    missing = scripts_missing()
    if missing is not None:
        raise InputError(missing)
    return publish_rows(as_json, out, "trainwreck frameworks",
                        lambda progress: run_table(out, cmd_runner, frameworks, scenarios, progress),
                        lambda row: f"{row.framework:<11} {row.scenario:<28}")


def publish_rows(as_json: bool, out: Path, title: str, run: Callable[[Callable[[Row], None]], list[Row]],
                 label: Callable[[Row], str]) -> int:
    """Run a table of framework rows into OUT with a progress line per row (unless --json), then
    its casebook and the JSON list or the one-line summary; the exit code per DESIGN. Shared by
    `trainwreck frameworks` and `trainwreck sweep --cmd` (one more "framework": the command)."""
    from trainwreck.harness.suites.frameworks import rows_json, table_validity
    from trainwreck.report.casebook import render_casebook

    out.mkdir(parents=True, exist_ok=True)

    def progress(row: Row) -> None:
        if not as_json:
            why = f"invalid: {', '.join(row.invalid)}" if row.invalid else row.reason
            print(f"{verdict_word(row.valid):<8} {label(row)} {why}", flush=True)

    rows = run(progress)
    reports = [Path(r.report).parent.parent for r in rows if r.report]
    casebook = render_casebook(out, reports, title) if reports else None
    if as_json:
        print(json.dumps(rows_json(rows), indent=1))
    else:
        print(f"\n{verdict_word(table_validity(rows))}: {len(rows)} run(s)"
              + (f"; casebook: {casebook}" if casebook else ""))
    return exit_code(table_validity(rows))
