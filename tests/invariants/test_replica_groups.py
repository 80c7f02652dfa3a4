"""The replica-group checkers (invariants/replica_groups.py) on hand-written histories: each
check fails on the broken variant and passes on the correct one, and `judge` picks them for a
run whose run.json declares replica groups."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainwreck.invariants.judge import judge
from trainwreck.invariants.loader import load_history
from trainwreck.invariants.replica_groups import (check_heal_continuity, check_replica_coverage,
                                                  check_replica_progress, coverage_figures, load_replica_run)

SIZE, BATCH, STEPS = 16, 4, 8  # two groups, a shard of 8 ids each: 2 updates an epoch


class Run:
    """A replica-group run being written: events per (group, incarnation), one clock."""

    def __init__(self, root: Path, claim: bool = False, heartbeat_s: float = 5.0) -> None:
        self.root, self.t = root, 1000.0
        self.files: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self.harness: list[dict[str, Any]] = []
        self.spec = {"format": "trainwreck-run/1", "dataset_size": SIZE, "global_batch": 2 * BATCH, "drop_last": True,
                     "total_steps": STEPS, "hang_timeout_s": 60, "world_sizes": [2], "faults": [],
                     "exactly_once": claim,
                     "replica_groups": {"groups": 2, "group_world_size": 1, "heartbeat_timeout_s": heartbeat_s,
                                        "join_timeout_s": 1.0}}

    def emit(self, group: int, inc: int, kind: str, dt: float = 0.01, **fields: Any) -> None:
        self.t += dt
        self.files.setdefault((group, inc), []).append(
            {"kind": kind, "t": self.t, "attempt": 0, "rank": group, "world_size": 2, "replica_group": group,
             "incarnation": inc, **fields})

    def update(self, group: int, inc: int, step: int, epoch: int, digest: str | None = None,
               participating: bool = True, dt: float = 0.01, participants: int = 2) -> None:
        shard = list(range(group * 8, group * 8 + 8))
        samples = shard[(step - 1) % 2 * BATCH:][:BATCH]
        self.emit(group, inc, "batch", dt, step=step, epoch=epoch, samples=samples)
        self.emit(group, inc, "commit", step=step, committed=True, participating=participating,
                  participants=participants, quorum_id=1)
        self.emit(group, inc, "step", step=step, loss=1.0, digest=digest or f"d{step}")

    def fault(self, group: int, fault_id: str = "k1") -> None:
        self.spec["faults"].append({"id": fault_id, "kind": "kill", "rank": group, "step": 1})
        self.emit(group, 0, "fault", fault_id=fault_id, detail="killed")

    def write(self, status: str = "completed", final: int = STEPS) -> Path:
        (self.root / "events").mkdir(parents=True)
        (self.root / "run.json").write_text(json.dumps(self.spec))
        for (g, inc), events in self.files.items():
            (self.root / "events" / f"a000-r{g:03d}-p{100 + inc}.jsonl").write_text(
                "".join(json.dumps(e) + "\n" for e in events))
        end = {"kind": "end", "t": self.t + 1, "status": status, "final_step": final}
        (self.root / "events" / "harness.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [*self.harness, end]))
        return self.root


def golden(root: Path, claim: bool = False) -> Run:
    run = Run(root, claim)
    for k in range(1, STEPS + 1):
        for g in (0, 1):
            run.update(g, 0, k, (k - 1) // 2)
    return run


def killed_and_healed(root: Path, heal_digest: str = "d4", claim: bool = False, stall_s: float = 5.0) -> Run:
    """Group 1 dies before update 3; group 0 pauses `stall_s`, trains 3-4 alone; group 1's restart
    heals at 4 and both train 5-8. The restart replays group 1's shard from its start."""
    run = Run(root, claim)
    for k in (1, 2):
        for g in (0, 1):
            run.update(g, 0, k, 0)
    run.fault(1)
    run.update(0, 0, 3, 1, dt=stall_s, participants=1)
    run.update(0, 0, 4, 1, participants=1)
    run.emit(0, 0, "heal_send", step=4, to_replica_ranks=[1], digest="d4")
    run.emit(1, 1, "heal", step=4, digest=heal_digest, source_replica_rank=0)
    for k in range(5, STEPS + 1):
        run.update(0, 0, k, (k - 1) // 2)
        run.update(1, 1, k, (k - 5) // 2, digest=None if heal_digest == "d4" else f"x{k}")
    return run


def test_a_heal_to_the_peers_committed_state_is_continuous(tmp_path: Path) -> None:
    verdict = check_heal_continuity(load_replica_run(killed_and_healed(tmp_path).write()))
    assert verdict.valid is True, verdict
    assert verdict.counts["heals"] == 1


def test_a_heal_that_lands_on_another_state_breaks_continuity(tmp_path: Path) -> None:
    verdict = check_heal_continuity(load_replica_run(killed_and_healed(tmp_path, heal_digest="other").write()))
    assert verdict.valid is False
    assert verdict.counts["bad_heals"] == 1 and verdict.counts["split_steps"] == STEPS - 4
    assert "healed at step 4 to other" in verdict.evidence[-1] or any("healed at step 4" in e for e in verdict.evidence)


def test_groups_committing_different_states_at_one_step_break_continuity(tmp_path: Path) -> None:
    run = golden(tmp_path)
    run.files[(1, 0)][-1]["digest"] = "split"
    verdict = check_heal_continuity(load_replica_run(run.write()))
    assert verdict.valid is False and verdict.counts["split_steps"] == 1
    assert f"step {STEPS}" in verdict.evidence[0]


def test_a_restarted_group_that_starts_over_without_a_peer_is_named_by_continuity(tmp_path: Path) -> None:
    run = golden(tmp_path)
    for k in (1, 2):  # group 1 back after everyone else: alone from the initial state
        run.update(1, 1, k, 0, digest=f"alone{k}", participants=1)
    verdict = check_heal_continuity(load_replica_run(run.write()))
    assert verdict.valid is False and verdict.counts["split_steps"] == 2
    assert any("group 1 incarnation 1 committed update 1 again with no heal and no restore" in e
               for e in verdict.evidence)


def test_a_skipped_step_number_without_a_heal_breaks_continuity(tmp_path: Path) -> None:
    run = golden(tmp_path)
    run.files[(0, 0)] = [e for e in run.files[(0, 0)] if e.get("step") != 3]
    verdict = check_heal_continuity(load_replica_run(run.write()))
    assert verdict.valid is False and verdict.counts["numbering_errors"] == 1
    assert "skipped to step 4 where 3 was next" in verdict.evidence[0]


def test_survivors_that_kept_training_within_the_heartbeat_bound_progress(tmp_path: Path) -> None:
    verdict = check_replica_progress(load_replica_run(killed_and_healed(tmp_path).write()))
    assert verdict.valid is True, verdict
    assert verdict.counts["alone_steps"] == [2] and 4.9 < verdict.counts["stall_s"][0] < 5.2


def test_a_survivor_pausing_past_heartbeat_plus_join_plus_slack_fails_progress(tmp_path: Path) -> None:
    verdict = check_replica_progress(load_replica_run(killed_and_healed(tmp_path, stall_s=20.0).write()))
    assert verdict.valid is False
    assert "paused 20.0" in verdict.summary


def test_survivors_that_never_commit_again_fail_progress(tmp_path: Path) -> None:
    run = Run(tmp_path)
    for g in (0, 1):
        run.update(g, 0, 1, 0)
    run.fault(1)
    verdict = check_replica_progress(load_replica_run(run.write(status="failed", final=1)))
    assert verdict.valid is False
    assert any("committed nothing until group 1 was back" in e for e in verdict.evidence)


def test_lossy_coverage_is_measured_and_not_failed_when_exactly_once_is_not_claimed(tmp_path: Path) -> None:
    run = load_replica_run(killed_and_healed(tmp_path).write())
    verdict = check_replica_coverage(run)
    assert verdict.valid is True and "measured, not judged" in verdict.summary
    # group 1's restart replays its shard: ids 8-15 used again in epochs 0 and 1
    assert verdict.counts["replayed"] == 8 and coverage_figures(run)[0]["replayed"] == 8


def test_a_job_claiming_exactly_once_whose_restart_replays_ids_is_invalid(tmp_path: Path) -> None:
    verdict = check_replica_coverage(load_replica_run(killed_and_healed(tmp_path, claim=True).write()))
    assert verdict.valid is False and "claims exactly-once" in verdict.summary


def test_a_job_claiming_exactly_once_that_keeps_it_is_valid(tmp_path: Path) -> None:
    verdict = check_replica_coverage(load_replica_run(golden(tmp_path, claim=True).write()))
    assert verdict.valid is True and "exactly once" in verdict.summary


def test_a_healing_steps_batch_counts_as_dropped(tmp_path: Path) -> None:
    run = golden(tmp_path)
    commit = next(e for e in run.files[(1, 0)] if e["kind"] == "commit" and e["step"] == STEPS)
    commit["participating"] = False  # the last epoch: its ids are read, never used
    assert coverage_figures(load_replica_run(run.write()))[(STEPS - 1) // 2]["dropped"] == BATCH


def test_a_survivor_that_crashes_while_its_peer_is_down_is_named_by_progress(tmp_path: Path) -> None:
    run = killed_and_healed(tmp_path)
    run.harness.append({"kind": "exit", "t": run.files[(1, 0)][-1]["t"] + 0.001, "rank": 0, "code": 1,
                        "replica_group": 0})
    verdict = check_replica_progress(load_replica_run(run.write()))
    assert verdict.valid is False
    assert "group 0 crashed (exit code 1) before group 1 was back" in verdict.evidence[0]


def test_a_group_the_harness_stopped_for_a_whole_job_restart_is_no_crash(tmp_path: Path) -> None:
    run = killed_and_healed(tmp_path)
    run.spec["replica_groups"]["restart"] = "job"
    run.harness.append({"kind": "exit", "t": run.files[(1, 0)][-1]["t"] + 0.001, "rank": 0, "code": -9,
                        "replica_group": 0, "stopped_by_harness": True})
    verdict = check_replica_progress(load_replica_run(run.write()))
    assert verdict.valid is True and "measured, not bounded" in verdict.summary


def test_judge_uses_the_replica_checkers_for_a_replica_run(tmp_path: Path) -> None:
    judgement = judge(load_history(killed_and_healed(tmp_path, heal_digest="other").write()))
    assert set(judgement.verdicts) == {"coverage", "continuity", "progress", "hang"}
    assert judgement.valid is False and judgement.verdicts["continuity"].valid is False
    assert not [n for n in judgement.notes if "commit" in n or "heal" in n]  # read, so not "ignored"
