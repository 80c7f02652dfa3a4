"""A benchmark job that says where its ranks' command server runs: `python -m
tests.harness.bench_job_probe` runs a 2-rank rank_probe job (benchmarks/ranks.py `run_ranks`) and
prints, as JSON, its own pid and command line, the server's pid, parent and command line, and the
ranks' parents."""
from __future__ import annotations

import json
import os

import psutil

from trainwreck.benchmarks.ranks import run_ranks
from trainwreck.harness.supervise.command import warm


def main() -> None:
    result = run_ranks("tests.harness.rank_probe", 2, [], "probe")
    server = warm._servers.server
    assert server is not None
    job, served = psutil.Process(os.getpid()), psutil.Process(server.pid)
    print(json.dumps({"job": job.pid, "job_cmdline": job.cmdline(), "server": served.pid,
                      "server_parent": served.ppid(), "server_cmdline": served.cmdline(),
                      "rank_parents": [r["ppid"] for r in result["ranks"]]}))


if __name__ == "__main__":
    main()
