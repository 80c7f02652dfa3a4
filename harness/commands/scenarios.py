"""trainwreck scenarios [--all | --family NAME] [--json]: list the declared scenarios.

Plain, it lists the built-ins (what `trainwreck run NAME` takes); --all and --family read
every suite's scenarios from the one registry (harness/supervise/scenarios.py `REGISTRY`), each under
its family, which says which command runs it.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from trainwreck.harness.supervise.scenarios import FAMILIES, REGISTRY, SCENARIOS, Entry


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable list")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every family's scenarios, not only the built-ins")
    which.add_argument("--family", choices=list(FAMILIES), help="one family's scenarios")


def main(args: argparse.Namespace) -> int:
    if args.all or args.family:
        return _list_entries(REGISTRY.entries(args.family), args.json)
    if args.json:
        print(json.dumps([{"name": s.name, "summary": s.summary, "threatens": list(s.threatens),
                           "world_sizes": list(s.world_sizes), "plan": list(s.plan)} for s in SCENARIOS],
                         indent=1))
        return 0
    width = max(len(s.name) for s in SCENARIOS)
    for s in SCENARIOS:
        print(f"{s.name:<{width}}  {s.summary}")
        print(f"{'':<{width}}  threatens: {', '.join(s.threatens)}; world sizes {'→'.join(map(str, s.world_sizes))}")
    return 0


def _list_entries(entries: list[Entry], as_json: bool) -> int:
    if as_json:
        print(json.dumps([_entry_json(e) for e in entries], indent=1))
        return 0
    width = max(len(e.name) for e in entries)
    for family in dict.fromkeys(e.family for e in entries):
        print(f"{family}: {FAMILIES[family].help}")
        for e in (e for e in entries if e.family == family):
            print(f"  {e.name:<{width}}  {e.summary}")
    return 0


def _entry_json(entry: Entry) -> dict[str, Any]:
    return {"family": entry.family, "name": entry.name, "summary": entry.summary,
            "runner": FAMILIES[entry.family].runner}
