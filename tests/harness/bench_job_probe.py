"""A benchmark job that says where its ranks' command server runs: `python -m
tests.harness.bench_job_probe` runs a 2-rank rank_probe job (benchmarks/ranks.py `run_ranks`) and
prints, as JSON, its own pid and command line, the server's pid, parent and command line, and the
ranks' parents."""
from __future__ import annotations

import json
import os

from trainwreck.benchmarks.ranks import run_ranks
from trainwreck.harness.supervise.command import warm


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")[:-1]


def main() -> None:
    result = run_ranks("tests.harness.rank_probe", 2, [], "probe")
    server = warm._servers.server
    assert server is not None
    with open(f"/proc/{server.pid}/status") as f:
        parent = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
    print(json.dumps({"job": os.getpid(), "job_cmdline": cmdline(os.getpid()), "server": server.pid,
                      "server_parent": parent, "server_cmdline": cmdline(server.pid),
                      "rank_parents": [r["ppid"] for r in result["ranks"]]}))


if __name__ == "__main__":
    main()
