"""`trainwreck check RUN_DIR [--golden DIR] [--json]`: re-judge a stored run.

Without --golden, the golden run the run directory's verdicts.json names is used when it
still exists (a note says so); with none, a run that restarted is never VALID, since only a
golden run shows that its resume was exact. Exit codes: 0 valid, 1 invalid, 2 not judged (an
unknown verdict, an interrupted job, or input that could not be used - the message names the
file, line and field)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import Any, TextIO

from trainwreck.invariants.history import InputError
from trainwreck.invariants.loader import load_history
from trainwreck.invariants.files import read_bounded
from trainwreck.invariants.judge import Judgement, judge, without_golden
from trainwreck.invariants.verdict import EXIT_UNKNOWN, exit_code, verdict_word

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainwreck check",
        description="Judge a stored run directory (format trainwreck-run/1) against the invariants.",
        epilog="exit status: 0 valid, 1 invalid, 2 unknown or unusable input",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holds run.json and events/)")
    parser.add_argument("--golden", metavar="DIR", help="an uninterrupted run of the same spec to compare with "
                        "(default: the one RUN_DIR/verdicts.json names, when it still exists)")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error (argparse exits 2)
        return exc.code if isinstance(exc.code, int) else EXIT_UNKNOWN
    try:
        history = load_history(args.run_dir)
        golden_dir, why = (args.golden, "") if args.golden else recorded_golden(args.run_dir)
        golden = None
        if golden_dir:
            try:
                golden = load_history(golden_dir)
            except InputError as exc:
                raise InputError(f"golden run: {exc}") from None
        judgement = judge(history, golden)
        if golden is None:
            judgement = without_golden(judgement, history, why)
        elif not args.golden:
            judgement = replace(judgement, notes=[f"golden run: {golden_dir}, which {VERDICTS} names", *judgement.notes])
    except InputError as exc:
        return _unusable(str(exc), args.json)
    except OSError as exc:  # the machine, not the run: events/ or run.json that this user may not read
        where = exc.filename or args.run_dir
        return _unusable(f"{where} cannot be read ({exc.strerror or type(exc).__name__}): give this user read "
                         f"access to the run directory (chmod -R u+rX), or check it as its owner", args.json)
    except (RecursionError, TypeError, ValueError, OverflowError, KeyError, AttributeError) as exc:
        # Last guard: a shape the loader let through that a checker could not
        # use is still unusable input (exit 2, one line), never a traceback.
        return _unusable(f"{args.run_dir}: input the checker could not use ({type(exc).__name__}: {str(exc)[:200]})", args.json)
    if args.json:
        payload: dict[str, Any] = {"run_dir": args.run_dir, **judgement.to_json()}
        if golden_dir and golden is not None:
            payload["golden"] = golden_dir
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_table(judgement, sys.stdout)
    return exit_code(judgement.valid)


VERDICTS = "verdicts.json"
"""The harness's last judgement of a run; its `golden` names the golden run it was judged against."""
VERDICTS_LIMIT = 16 * 1024 * 1024


def recorded_golden(run_dir: str) -> tuple[str | None, str]:
    """(the golden run RUN_DIR/verdicts.json names, when it still holds a run.json; else None and
    why none is used, with the fix). A relative name is taken from the current folder first, as
    the harness wrote it, then from the run directory."""
    fix = "pass --golden DIR (an uninterrupted run of the same spec) to judge it"
    try:
        recorded = json.loads(read_bounded(run_dir, os.path.join(run_dir, VERDICTS), VERDICTS_LIMIT, "not a judgement"))
    except FileNotFoundError:
        return None, f"the run directory names no golden run (no {VERDICTS}); {fix}"
    except (InputError, OSError, ValueError, RecursionError) as exc:
        return None, f"{VERDICTS} cannot be read ({exc}); {fix}"
    name = recorded.get("golden") if isinstance(recorded, dict) else None
    if not isinstance(name, str) or not name.strip() or name.strip() == ".":
        return None, f"{VERDICTS} names no golden run; {fix}"
    for candidate in (name, os.path.join(run_dir, name)):
        if os.path.isfile(os.path.join(candidate, "run.json")):
            return candidate, ""
    return None, f"the golden run {VERDICTS} names, {name}, no longer exists; {fix}"


def _unusable(message: str, as_json: bool) -> int:
    print(f"trainwreck check: cannot judge: {message}", file=sys.stderr)
    if as_json:
        json.dump({"valid": "unknown", "error": message, "verdicts": {}}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return EXIT_UNKNOWN


def print_table(judgement: Judgement, out: TextIO) -> None:
    """One line per verdict, its evidence indented below, then the overall word."""
    width = max(len(name) for name in judgement.verdicts)
    for name, verdict in judgement.verdicts.items():
        out.write(f"{verdict_word(verdict.valid):<8} {name:<{width}}  {verdict.summary}\n")
        for line in verdict.evidence:
            out.write(f"{'':<8} {'':<{width}}    - {line}\n")
    for note in judgement.notes:
        out.write(f"note: {note}\n")
    out.write(f"overall: {judgement.word}\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
