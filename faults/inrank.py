"""In-rank fault injection: the ``Hooks`` the harness builds in every rank from the plan.

    hooks = build_hooks(plan)    # harness/launch/rank.py does this in every rank
    # trainer: hooks.bind(...); ddp.register_comm_hook(None, hooks.wrap_comm_hook(reduce)); hooks.wrap_storage(storage); hooks.point(...)

At ``bind`` the hooks keep only the faults of this rank and this attempt (so redo
work after a restart does not fire a fault again) and apply a between-attempts
corruption (faults/corrupt.py).

torchft injects by wrapping, never by ``if``: this module names no fault kind. Each kind's
declaration in faults/plan.py KINDS names its injector, and the injector's class says which
seam of the rank it acts at (``SEAMS``): the fault points (``AtPoint``), DDP's communication
hook (``InComm``), every update's start (``StepInjector``) or the rank's storage
(faults/storage.py ``StorageFault``). The hooks build the rank's injectors from their
declarations and call them there; what each built-in kind does is in faults/rankfaults.py,
faults/storage.py, faults/neighbour.py and faults/contention.py. A declared injector that
cannot be loaded, or acts at no seam, stops ``build_hooks`` with an error naming the kind
and its declaration, before the rank trains.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from trainwreck.faults.corrupt import CannotAct
from trainwreck.faults.plan import BETWEEN, HARNESS, IN_RANK, KINDS, STORAGE, PlanError, parse_plan, with_defaults
from trainwreck.faults.storage import FaultyStorage, StepClock, StorageFault
from trainwreck.trainer import hooks as fp
from trainwreck.trainer.async_ckpt import current_save_step
from trainwreck.rundir.layout import RunDir, RunDirError, iter_events, read_run_json

if TYPE_CHECKING:
    from trainwreck.rundir.events import EventLog
    from trainwreck.trainer.gradsync import CommHook
    from trainwreck.trainer.storage import Storage

RANK_WHERES = (IN_RANK, STORAGE, BETWEEN)
"""Where the kinds run that these hooks fire (the harness applies its own; a framework's save, CmdHooks)."""
GATE_MAX_S = 5.0
"""The longest a rank waits for a harness fault's signal once the harness has recorded the fault."""
GATE_UNHEARD_S = 120.0
"""The longest a rank waits at a harness fault's step for the harness to record the fault at all:
a harness that polls fires in the poll that first reads the step, so only one that stopped
polling leaves a rank here this long."""
GATE_POLL_S = 0.005


class Rank(Protocol):
    """What an injector built per fault may use of the rank it fires in (FaultHooks is it)."""

    rank: int
    world_size: int

    def record(self, fault: dict[str, Any], detail: str, **extra: Any) -> None: ...


@runtime_checkable
class AtPoint(Protocol):
    """Acts at the trainer's fault points (trainer/hooks.py): built per fault as
    ``cls(fault, hooks)`` at bind, told every point the rank reaches."""

    def at_point(self, point: str, step: int, ctx: dict[str, Any]) -> None: ...


@runtime_checkable
class InComm(Protocol):
    """Acts in DDP's gradient communication hook: built like AtPoint, asked about every bucket;
    a Future it returns replaces the bucket's all-reduce, None lets the all-reduce run."""

    def in_comm(self, step: int, bucket: Any) -> Any: ...


@runtime_checkable
class StepInjector(Protocol):
    """Acts at every update's start: built once per kind at bind from the rank's faults of that
    kind and the run directory (a child process per kind: faults/periodic.py)."""

    def __init__(self, faults: list[dict[str, Any]], record: Callable[..., None], rank: int, root: Path) -> None: ...

    def at_step(self, step: int) -> None: ...


SEAMS: tuple[type, ...] = (AtPoint, InComm, StepInjector, StorageFault)
"""The seams of a rank an injector can act at; its class's methods say which."""


def seams_of(kind: str) -> tuple[type, ...]:
    """The seams `kind`'s declared injector acts at (none for a between-attempts kind: it is
    a function the hooks call at bind); PlanError naming the kind and its declaration if the
    injector cannot be loaded, or acts at no seam, so it could never fire."""
    declared = KINDS[kind]
    injector = declared.load_injector()
    if declared.where == BETWEEN:
        return ()
    found = tuple(seam for seam in SEAMS if isinstance(injector, type) and issubclass(injector, seam))
    if not found:
        raise PlanError(f"kind {kind!r}: its injector {declared.injector!r} acts at no seam of a rank, so it "
                        "could never fire; give its class at_point, in_comm, at_step, or before and after "
                        "(faults/inrank.py SEAMS)")
    return found


def load_injectors() -> None:
    """Import every in-rank kind's injector now: the forkserver calls this, so a forked rank's
    build_hooks finds them loaded (about 3 ms per rank per attempt otherwise)."""
    for name, kind in KINDS.items():
        if kind.where in RANK_WHERES:
            seams_of(name)


class FaultHooks:
    """Fires the plan's in-rank faults in one rank (implements trainer.hooks.Hooks) through the
    injectors their kinds declare, at the seams those act at."""

    def __init__(self, plan: list[dict[str, Any]]) -> None:
        faults = [with_defaults(f) for f in parse_plan(plan).faults]
        self.plan = [f for f in faults if KINDS[f["kind"]].where in RANK_WHERES]
        # The registry of this plan's kinds, built before the rank trains: a declaration
        # that names nothing that can fire stops the rank here, naming the kind.
        self.seams = {kind: seams_of(kind) for kind in dict.fromkeys(f["kind"] for f in self.plan)}
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
        self.at_points: list[AtPoint] = []
        self.in_comm: list[InComm] = []
        self.per_update: list[StepInjector] = []

    # ----- Hooks protocol -----------------------------------------------------------------

    def bind(self, events: EventLog, rank: int, world_size: int, attempt: int) -> None:
        self.events, self.rank, self.world_size, self.attempt = events, rank, world_size, attempt
        # A fault fires in its own attempt only: redo work after a restart replays steps.
        self.mine = [f for f in self.plan if f["attempt"] == attempt and f.get("rank", 0) == rank]
        run = RunDir.of_events_file(events.path)
        self._build_injectors(run.root)
        for fault in self.mine:
            if KINDS[fault["kind"]].where == BETWEEN:
                self._between_attempts(fault, events.path)
        self._arm_gates(run)

    def point(self, name: str, step: int, **ctx: Any) -> None:
        if current_save_step() is None:  # a background persist's points do not move the training clock
            self.clock.step = step
        for injector in self.at_points:
            injector.at_point(name, step, ctx)
        if name == fp.STEP_START:
            self._await_harness(step)
            for each in self.per_update:
                each.at_step(step)

    def wrap_storage(self, storage: Storage) -> Storage:
        faults = self.faults_at(StorageFault)
        return FaultyStorage(storage, faults, self.clock, self.record) if faults else storage

    def wrap_comm_hook(self, hook: CommHook) -> CommHook:
        if not self.in_comm:
            return hook

        # DDP checks the hook's annotations at run time, and this module's are strings
        # (postponed evaluation), so the hook it sees is an unannotated closure.
        def faulty(state, bucket):  # type: ignore[no-untyped-def]
            return self._comm_hook(hook, state, bucket)

        return faulty

    # ----- helpers ------------------------------------------------------------------------

    def of_kind(self, *kinds: str) -> list[dict[str, Any]]:
        return [f for f in self.mine if f["kind"] in kinds]

    def faults_at(self, *seams: type) -> list[dict[str, Any]]:
        """This rank's faults whose kind's injector acts at any of `seams`."""
        return [f for f in self.mine if set(seams) & set(self.seams[f["kind"]])]

    def _build_injectors(self, root: Path) -> None:
        """One injector per fault at the points and in the comm hook (one object may serve both);
        one per kind at update starts, which owns that kind's child process."""
        kinds = dict.fromkeys(f["kind"] for f in self.faults_at(StepInjector))
        self.per_update = [KINDS[k].load_injector()(self.of_kind(k), self.record, self.rank, root) for k in kinds]
        built = [KINDS[f["kind"]].load_injector()(f, self) for f in self.faults_at(AtPoint, InComm)
                 if StepInjector not in self.seams[f["kind"]]]
        self.at_points = [each for each in built if isinstance(each, AtPoint)]
        self.in_comm = [each for each in built if isinstance(each, InComm)]

    def _between_attempts(self, fault: dict[str, Any], events_path: Path) -> None:
        """A between-attempts kind's injector (corrupt: faults/corrupt.py corrupt_run_dir) damages
        the run directory's store as this attempt binds."""
        try:
            KINDS[fault["kind"]].load_injector()(fault, events_path, self._record_corruption)
        except CannotAct as why:  # a missing target is the plan's gap, not a crash of this rank
            self.skip(fault, str(why))

    def record(self, fault: dict[str, Any], detail: str, **extra: Any) -> None:
        """The `fault` event; kind "fault" is flushed by the event log before we go on to act."""
        assert self.events is not None, "bind() must run before a fault fires"
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
        self.events.emit("fault", fault_id=fault["id"], rank=None, applied_by_rank=self.rank,
                         detail=detail, fault_kind=fault["kind"], **extra)

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

    # ----- the communication hook ---------------------------------------------------------

    def _comm_hook(self, reduce: CommHook, state: Any, bucket: Any) -> Any:
        for injector in self.in_comm:
            result = injector.in_comm(self.clock.step, bucket)
            if result is not None:
                return result
        return reduce(state, bucket)


def build_hooks(plan: list[dict[str, Any]]) -> FaultHooks:
    """The harness's entry point: hooks for the plan's in-rank faults (checked here too)."""
    return FaultHooks(plan)
