"""Hypothesis strategies for fault plans over this catalog (tests and `trainwreck chaos`).

    from trainwreck.faults.strategies import plans
    @given(plans(TrainConfig.tiny(), world_sizes=(2,)))
    def test_...(plan: Plan): ...

Bounds keep every generated plan valid (validate_plan passes) and every fault able to
fire: ranks inside the smallest world size, steps inside total_steps, at most one
hang per plan, at most two faults that end an attempt (any kind declared `chaos=STOP` in
faults/plan.py: kills, hangs, signals, failed writes, torn saves, ...), placed in
consecutive attempts at steps at least one checkpoint interval apart - so each
restart passes the next one's step and commits a newer checkpoint first (the
harness's no-progress guard) - and a corruption only in an attempt that follows one
that committed a checkpoint. A fault that acts inside a save sits at a save step.
Each kind's strategy is a function of a `Slot` that its declaration names
(`Kind.strategy`), so a new kind joins the plans by its declaration. Small delays (tens of milliseconds) keep runs short.
Under parallelism="fsdp" no fault acts in DDP's comm hook (there is none: validate_plan
refuses it), and a corruption damages a file a sharded checkpoint has (FSDP_FILES).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Sequence

from hypothesis import strategies as st

from trainwreck.faults.plan import CORRUPTIONS, DAMAGE, KINDS, SLOW, STOP, Plan, save_steps
from trainwreck.trainer.config import TrainConfig

Fault = dict[str, Any]

KILL_HOWS = ("sigkill", "sigterm", "exit", "exception")
FSDP_FILES = ("__0_0.distcp", ".metadata", "trainer.pt")
"""Files every sharded checkpoint has, whatever world size wrote it (rank 0's shard, DCP's
metadata, the trainer position); a DDP checkpoint's `model.pt`, the default, is not one."""
HANG_HOWS = ("event", "gil", "sigstop")


def _ranks(world_sizes: Sequence[int]) -> st.SearchStrategy[int]:
    return st.integers(0, min(world_sizes) - 1)


def _steps(cfg: TrainConfig, low: int = 1, high: int | None = None) -> st.SearchStrategy[int]:
    return st.integers(low, high if high is not None else cfg.total_steps)


def kills(cfg: TrainConfig, world_sizes: Sequence[int], attempt: int = 0, min_step: int = 1) -> st.SearchStrategy[Fault]:
    """A `kill` fault of any `how`, at a step start of `attempt`."""
    return st.fixed_dictionaries({
        "kind": st.just("kill"), "rank": _ranks(world_sizes), "step": _steps(cfg, min_step),
        "how": st.sampled_from(KILL_HOWS), "attempt": st.just(attempt)})


def hangs(cfg: TrainConfig, world_sizes: Sequence[int], attempt: int = 0, min_step: int = 1) -> st.SearchStrategy[Fault]:
    """A `hang` fault (expect: hang) of any `how`."""
    return st.fixed_dictionaries({
        "kind": st.just("hang"), "rank": _ranks(world_sizes), "step": _steps(cfg, min_step),
        "how": st.sampled_from(HANG_HOWS), "attempt": st.just(attempt), "expect": st.just("hang")})


def corruptions(attempt: int = 1, hows: Sequence[str] = CORRUPTIONS,
                parallelism: str = "ddp") -> st.SearchStrategy[Fault]:
    """A `corrupt` fault applied when `attempt` starts (to the newest committed checkpoint)."""
    fields = {"kind": st.just("corrupt"), "how": st.sampled_from(tuple(hows)), "attempt": st.just(attempt)}
    if parallelism == "fsdp":
        fields["file"] = st.sampled_from(FSDP_FILES)
    return st.fixed_dictionaries(fields)


# ----- one strategy per kind (faults/plan.py Kind.strategy names it) -------------------------


@dataclass(frozen=True)
class Slot:
    """Where a drawn fault must fit: its job, the attempt it fires in, its step window
    [low, high], how many checkpoints are committed before that attempt, and whether the
    plan already hangs once (at most one hang per plan)."""

    cfg: TrainConfig
    world_sizes: Sequence[int]
    attempt: int = 0
    low: int = 1
    high: int | None = None
    committed: int = 0
    hung: bool = False

    @property
    def last(self) -> int:
        return self.cfg.total_steps if self.high is None else self.high

    def steps(self) -> st.SearchStrategy[int]:
        return _steps(self.cfg, self.low, self.last)

    def saves(self) -> list[int]:
        """The save steps in the window (a fault inside a save must be at one)."""
        return [s for s in save_steps(self.cfg) if self.low <= s <= self.last]


def _at(slot: Slot, kind: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Fault]:
    return st.fixed_dictionaries({"kind": st.just(kind), "attempt": st.just(slot.attempt), **fields})


def _at_save(slot: Slot, kind: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Fault] | None:
    saves = slot.saves()
    return _at(slot, kind, step=st.sampled_from(saves), **fields) if saves else None


_SECONDS = st.sampled_from((0.01, 0.02, 0.05))


def stragglers(slot: Slot) -> st.SearchStrategy[Fault]:
    return _at(slot, "straggler", rank=_ranks(slot.world_sizes), step=slot.steps(), seconds=_SECONDS)


def noisy_neighbours(slot: Slot) -> st.SearchStrategy[Fault]:
    return _at(slot, "noisy_neighbour", rank=_ranks(slot.world_sizes), step=slot.steps(),
               every=st.integers(2, 4), steps=st.just(1), share=st.sampled_from((0.25, 0.5)))


def disk_contentions(slot: Slot) -> st.SearchStrategy[Fault]:
    return _at(slot, "disk_contention", rank=_ranks(slot.world_sizes), step=slot.steps(),
               every=st.integers(2, 4), steps=st.just(1), block_mb=st.sampled_from((1, 4)))


def comm_delays(slot: Slot) -> st.SearchStrategy[Fault]:
    return _at(slot, "comm_delay", rank=_ranks(slot.world_sizes), step=slot.steps(), seconds=_SECONDS)


def comm_failures(slot: Slot) -> st.SearchStrategy[Fault]:
    return _at(slot, "comm_fail", rank=_ranks(slot.world_sizes), step=slot.steps())


def nan_grads(slot: Slot) -> st.SearchStrategy[Fault]:
    return _at(slot, "nan_grad", rank=_ranks(slot.world_sizes), step=slot.steps(),
               value=st.sampled_from(("nan", "inf", "-inf")))


def skipped_collectives(slot: Slot) -> st.SearchStrategy[Fault] | None:
    """`then: wait` only (expect: hang), so not once the plan already hangs: with `continue`
    gloo either aborts the skipper or leaves its peer waiting in the all-reduce past the hang
    timeout, which the hang checker then calls a false alarm (chaos seed 11, case 6)."""
    if slot.hung:
        return None
    return _at(slot, "skip_collective", rank=_ranks(slot.world_sizes), step=slot.steps(),
               then=st.just("wait"), expect=st.just("hang"))


def storage_stalls(slot: Slot) -> st.SearchStrategy[Fault] | None:
    """A write stall fires at the first save at or after its step."""
    return _at_save(slot, "storage_stall", seconds=_SECONDS)


def storage_throttles(slot: Slot) -> st.SearchStrategy[Fault] | None:
    return _at_save(slot, "storage_throttle", bytes_per_s=st.sampled_from((2e6, 2e7)))


def storage_errors(slot: Slot) -> st.SearchStrategy[Fault] | None:
    """Rank 0 writes at every save (DDP and FSDP alike), so the first write of the save at `step` fails."""
    return _at_save(slot, "storage_error", errno=st.sampled_from(("ENOSPC", "EIO")))


def torn_writes(slot: Slot) -> st.SearchStrategy[Fault] | None:
    return _at_save(slot, "torn_write", nth=st.integers(1, 2))


def crashed_ops(slot: Slot) -> st.SearchStrategy[Fault] | None:
    """Rank 0's first ops of a save exist in every writer's save (remove and mkdir of the
    temporary directory, its first writes; docs/FAULTS.md lists them)."""
    return _at_save(slot, "crash_op", op_index=st.integers(0, 4), when=st.sampled_from(("before", "after", "torn")))


def foreign_crashes(slot: Slot) -> st.SearchStrategy[Fault]:
    return _at(slot, "foreign_crash", step=slot.steps(), op_index=st.integers(0, 3),
               when=st.sampled_from(("before", "after", "torn")))


def corruptions_of(slot: Slot) -> st.SearchStrategy[Fault] | None:
    """A corruption before `slot.attempt`, which follows one that committed a checkpoint."""
    if slot.committed < 1 or slot.attempt < 1:
        return None
    hows = CORRUPTIONS if slot.committed >= 2 else tuple(h for h in CORRUPTIONS if h != "break_newest_two")
    return corruptions(slot.attempt, hows, slot.cfg.parallelism)


def signals(slot: Slot) -> st.SearchStrategy[Fault]:
    """The harness signals a rank when its board shows `step` (SIGSTOP hangs: expect: hang)."""
    names = ("SIGKILL", "SIGTERM") if slot.hung else ("SIGKILL", "SIGTERM", "SIGSTOP")
    return st.fixed_dictionaries({
        "kind": st.just("signal"), "rank": _ranks(slot.world_sizes), "step": slot.steps(),
        "from_attempt": st.just(slot.attempt), "signal": st.sampled_from(names),
    }).map(lambda f: {**f, "expect": "hang"} if f["signal"] == "SIGSTOP" else f)


def node_losses(slot: Slot) -> st.SearchStrategy[Fault]:
    ranks = st.lists(_ranks(slot.world_sizes), min_size=1, max_size=min(slot.world_sizes), unique=True).map(sorted)
    return st.fixed_dictionaries({"kind": st.just("node_loss"), "ranks": ranks, "step": slot.steps(),
                                  "from_attempt": st.just(slot.attempt)})


def killed_ranks(slot: Slot) -> st.SearchStrategy[Fault]:
    return kills(slot.cfg, slot.world_sizes, slot.attempt, slot.low)


def hung_ranks(slot: Slot) -> st.SearchStrategy[Fault] | None:
    return None if slot.hung else hangs(slot.cfg, slot.world_sizes, slot.attempt, slot.low)


def strategy_for(kind: str, slot: Slot) -> st.SearchStrategy[Fault] | None:
    """The declared strategy of `kind` (faults/plan.py) in `slot`; None when no fault of it
    fits there (no save in the window, nothing committed, a comm-hook kind under FSDP)."""
    declared = KINDS[kind]
    if declared.comm_hook and slot.cfg.parallelism != "ddp":
        return None
    module, _, name = declared.strategy.partition(":")
    return getattr(importlib.import_module(module), name)(slot)


def _fitting(role: str, slot: Slot) -> dict[str, st.SearchStrategy[Fault]]:
    found = {k.name: strategy_for(k.name, slot) for k in KINDS.values() if k.chaos == role}
    return {name: s for name, s in found.items() if s is not None}


def chaos_kinds(role: str, slot: Slot) -> list[str]:
    """The kinds chaos draws in `role` (faults/plan.py Kind.chaos) that fit `slot`."""
    return list(_fitting(role, slot))


def drawn(role: str, slot: Slot) -> list[st.SearchStrategy[Fault]]:
    """The strategies of chaos_kinds(role, slot)."""
    return list(_fitting(role, slot).values())


def _hangs_job(fault: Fault) -> bool:
    return fault.get("expect") == "hang"


@st.composite
def plans(draw: st.DrawFn, cfg: TrainConfig, world_sizes: Sequence[int] = (2,), max_stops: int = 2) -> Plan:
    """A valid plan of at most a few faults that can all fire (see the module doc)."""
    stops: list[Fault] = []
    step, hung = 0, False
    for attempt in range(draw(st.integers(0, max_stops))):
        low = step + (cfg.ckpt_interval if attempt else 1)
        if low > cfg.total_steps:
            break
        fault = draw(st.one_of(*drawn(STOP, Slot(cfg, world_sizes, attempt, low, hung=hung))))
        hung = hung or _hangs_job(fault)
        step = fault["step"]
        stops.append(fault)
    extras: list[Fault] = []
    first_stop = stops[0]["step"] if stops else None
    if (first_stop is None or first_stop > 1) and draw(st.booleans()):
        high = cfg.total_steps if first_stop is None else first_stop - 1
        slows = drawn(SLOW, Slot(cfg, world_sizes, 0, 1, high))
        if slows:
            extras.append(draw(st.one_of(*slows)))
    committed = [s for s in save_steps(cfg) if stops and s < stops[0]["step"]]
    damages = drawn(DAMAGE, Slot(cfg, world_sizes, 1, committed=len(committed)))
    if damages and draw(st.booleans()):
        extras.append(draw(st.one_of(*damages)))
    plan = Plan()
    for fault in stops + extras:
        plan.add(fault.pop("kind"), **fault)
    return plan
