"""A benchmark job that says where its ranks' command server runs: `python -m
tests.harness.bench_job_probe [--thread]` runs a 2-rank rank_probe job (benchmarks/ranks.py
`run_ranks`) and prints, as JSON, its own pid, the server's pid, parent and command line, and the
ranks' parents. `--thread` first starts a second thread, as a threaded benchmark would have."""
from __future__ import annotations

import json
import os
import sys
import threading

from trainwreck.benchmarks.ranks import run_ranks
from trainwreck.harness.supervise.command import warm


def main() -> None:
    stop = threading.Event()
    if "--thread" in sys.argv:
        threading.Thread(target=stop.wait, daemon=True).start()
    result = run_ranks("tests.harness.rank_probe", 2, [], "probe")
    stop.set()
    server = warm._servers.server
    assert server is not None
    with open(f"/proc/{server.pid}/status") as f:
        parent = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
    with open(f"/proc/{server.pid}/cmdline", "rb") as f:
        cmdline = f.read().decode().split("\0")
    print(json.dumps({"job": os.getpid(), "server": server.pid, "server_parent": parent, "server_cmdline": cmdline,
                      "rank_parents": [r["ppid"] for r in result["ranks"]]}))


if __name__ == "__main__":
    main()
