"""Children of `--cmd` ranks die with their attempt (issue 24, item 6): a child the rank
leaves behind in its process group, and a `setsid` child that left the group, are both
ended when the attempt ends, and the run's events name them (`leftover`)."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import psutil

from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.rundir.layout import iter_events

# One rank: start a plain child and a setsid child (each sleeps far longer than the test),
# record their pids, exit 0 without waiting for them.
RANK = textwrap.dedent("""
    import json, os, subprocess, sys
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    plain = subprocess.Popen(sleep)
    escaped = subprocess.Popen(sleep, start_new_session=True)
    with open(sys.argv[1] + "/pids-" + os.environ["RANK"] + ".json", "w") as out:
        json.dump({"plain": plain.pid, "setsid": escaped.pid}, out)
""")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_children_and_setsid_escapes_of_cmd_ranks_die_with_their_attempt_and_are_named(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    spec = JobSpec(target=Command(f"{sys.executable} {script} {tmp_path}"), world_sizes=(2,), plan=[],
                   hang_timeout_s=30.0, run_dir=tmp_path / "run", keep=True, max_restarts=0)
    pids = []
    try:
        run_job(spec)
        for rank in range(2):
            pids += json.loads((tmp_path / f"pids-{rank}.json").read_text()).values()
        assert len(pids) == 4
        survivors = [pid for pid in pids if alive(pid)]
        assert survivors == [], f"children outlived their attempt: {survivors}"
        named = {e["pid"] for e in iter_events(tmp_path / "run", batches=False) if e["kind"] == "leftover"}
        assert named == set(pids), named
    finally:
        for pid in pids:  # a failing build leaves them running: end them here, by pid
            if alive(pid):
                psutil.Process(pid).kill()
