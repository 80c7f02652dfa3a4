"""Every scenario of every suite, declared once: the scenario registry, and the built-in ones.

A scenario is data: a named job a suite runs. The built-ins here are what `trainwreck run
NAME`, `trainwreck demo` and the pytest plugin run; the defects table (harness/suites/defects.py),
the handbook's plans and benchmark jobs (harness/suites/handbook.py), chaos's base job
(harness/suites/chaos.py), the frameworks table's rows (harness/suites/frameworks.py) and torchft's
replica-group rows (harness/suites/torchft_rows.py) declare theirs here too, each family with its
own job type and its own runner (`Family`). So `trainwreck scenarios --all` lists every
family, a name declared twice fails at import, and `tests/harness/test_scenario_registry.py`
fails on a suite that builds a scenario without declaring it.

Family modules and types are named as `module:attribute` strings (as harness/registry.py
names launchers) and loaded only when every family is listed: the suites sit above this
module (tests/test_architecture.py) and import it, never the reverse.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, TypeVar

from trainwreck.trainer.config import TrainConfig
from trainwreck.harness.registry import by_name
from trainwreck.rundir.errors import UnknownName

REFERENCE = "reference"
"""The namespace of the reference trainer's scenarios: their runs are keyed by scenario name (the
defects table's control-NAME folders, the handbook's controls), so no two families in it share a name."""


class Job(Protocol):
    """What the registry asks of any family's job: one line saying what goes wrong."""

    @property
    def summary(self) -> str: ...


J = TypeVar("J", bound=Job)


@dataclass(frozen=True)
class Family:
    """One suite's scenarios: where they are declared, what type their jobs are, what runs them."""

    name: str
    help: str
    """One line for `trainwreck scenarios --all`."""
    module: str
    """The module that declares the family's scenarios (imported to list them)."""
    job: str
    """`module:Class` of its jobs: declare() refuses any other type."""
    runner: str
    """`module:callable` that runs one of its jobs (each family has its own)."""
    namespace: str = REFERENCE
    """Families sharing a namespace may not share a name; frameworks rows repeat names per framework."""


class DuplicateScenario(ValueError):
    """A scenario name declared twice in one namespace; the message names both families."""


@dataclass(frozen=True)
class Entry:
    family: str
    name: str
    job: Any

    @property
    def summary(self) -> str:
        return str(self.job.summary)


BUILTIN = "builtin"
_SCENARIO = "trainwreck.harness.supervise.scenarios:Scenario"
_RUN_JUDGED = "trainwreck.harness.judge.runner:run_judged"
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family(BUILTIN, "the built-in scenarios: trainwreck run NAME, the demo, the pytest plugin",
           "trainwreck.harness.supervise.scenarios", _SCENARIO, _RUN_JUDGED),
    Family("defects", "the scenarios that expose the planted defects (trainwreck defects)",
           "trainwreck.harness.suites.defects", _SCENARIO, "trainwreck.harness.suites.defects:run_control"),
    Family("handbook", "the handbook's own plans (trainwreck handbook)",
           "trainwreck.harness.suites.handbook", _SCENARIO, _RUN_JUDGED),
    Family("measurements", "the handbook's benchmark jobs, each leaving a measurement directory",
           "trainwreck.harness.suites.handbook", "trainwreck.harness.suites.handbook:Measure",
           "trainwreck.harness.suites.handbook:run_measurement", namespace="measurements"),
    Family("chaos", "the job chaos draws random fault plans for (trainwreck chaos)",
           "trainwreck.harness.suites.chaos", _SCENARIO, "trainwreck.harness.suites.chaos:CaseRunner"),
    Family("frameworks", "a real trainer's row, run for each framework (trainwreck frameworks)",
           "trainwreck.harness.suites.frameworks", "trainwreck.harness.suites.frameworks:FrameworkScenario",
           "trainwreck.harness.suites.frameworks:run_one", namespace="frameworks"),
    Family("torchft", "torchft's replica-group rows (trainwreck frameworks --frameworks torchft)",
           "trainwreck.harness.suites.torchft_rows", "trainwreck.harness.suites.torchft_rows:Scenario",
           "trainwreck.harness.suites.torchft_rows:run_row", namespace="torchft"),
)}


def load(path: str) -> Any:
    """The object a `module:attribute` path names."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


class ScenarioRegistry:
    """Every declared scenario, keyed by (namespace, name), in declaration order."""

    def __init__(self, families: dict[str, Family]) -> None:
        self.families = families
        self._entries: dict[tuple[str, str], Entry] = {}

    def declare(self, family: str, jobs: Iterable[tuple[str, J]]) -> dict[str, J]:
        """Register each (name, job) of `family`; the suite keeps the returned table as its own."""
        kind = self._family(family)
        declared: dict[str, J] = {}
        for name, job in jobs:
            found = f"{type(job).__module__}:{type(job).__qualname__}"
            if found != kind.job:
                raise TypeError(f"{family} scenario {name!r} is a {found}; the family declares {kind.job}")
            key = (kind.namespace, name)
            if key in self._entries:
                raise DuplicateScenario(f"scenario {name!r} of {family} is already declared by "
                                        f"{self._entries[key].family}; give it another name")
            self._entries[key] = Entry(family, name, job)
            declared[name] = job
        return declared

    def entries(self, family: str | None = None) -> list[Entry]:
        """The declared scenarios of `family` (every family: each family module imported first)."""
        for name in [family] if family else self.families:
            importlib.import_module(self._family(name).module)
        ordered = sorted(self._entries.values(), key=lambda e: list(self.families).index(e.family))
        return [e for e in ordered if family in (None, e.family)]

    def _family(self, name: str) -> Family:
        if name not in self.families:
            raise UnknownName(f"unknown scenario family {name!r}; families: {', '.join(self.families)}")
        return self.families[name]


REGISTRY = ScenarioRegistry(FAMILIES)


def declare(family: str, jobs: Iterable[tuple[str, J]]) -> dict[str, J]:
    """Declare `family`'s scenarios in the one registry (see ScenarioRegistry.declare)."""
    return REGISTRY.declare(family, jobs)


def declare_scenarios(family: str, *scenarios: Scenario) -> tuple[Scenario, ...]:
    """Declare reference-trainer scenarios, each under its own name; returns them in order."""
    return tuple(declare(family, ((s.name, s) for s in scenarios)).values())


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


SCENARIOS: tuple[Scenario, ...] = declare_scenarios(
    BUILTIN,
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


CUSTOM = "custom"
"""The name of a job built on the command line (`trainwreck run --plan ...`): never declared, never recorded."""


def custom_scenario(summary: str = "a plan given on the command line") -> Scenario:
    """An undeclared job on the built-ins' defaults, for a plan given on the command line."""
    return Scenario(name=CUSTOM, summary=summary, question="", threatens=())


def scenario_names() -> list[str]:
    return [s.name for s in SCENARIOS]


def get_scenario(name: str) -> Scenario:
    return by_name(SCENARIOS, name, "scenario", hint=" (`trainwreck scenarios` lists them)")
