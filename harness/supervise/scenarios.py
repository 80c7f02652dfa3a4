"""Built-in scenarios: named fault plans with the invariants each one threatens.

A scenario is data. The CLI runs them (`trainwreck run NAME`, `trainwreck demo`),
the pytest plugin parametrises tests over them, and reports quote their question.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainwreck.trainer.config import TrainConfig
from trainwreck.trainer.errors import UnknownName


@dataclass(frozen=True)
class Scenario:
    name: str
    """Stable identifier used on the command line and in test ids."""
    summary: str
    """One line: what goes wrong."""
    question: str
    """The interview question this case answers (quoted by reports)."""
    threatens: tuple[str, ...]
    """Invariants this fault endangers; all six are judged regardless."""
    plan: tuple[dict[str, Any], ...] = ()
    """The fault plan (DESIGN.md plan format)."""
    world_sizes: tuple[int, ...] = (2,)
    """Planned world size per attempt; the last repeats."""
    config: dict[str, Any] = field(default_factory=dict)
    """Overrides of TrainConfig.tiny() (total_steps, ckpt_interval, ...)."""
    hang_timeout_s: float = 3.0
    """The watchdog's timeout for this scenario."""

    def about(self) -> dict[str, Any]:
        """What a report quotes of the scenario (recorded in run.json)."""
        return {"name": self.name, "summary": self.summary, "question": self.question,
                "threatens": list(self.threatens)}

    def train_config(self) -> TrainConfig:
        return TrainConfig.tiny(**{"total_steps": 16, "ckpt_interval": 4, **self.config})


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="kill-resume",
        summary="SIGKILL rank 1 before update 7; the job restarts from the step-4 checkpoint",
        question="How do you know a resumed run is the same run?",
        threatens=("coverage", "continuity", "atomicity", "progress"),
        plan=({"id": "kill-r1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 7},),
    ),
    Scenario(
        name="hang-detect",
        summary="SIGSTOP rank 1 at update 7: the watchdog must name it, dump stacks and restart",
        question="How do you find the rank that hangs?",
        threatens=("hang", "progress"),
        plan=({"id": "stop-r1", "kind": "signal", "rank": 1, "signal": "SIGSTOP", "step": 7,
               "expect": "hang"},),
        # Saves at 6 and 12: the polled trigger has five steps of margin before it could
        # land in a checkpoint phase, whose watchdog budget is longer than the hang bound.
        config={"ckpt_interval": 6},
    ),
    Scenario(
        name="shrink-world",
        summary="4 ranks lose a node of 2 mid-epoch; the job resumes on 2 ranks",
        question="What breaks when the world size changes?",
        threatens=("coverage", "continuity", "progress"),
        plan=({"id": "node-loss", "kind": "node_loss", "ranks": [2, 3], "signal": "SIGKILL", "step": 7},),
        world_sizes=(4, 2),
        config={"dataset_size": 64},
    ),
    Scenario(
        name="sigterm-rank0",
        summary="SIGTERM the checkpoint writer (rank 0) right after a save; the job restarts",
        question="What is the most dangerous silent failure around a checkpoint?",
        threatens=("atomicity", "continuity", "progress"),
        plan=({"id": "term-r0", "kind": "signal", "rank": 0, "signal": "SIGTERM", "step": 9},),
    ),
    # ----- in-rank faults (faults/inrank.py): deterministic, they fire at a named fault point
    Scenario(
        name="crash-exception",
        summary="rank 1 raises an exception at the start of update 7; the job restarts from step 4",
        question="Does an exception in one rank take the whole job down cleanly?",
        threatens=("coverage", "continuity", "progress"),
        plan=({"id": "raise-r1", "kind": "kill", "rank": 1, "step": 7, "how": "exception"},),
    ),
    Scenario(
        name="hang-holding-gil",
        summary="rank 0 blocks in C holding the GIL at update 6; no Python thread of it runs again",
        question="How do you find a hang when the hung process cannot run any of its own code?",
        threatens=("hang", "progress"),
        plan=({"id": "gil-r0", "kind": "hang", "rank": 0, "step": 6, "how": "gil", "expect": "hang"},),
        hang_timeout_s=2.0,
    ),
    Scenario(
        name="straggler",
        summary="rank 1 is 0.3 s slower per update for updates 3-6; slow is not hung",
        question="How do you tell a straggler from a hang?",
        threatens=("hang", "progress"),
        plan=({"id": "slow-r1", "kind": "straggler", "rank": 1, "step": 3, "seconds": 0.3, "until": 6},),
    ),
    Scenario(
        name="corrupt-newest",
        summary="rank 1 dies before update 10; the newest checkpoint (step 8) is bit-flipped before the restart",
        question="What if the newest checkpoint is corrupt?",
        threatens=("atomicity", "continuity", "coverage"),
        plan=({"id": "kill-r1", "kind": "kill", "rank": 1, "step": 10},
              {"id": "flip-newest", "kind": "corrupt", "how": "flip", "attempt": 1}),
    ),
    Scenario(
        name="torn-save",
        summary="the first file of the step-8 save persists half its bytes, then rank 0 is SIGKILLed",
        question="What does a crash halfway through a checkpoint write leave behind?",
        threatens=("atomicity", "continuity"),
        plan=({"id": "torn-8", "kind": "torn_write", "step": 8},),
    ),
    Scenario(
        name="disk-full",
        summary="the first write of the step-8 save fails with ENOSPC; rank 0 dies and the job restarts",
        question="What happens when the disk fills up during a save?",
        threatens=("atomicity", "progress"),
        plan=({"id": "enospc-8", "kind": "storage_error", "step": 8, "errno": "ENOSPC"},),
    ),
    Scenario(
        name="slow-allreduce",
        summary="on 4 ranks, rank 2's gradient all-reduce of update 5 starts 0.5 s late",
        question="Does a slow collective look like a hang to your watchdog?",
        threatens=("hang", "replicas", "continuity"),
        plan=({"id": "delay-r2", "kind": "comm_delay", "rank": 2, "step": 5, "seconds": 0.5},),
        world_sizes=(4,),
    ),
    Scenario(
        name="slow-disk",
        summary="the first write of the step-8 save stalls for 0.5 s",
        question="Is a slow checkpoint a hung job?",
        threatens=("hang", "atomicity", "progress"),
        plan=({"id": "stall-8", "kind": "storage_stall", "step": 8, "seconds": 0.5},),
    ),
    # ----- asynchronous checkpoints (ckpt_mode="async"): the fault lands in the background
    # persist of the step-8 save while training has moved on; nothing may advance the commit.
    Scenario(
        name="async-kill-persist",
        summary="async checkpoints: rank 0 is SIGKILLed after the first file of the step-8 background persist",
        question="What does a crash during a background checkpoint write leave behind?",
        threatens=("atomicity", "continuity", "coverage"),
        plan=({"id": "kill-persist-8", "kind": "kill", "rank": 0, "step": 8, "point": "save.after_file"},),
        config={"ckpt_mode": "async"},
    ),
    Scenario(
        name="async-disk-full",
        summary="async checkpoints: the first write of the step-8 background persist fails with ENOSPC",
        question="Where does a failed background checkpoint write surface?",
        threatens=("atomicity", "progress"),
        plan=({"id": "enospc-persist-8", "kind": "storage_error", "step": 8, "errno": "ENOSPC"},),
        config={"ckpt_mode": "async"},
    ),
    Scenario(
        name="async-torn-persist",
        summary="async checkpoints: the first file of the step-8 background persist is torn, then rank 0 is SIGKILLed",
        question="Can a torn background checkpoint write be restored?",
        threatens=("atomicity", "continuity"),
        plan=({"id": "torn-persist-8", "kind": "torn_write", "step": 8},),
        config={"ckpt_mode": "async"},
    ),
    # ----- FSDP (parallelism="fsdp"): every rank writes its own DCP shards, so faults reach
    # any rank's shard writes, and a resume on another world size reshards. FSDP has no DDP
    # comm hook, so the comm-fault scenarios have no FSDP variant (validate_plan refuses them).
    Scenario(
        name="fsdp-kill-resume",
        summary="FSDP: SIGKILL rank 1 before update 7; the job restarts from the step-4 sharded checkpoint",
        question="How do you know a resumed sharded run is the same run?",
        threatens=("coverage", "continuity", "atomicity", "progress"),
        plan=({"id": "kill-r1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 7},),
        config={"parallelism": "fsdp"},
    ),
    Scenario(
        name="fsdp-shrink-world",
        summary="FSDP: 4 ranks lose a node of 2 mid-epoch; the job reshards its checkpoint onto 2 ranks",
        question="Where can sharded checkpoint state stop mapping onto a new world size?",
        threatens=("coverage", "continuity", "progress"),
        plan=({"id": "node-loss", "kind": "node_loss", "ranks": [2, 3], "signal": "SIGKILL", "step": 7},),
        world_sizes=(4, 2),
        config={"dataset_size": 64, "parallelism": "fsdp"},
    ),
    Scenario(
        name="fsdp-torn-shard",
        summary="FSDP: rank 1's shard file of the step-8 save persists half its bytes, then rank 1 is SIGKILLed",
        question="What does a crash of a non-zero rank halfway through its shard write leave behind?",
        threatens=("atomicity", "continuity"),
        plan=({"id": "torn-r1-8", "kind": "torn_write", "rank": 1, "step": 8},),
        config={"parallelism": "fsdp"},
    ),
    Scenario(
        name="fsdp-corrupt-shard",
        summary="FSDP: rank 1 dies before update 10; rank 1's shard of the newest checkpoint is bit-flipped "
                "before the restart",
        question="What if one rank's shard of the newest checkpoint is corrupt?",
        threatens=("atomicity", "continuity", "coverage"),
        plan=({"id": "kill-r1", "kind": "kill", "rank": 1, "step": 10},
              {"id": "flip-shard", "kind": "corrupt", "how": "flip", "attempt": 1, "file": "__1_0.distcp"}),
        config={"parallelism": "fsdp"},
    ),
)


def scenario_names() -> list[str]:
    return [s.name for s in SCENARIOS]


def get_scenario(name: str) -> Scenario:
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    raise UnknownName(f"unknown scenario {name!r}; built-in scenarios: {', '.join(scenario_names())} "
                      "(`trainwreck scenarios` lists them)")
