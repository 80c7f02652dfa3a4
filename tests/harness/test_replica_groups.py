"""A replica-group job is a JobSpec: a `ReplicaGroups` target (harness/supervise/spec.py) run
by the registered "replica-groups" launcher (harness/supervise/replicas.py). Checked without
torchft: its checks, its run.json, and whole runs of a stand-in trainer and lighthouse (shell
scripts), so the launcher's restarts are exercised in a second, not a minute."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.registry import LAUNCHERS, REPLICA_GROUPS, get_launcher
from trainwreck.harness.supervise import replicas
from trainwreck.harness.supervise.create_rundir import run_json
from trainwreck.harness.supervise.spec import JobSpec, SpecError
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.harness.supervise.spec import ReplicaGroups, replica_job_fields
from trainwreck.rundir.layout import RunDir, iter_events, read_run_json
from tests.harness.conftest import assert_no_leftover_processes

KILL = {"id": "k1", "kind": "kill", "rank": 1, "step": 3}
LIGHTHOUSE = {"id": "lh", "kind": "lighthouse_kill", "step": 2}
STAND_IN_LIGHTHOUSE = '#!/bin/sh\necho "Lighthouse listening on: http://127.0.0.1:29999"\nexec sleep 60\n'


def replica_job(**fields: Any) -> JobSpec:
    return JobSpec(**{"target": ReplicaGroups("python t.py"), **fields})


def stand_ins(tmp_path: Path, trainer: str) -> str:
    """A stand-in trainer script and, beside it, the lighthouse the launcher looks for there;
    the command that runs the trainer."""
    for name, text in (("trainer", f"#!/bin/sh\n{trainer}\n"), ("torchft_lighthouse", STAND_IN_LIGHTHOUSE)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    return shlex.quote(str(tmp_path / "trainer"))


def test_the_replica_groups_launcher_is_registered_and_a_replica_job_gets_it() -> None:
    kind = get_launcher("replica-groups")
    assert kind.serves == (REPLICA_GROUPS,) and kind.supervisor_class() is replicas.ReplicaSupervisor
    spec = replica_job(world_sizes=(4,), plan=[KILL, LIGHTHOUSE])
    assert spec.launcher == "replica-groups" and spec.launcher in LAUNCHERS
    written = run_json(spec)
    assert written["launcher"] == "replica-groups" and written["max_restarts"] == 0
    assert written["replica_groups"] == {"groups": 2, "group_world_size": 2, "restart": "group",
                                         "max_group_restarts": 3, "lost_groups": [], "heartbeat_timeout_s": 5.0,
                                         "join_timeout_s": 1.0}


def test_a_replica_run_names_its_registered_launcher_in_run_json_and_its_group_starts_at_the_end(
        tmp_path: Path) -> None:
    spec = replica_job(target=ReplicaGroups(stand_ins(tmp_path, "exit 0")), run_dir=tmp_path / "run")
    record = run_job(spec)
    assert record.status == "completed" and record.outcome == "completed"
    assert read_run_json(record.run_dir)["launcher"] == "replica-groups"
    end = [e for e in iter_events(record.run_dir) if e["kind"] == "end"]
    assert [(e["status"], e["group_starts"]) for e in end] == [("completed", {"0": 1, "1": 1})]
    assert (RunDir(record.run_dir).logs / "lighthouse.log").read_text().startswith("Lighthouse listening on")
    assert_no_leftover_processes()  # the stand-in lighthouse too
    judgement = spec.target.judge(record.run_dir, None)
    assert judgement.valid == "unknown" and "cannot be judged" in judgement.notes[0]  # it wrote no dataset fields


def test_a_failed_group_restarts_alone_while_the_other_finishes(tmp_path: Path) -> None:
    # Group 1's first incarnation fails; its restart and group 0 succeed.
    trainer = 'test "$TRAINWRECK_REPLICA_GROUP$TRAINWRECK_INCARNATION" = 10 && exit 3; sleep 2; exit 0'
    record = run_job(replica_job(target=ReplicaGroups(stand_ins(tmp_path, trainer)), run_dir=tmp_path / "run"))
    events = list(iter_events(record.run_dir))
    assert [(e["replica_group"], e["incarnation"]) for e in events if e["kind"] == "group_start"] == [
        (0, 0), (1, 0), (1, 1)]
    assert [e["code"] for e in events if e["kind"] == "exit" and e["replica_group"] == 1] == [3, 0]
    assert record.status == "completed" and events[-1]["group_starts"] == {"0": 1, "1": 2}
    assert_no_leftover_processes()


def test_groups_out_of_restarts_end_the_job_with_its_budget_exhausted(tmp_path: Path) -> None:
    # max_restarts is each group's budget: every group starts twice, then none is left.
    spec = replica_job(target=ReplicaGroups(stand_ins(tmp_path, "exit 3")), max_restarts=1, run_dir=tmp_path / "run")
    record = run_job(spec)
    assert (record.status, record.outcome) == ("failed", "budget_exhausted")
    assert [e["group_starts"] for e in iter_events(record.run_dir) if e["kind"] == "end"] == [{"0": 2, "1": 2}]


@pytest.mark.parametrize("fault", [
    {"id": "s1", "kind": "signal", "rank": 0, "signal": "SIGKILL", "step": 2},
    {"id": "s1", "kind": "storage_stall", "rank": 0, "seconds": 1.0},
])
def test_a_fault_kind_replica_groups_cannot_fire_is_refused_naming_it_and_the_kinds_they_take(
        fault: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=rf"fault\(s\) s1 \({fault['kind']}\): a replica-group job takes only "
                                        "kill, hang, lighthouse_kill"):
        replica_job(plan=[fault])


def test_the_reproduce_line_refuses_an_unsupported_kind_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    spec = replica_job()
    line = shlex.split(spec.target.reproduce(spec))
    job = json.loads(line[line.index("--spec") + 1])
    job["plan"] = [{"id": "n1", "kind": "node_loss", "ranks": [0, 1], "step": 2}]
    assert replicas.main(["--spec", json.dumps(job)]) == 2
    assert "fault(s) n1 (node_loss): a replica-group job takes only kill, hang, lighthouse_kill" in \
        capsys.readouterr().err


@pytest.mark.parametrize("fields, message", [
    ({"plan": [{**KILL, "rank": 2}]}, "rank 2 is outside the job's 2 ranks"),
    ({"plan": [{**LIGHTHOUSE, "rank": 0}]}, "a lighthouse_kill fault is"),
    ({"plan": [{**KILL, "point": "nowhere"}]}, "field 'point'='nowhere'"),
    ({"plan": [KILL, {**LIGHTHOUSE, "id": "k1"}]}, "fault id 'k1' appears twice"),
    ({"target": ReplicaGroups("python t.py", heartbeat_timeout_s=0)}, "heartbeat_timeout_s=0 must be a positive"),
    ({"world_sizes": (3,)}, r"world_sizes=\[3\] cannot be split into groups=2"),
    ({"world_sizes": (2, 4)}, r"give one world size, e.g. world_sizes=\(2,\)"),
    ({"target": ReplicaGroups("python t.py", lost_groups=(2,))}, r"lost_groups=\[2\]: \[2\] are not groups"),
    ({"target": ReplicaGroups("python t.py", restart="node")}, "restart='node' is not a restart scope"),
    ({"target": ReplicaGroups("python 't.py")}, "cannot be split into words"),
    ({"watchdog": "disabled"}, "planted defect"),
])
def test_a_replica_job_that_cannot_run_is_refused_before_anything_starts(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        replica_job(**fields)


def test_the_reproduce_line_rebuilds_the_same_job() -> None:
    spec = replica_job(target=ReplicaGroups("python t.py --steps 9", groups=2, lost_groups=(1,), restart="job"),
                       world_sizes=(4,), plan=[KILL, LIGHTHOUSE], hang_timeout_s=30.0, max_restarts=1)
    line = shlex.split(spec.target.reproduce(spec))
    assert line[:3] == ["python", "-m", "trainwreck.harness.supervise.replicas"]
    again = JobSpec(**replica_job_fields(line[line.index("--spec") + 1]))
    assert (again.target, again.plan, again.world_sizes, again.hang_timeout_s, again.max_restarts) == (
        spec.target, spec.plan, spec.world_sizes, spec.hang_timeout_s, spec.max_restarts)
    with pytest.raises(SpecError, match="--spec is not a replica-group job"):
        replica_job_fields('{"plan": []}')


# A stand-in rank that publishes "done" on its progress board; global rank 0 then never exits.
DONE_THEN_STUCK = (
    "import os, threading; from pathlib import Path; from trainwreck.trainer.progress import ProgressBoard; "
    "g = int(os.environ['TRAINWRECK_REPLICA_GROUP']) * int(os.environ['WORLD_SIZE']) + int(os.environ['RANK']); "
    "ProgressBoard(Path(os.environ['TRAINWRECK_RUN_DIR']), 0, g).publish(1, 'done'); "
    "threading.Event().wait() if g == 0 else None")


def test_a_replica_rank_stuck_after_done_is_dumped_killed_and_its_group_completes(tmp_path: Path) -> None:
    trainer = f"exec {shlex.quote(sys.executable)} -c {shlex.quote(DONE_THEN_STUCK)}"
    spec = replica_job(target=ReplicaGroups(stand_ins(tmp_path, trainer)), run_dir=tmp_path / "run",
                       hang_timeout_s=1.0, exit_timeout_s=2.0)
    record = run_job(spec)
    events = list(iter_events(record.run_dir))
    (overdue,) = [e for e in events if e["kind"] == "exit_overdue"]
    assert overdue["ranks"] == [0] and overdue["budget_s"] == 2.0 and overdue["after_s"] > 2.0, overdue
    exits = {e["rank"]: e for e in events if e["kind"] == "exit"}
    assert exits[0]["code"] == -9 and exits[0]["stopped_by_harness"] and exits[1]["code"] == 0, exits
    assert not [e for e in events if e["kind"] == "hang"], "a rank past done is exiting, not hung"
    assert (record.status, record.outcome) == ("completed", "completed")
    assert events[-1]["group_starts"] == {"0": 1, "1": 1}, "the finished group was not restarted"
    assert_no_leftover_processes()
