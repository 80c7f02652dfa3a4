"""A benchmark job that says where it ran: `python -m tests.harness.job_probe [--sleep S] [--exit N]`
prints {"pid", "ppid"} as JSON on stdout and a line on stderr (the handbook's job runner's tests)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--exit", type=int, default=0)
    args = parser.parse_args()
    print("a warning on stderr", file=sys.stderr, flush=True)
    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid()}), flush=True)
    time.sleep(args.sleep)  # the runner's timeout is the thing under test, not a synchronisation
    sys.exit(args.exit)
