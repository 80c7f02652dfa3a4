"""Hypothesis strategies for fault plans over this catalog (tests and `trainwreck chaos`).

    from trainwreck.faults.strategies import plans
    @given(plans(TrainConfig.tiny(), world_sizes=(2,)))
    def test_...(plan: Plan): ...

Bounds keep every generated plan valid (validate_plan passes) and every fault able to
fire: ranks inside the smallest world size, steps inside total_steps, at most one
hang per plan, at most two faults that end an attempt (kills or the hang), placed in
consecutive attempts at steps at least one checkpoint interval apart - so each
restart passes the next one's step and commits a newer checkpoint first (the
harness's no-progress guard) - and a corruption only in an attempt that follows one
that committed a checkpoint. Small delays (tens of milliseconds) keep runs short.
Under parallelism="fsdp" no fault acts in DDP's comm hook (there is none: validate_plan
refuses it), and a corruption damages a file a sharded checkpoint has (FSDP_FILES).
"""
from __future__ import annotations

from typing import Any, Sequence

from hypothesis import strategies as st

from trainwreck.faults.plan import CORRUPTIONS, KINDS, Plan, save_steps
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


def slowdowns(cfg: TrainConfig, world_sizes: Sequence[int], before: int | None = None) -> st.SearchStrategy[Fault]:
    """A fault that slows attempt 0 without failing it - straggler, comm_delay, or a stalled
    checkpoint write - firing before update `before` (None: anywhere in the run)."""
    last = cfg.total_steps if before is None else before - 1
    seconds = st.sampled_from((0.01, 0.02, 0.05))
    options = [
        st.fixed_dictionaries({"kind": st.just("straggler"), "rank": _ranks(world_sizes),
                               "step": _steps(cfg, 1, last), "seconds": seconds}),
        st.fixed_dictionaries({"kind": st.just("comm_delay"), "rank": _ranks(world_sizes),
                               "step": _steps(cfg, 1, last), "seconds": seconds}),
    ]
    options = [o for o, kind in zip(options, ("straggler", "comm_delay"))
               if cfg.parallelism == "ddp" or not KINDS[kind].comm_hook]
    saves = [s for s in save_steps(cfg) if s <= last]
    if saves:  # a write stall fires at the first save at or after its step
        options.append(st.fixed_dictionaries({"kind": st.just("storage_stall"), "step": st.sampled_from(saves),
                                              "seconds": seconds}))
    return st.one_of(*options)


@st.composite
def plans(draw: st.DrawFn, cfg: TrainConfig, world_sizes: Sequence[int] = (2,), max_stops: int = 2) -> Plan:
    """A valid plan of at most a few faults that can all fire (see the module doc)."""
    stops: list[Fault] = []
    step, hung = 0, False
    for attempt in range(draw(st.integers(0, max_stops))):
        low = step + (cfg.ckpt_interval if attempt else 1)
        if low > cfg.total_steps:
            break
        options = [kills(cfg, world_sizes, attempt, low)] + ([] if hung else [hangs(cfg, world_sizes, attempt, low)])
        fault = draw(st.one_of(*options))
        hung = hung or fault["kind"] == "hang"
        step = fault["step"]
        stops.append(fault)
    extras: list[Fault] = []
    first_stop = stops[0]["step"] if stops else None
    if (first_stop is None or first_stop > 1) and draw(st.booleans()):
        extras.append(draw(slowdowns(cfg, world_sizes, before=first_stop)))
    committed = [s for s in save_steps(cfg) if stops and s < stops[0]["step"]]
    if committed and draw(st.booleans()):
        hows = CORRUPTIONS if len(committed) >= 2 else tuple(h for h in CORRUPTIONS if h != "break_newest_two")
        extras.append(draw(corruptions(1, hows, cfg.parallelism)))
    plan = Plan()
    for fault in stops + extras:
        plan.add(fault.pop("kind"), **fault)
    return plan
