"""In-rank fault injection: the ``Hooks`` the harness builds in every rank from the plan.

    hooks = build_hooks(plan)    # harness/launch/rank.py does this in every rank
    # trainer: hooks.bind(...); ddp.register_comm_hook(None, hooks.wrap_comm_hook(reduce)); hooks.wrap_storage(storage); hooks.point(...)

At ``bind`` the hooks keep only the faults of this rank and this attempt (so redo
work after a restart does not fire a fault again) and apply a between-attempts
corruption (faults/corrupt.py). Every fault writes its ``fault`` event - flushed at
once by the event log - before it acts, so the judge sees it even when the act is a
SIGKILL.

How each kind acts (docs/FAULTS.md has the table):

- kill: SIGKILL or SIGTERM to itself, ``os._exit(1)``, or a Python exception.
- hang: ``event`` waits on an Event nobody sets (GIL released); ``gil`` blocks in a C
  call that keeps the GIL (libc pause() through ctypes.PyDLL; see faults/blocking.py
  for why that and not a spin); ``sigstop`` stops itself, and if continued it stays
  blocked, so the fault is a hang whatever the harness does to wake it.
- straggler: sleeps `seconds` at its point (default the start) of each update in [step, until].
- comm_delay / comm_fail / skip_collective: ``wrap_comm_hook`` wraps the trainer's own
  gradient reduction (trainer/gradsync.py) on the faulty rank only, so every rank runs
  the same collectives except at the faulty update.
- nan_grad: writes NaN/inf into one element of the (already reduced) gradient at
  ``after_backward``, so this replica's parameters leave the others'; with at="local" into
  the rank's own gradient bucket inside the comm hook, before the all-reduce sums it into
  every rank's.
- noisy_neighbour / disk_contention: a child process takes a share of the rank's core, or
  writes to the run directory's disk, for bursts of updates on a period (faults/neighbour.py,
  faults/contention.py, their timing in faults/periodic.py). Like any in-rank kind whose
  declared injector is a class with `at_step` (a `StepInjector`), each is built and driven
  from its declaration in faults/plan.py KINDS alone: this module names no such kind.
- storage kinds: ``wrap_storage`` returns a ``FaultyStorage`` (faults/storage.py).
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from trainwreck.faults import blocking
from trainwreck.faults.corrupt import CannotAct, corrupt_run_dir
from trainwreck.faults.plan import COMM_HOOK_KINDS, HARNESS, KINDS, parse_plan, with_defaults
from trainwreck.faults.storage import STORAGE_KINDS, FaultyStorage, StepClock
from trainwreck.trainer import hooks as fp
from trainwreck.trainer.async_ckpt import current_save_step
from trainwreck.trainer.rundir import RunDir, RunDirError, iter_events, read_run_json

if TYPE_CHECKING:
    import torch

    from trainwreck.trainer.events import EventLog
    from trainwreck.trainer.gradsync import CommHook
    from trainwreck.trainer.storage import Storage

POINT_KINDS = ("kill", "hang", "nan_grad")
GATE_MAX_S = 5.0
"""The longest a rank waits for a harness fault's signal once the harness has recorded the fault."""
GATE_UNHEARD_S = 120.0
"""The longest a rank waits at a harness fault's step for the harness to record the fault at all:
a harness that polls fires in the poll that first reads the step, so only one that stopped
polling leaves a rank here this long."""
GATE_POLL_S = 0.005
COMM_KINDS = COMM_HOOK_KINDS


class InjectedFault(RuntimeError):
    """The exception a `kill` fault with how="exception" (or a comm_fail) raises."""


class StepInjector(Protocol):
    """An in-rank kind whose declared injector (faults/plan.py KINDS `injector`) is its own class:
    built in `bind` from the rank's faults of that kind and the run directory, told the start of
    every update."""

    def __init__(self, faults: list[dict[str, Any]], record: Callable[..., None], rank: int, root: Path) -> None: ...

    def at_step(self, step: int) -> None: ...


@cache
def step_injectors() -> dict[str, type[StepInjector]]:
    """Every kind whose declaration names a StepInjector class: adding such a kind is its
    declaration and its class, with no edit to FaultHooks."""
    found: dict[str, type[StepInjector]] = {}
    for name, kind in KINDS.items():
        module, _, attr = kind.injector.partition(":")
        if kind.where == HARNESS or not attr or "." in attr:  # a FaultHooks method, or not the rank's
            continue
        obj = getattr(importlib.import_module(module), attr, None)
        if isinstance(obj, type) and callable(getattr(obj, "at_step", None)):
            found[name] = obj
    return found


class FaultHooks:
    """Fires the plan's in-rank faults in one rank (implements trainer.hooks.Hooks)."""

    def __init__(self, plan: list[dict[str, Any]]) -> None:
        faults = [with_defaults(f) for f in parse_plan(plan).faults]
        self.plan = [f for f in faults if KINDS[f["kind"]].where != HARNESS]
        # The harness's faults at a step: the rank waits at that step's start for the signal,
        # so it lands exactly there, not an update or two later (the harness polls boards).
        self.harness_at_step = [f for f in faults if KINDS[f["kind"]].where == HARNESS and f.get("step") is not None]
        self.gates: list[dict[str, Any]] = []
        self.gate_s = 0.0
        self.harness_log = Path()
        self.events: EventLog | None = None
        self.rank, self.world_size, self.attempt = -1, 0, -1
        self.clock = StepClock()
        self.mine: list[dict[str, Any]] = []
        self.fired: set[str] = set()
        self.per_update: list[StepInjector] = []

    # ----- Hooks protocol -----------------------------------------------------------------

    def bind(self, events: EventLog, rank: int, world_size: int, attempt: int) -> None:
        self.events, self.rank, self.world_size, self.attempt = events, rank, world_size, attempt
        # A fault fires in its own attempt only: redo work after a restart replays steps.
        self.mine = [f for f in self.plan if f["attempt"] == attempt and f.get("rank", 0) == rank]
        run = RunDir.of_events_file(events.path)
        self.per_update = [cls(mine, self.record, rank, run.root) for kind, cls in step_injectors().items()
                           if (mine := self.of_kind(kind))]
        for fault in self.of_kind("corrupt"):
            try:
                corrupt_run_dir(fault, events.path, self._record_corruption)
            except CannotAct as why:  # a missing target is the plan's gap, not a crash of this rank
                self.skip(fault, str(why))
        self._arm_gates(run)

    def point(self, name: str, step: int, **ctx: Any) -> None:
        if current_save_step() is None:  # a background persist's points do not move the training clock
            self.clock.step = step
        for fault in self.of_kind(*POINT_KINDS):
            if fault["id"] in self.fired or fault["step"] != step or fault.get("at") == "local":
                continue
            at = fault.get("point", fp.AFTER_BACKWARD if fault["kind"] == "nan_grad" else fp.STEP_START)
            if name == at:
                self.fired.add(fault["id"])
                self._act(fault, name, step, ctx)
        if name == fp.STEP_START:
            self._await_harness(step)
            for injector in self.per_update:
                injector.at_step(step)
        self._straggle(name, step)

    def wrap_storage(self, storage: Storage) -> Storage:
        faults = self.of_kind(*STORAGE_KINDS)
        return FaultyStorage(storage, faults, self.clock, self.record) if faults else storage

    def wrap_comm_hook(self, hook: CommHook) -> CommHook:
        if not self.of_kind(*COMM_KINDS) and not self._local_poisons():
            return hook

        # DDP checks the hook's annotations at run time, and this module's are strings
        # (postponed evaluation), so the hook it sees is an unannotated closure.
        def faulty(state, bucket):  # type: ignore[no-untyped-def]
            return self._comm_hook(hook, state, bucket)

        return faulty

    # ----- helpers ------------------------------------------------------------------------

    def of_kind(self, *kinds: str) -> list[dict[str, Any]]:
        return [f for f in self.mine if f["kind"] in kinds]

    def record(self, fault: dict[str, Any], detail: str, **extra: Any) -> None:
        """The `fault` event; kind "fault" is flushed by the event log before we go on to act."""
        assert self.events is not None, "bind() must run before a fault fires"
        self.fired.add(fault["id"])
        self.events.emit("fault", fault_id=fault["id"], rank=self.rank, detail=detail,
                         fault_kind=fault["kind"], **extra)

    def skip(self, fault: dict[str, Any], reason: str) -> None:
        """The `fault_skip` event of a fault that could not act: it never fired, and the
        judge's unknown says why (flushed at once, like `fault`)."""
        assert self.events is not None, "bind() must run before a fault is skipped"
        self.events.emit("fault_skip", fault_id=fault["id"], rank=self.rank, reason=reason,
                         fault_kind=fault["kind"])

    def _record_corruption(self, fault: dict[str, Any], detail: str, checkpoint: str | None = None) -> None:
        # rank null: the damage is the world's doing between attempts, not this rank's work.
        assert self.events is not None
        extra = {"checkpoint": checkpoint} if checkpoint is not None else {}
        self.fired.add(fault["id"])
        self.events.emit("fault", fault_id=fault["id"], rank=None, applied_by_rank=self.rank,
                         detail=detail, fault_kind="corrupt", **extra)

    # ----- waiting for the harness's signal --------------------------------------------------

    def _arm_gates(self, run: RunDir) -> None:
        """The harness faults this rank must wait for in this attempt: aimed at it, allowed
        from this attempt on, all their ranks present, and not fired in an earlier attempt."""
        if not self.harness_at_step:
            return
        try:
            hang_timeout_s = read_run_json(run.root).get("hang_timeout_s")
        except RunDirError:
            return  # no run.json: no harness runs this plan, so no signal would ever come
        self.harness_log = run.harness_events
        fired = {e.get("fault_id") for e in iter_events(run.root, batches=False) if e["kind"] == "fault"}
        for fault in self.harness_at_step:
            ranks = fault.get("ranks") or [fault["rank"]]
            if (self.rank in ranks and self.attempt >= fault.get("from_attempt", 0)
                    and max(ranks) < self.world_size and fault["id"] not in fired):
                self.gates.append(fault)
        # Well inside the watchdog's timeout: waiting must never look like a hang itself.
        timeout = hang_timeout_s if isinstance(hang_timeout_s, (int, float)) and hang_timeout_s > 0 else 2 * GATE_MAX_S
        self.gate_s = min(GATE_MAX_S, 0.5 * timeout)

    def _await_harness(self, step: int) -> None:
        """At the start of a harness fault's step, hold the rank until the harness has recorded the
        fault (its `fault` event in events/harness.jsonl), then give the signal it sends right after
        that event time to land: SIGKILL and SIGTERM end the process, SIGSTOP stops it, here.

        A fixed wait let a loaded machine's harness, polling late, signal the rank an update or two
        on, somewhere else (CI once dumped the SIGSTOPped rank outside this frame). Holding the
        rank longer never looks like a hang: the harness fires in the poll that first reads this
        step on the board, and that reading restarts the watchdog's clock. The loop calls nothing
        of trainer/ or faults/, so a stack dump taken while it waits names this frame."""
        due = [f for f in self.gates if step >= f["step"]]
        if not due:
            return
        for fault in due:
            self.gates.remove(fault)
        unheard = {f["id"] for f in due}
        read, deadline = 0, time.monotonic() + GATE_UNHEARD_S
        while unheard and time.monotonic() < deadline:
            try:
                with open(self.harness_log, "rb") as log:
                    log.seek(read)
                    chunk = log.read()
            except OSError:
                chunk = b""  # the harness writes its first event at the attempt's start: not there yet
            whole = chunk[:chunk.rfind(b"\n") + 1]  # a line being appended is read on the next pass
            read += len(whole)
            for line in whole.splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("kind") == "fault":
                    unheard.discard(event.get("fault_id"))
            if unheard:
                time.sleep(GATE_POLL_S)  # a poll with a deadline: a file append sends no notification
        if not unheard:
            time.sleep(self.gate_s)

    # ----- the point faults ---------------------------------------------------------------

    def _act(self, fault: dict[str, Any], name: str, step: int, ctx: dict[str, Any]) -> None:
        where = f"at {name} of update {step}"
        kind = fault["kind"]
        if kind == "kill":
            self._kill(fault, where)
        elif kind == "hang":
            self._hang(fault, where)
        elif kind == "nan_grad":
            self._poison_gradient(fault, where, ctx)

    def _kill(self, fault: dict[str, Any], where: str) -> None:
        how = fault["how"]
        self.record(fault, f"rank {self.rank} killed ({how}) {where}")
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "sigterm":
            # With the default disposition the process is gone before kill() returns; a
            # trainer that handles SIGTERM decides itself what happens next.
            os.kill(os.getpid(), signal.SIGTERM)
        elif how == "exit":
            os._exit(1)
        else:
            raise InjectedFault(f"fault {fault['id']!r}: injected exception in rank {self.rank} {where}")

    def _hang(self, fault: dict[str, Any], where: str) -> None:
        how = fault["how"]
        self.record(fault, f"rank {self.rank} hangs ({how}) {where}")
        if how == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
            blocking.releasing_gil()  # continued (e.g. to dump stacks): still hung
        elif how == "gil":
            blocking.holding_gil()
        else:
            blocking.releasing_gil()

    def _poison_gradient(self, fault: dict[str, Any], where: str, ctx: dict[str, Any]) -> None:
        import torch

        model = ctx.get("model")
        params = [p for p in model.parameters() if p.grad is not None] if model is not None else []
        if not params:
            return  # nothing to poison: no event, so the run says the fault never fired
        value = float(fault["value"])
        self.record(fault, f"rank {self.rank}: gradient element 0 of its first parameter set to {value} {where}")
        with torch.no_grad():
            params[0].grad.view(-1)[0] = value

    def _straggle(self, point: str, step: int) -> None:
        """The sleep lands in the phase the point opens: at step_start in data, at after_data in forward
        (a slower model), at after_forward in backward."""
        for fault in self.of_kind("straggler"):
            if point != fault.get("point", fp.STEP_START) or not fault["step"] <= step <= fault.get("until", step):
                continue
            if fault["id"] not in self.fired:
                until = fault.get("until")
                self.record(fault, f"rank {self.rank} slowed by {fault['seconds']} s per update from update "
                                   f"{fault['step']}" + (f" to {until}" if until is not None else ""))
            time.sleep(fault["seconds"])  # the slowness itself, not a synchronisation

    # ----- the communication hook ---------------------------------------------------------

    def _local_poisons(self) -> list[dict[str, Any]]:
        return [f for f in self.of_kind("nan_grad") if f.get("at") == "local"]

    def _comm_hook(self, reduce: CommHook, state: Any, bucket: Any) -> Any:
        for fault in self._local_poisons():
            if fault["id"] not in self.fired and fault["step"] == self.clock.step:
                where = f"in its own gradient (bucket {bucket.index()}) before the all-reduce of update {self.clock.step}"
                self.record(fault, f"rank {self.rank}: gradient element 0 set to {fault['value']} {where}")
                bucket.buffer().view(-1)[0] = float(fault["value"])
        for fault in self.of_kind(*COMM_KINDS):
            if fault["id"] in self.fired or fault["step"] != self.clock.step:
                continue
            result = self._comm_fault(fault, bucket)
            if result is not None:
                return result
        return reduce(state, bucket)

    def _comm_fault(self, fault: dict[str, Any], bucket: Any) -> Any:
        import torch

        where = f"in the gradient all-reduce (bucket {bucket.index()}) of update {self.clock.step}"
        kind = fault["kind"]
        if kind == "comm_delay":
            self.record(fault, f"rank {self.rank} delayed {fault['seconds']} s {where}")
            time.sleep(fault["seconds"])  # the delay itself
            return None
        if kind == "comm_fail":
            self.record(fault, f"rank {self.rank}: communication failure {where}")
            raise InjectedFault(f"fault {fault['id']!r}: injected communication failure {where}")
        # skip_collective: this rank does not take part in the all-reduce.
        if fault["then"] == "wait":
            self.record(fault, f"rank {self.rank} skipped the collective {where} and waits for its result")
            return torch.futures.Future()  # never completed: DDP waits on it forever
        self.record(fault, f"rank {self.rank} skipped the collective {where} and went on unreduced")
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer().div_(self.world_size))
        return done


def build_hooks(plan: list[dict[str, Any]]) -> FaultHooks:
    """The harness's entry point: hooks for the plan's in-rank faults (checked here too)."""
    return FaultHooks(plan)
