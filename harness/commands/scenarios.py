"""trainwreck scenarios: list the built-in scenarios."""
from __future__ import annotations

import argparse
import json

from trainwreck.harness.supervise.scenarios import SCENARIOS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable list")


def main(args: argparse.Namespace) -> int:
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
