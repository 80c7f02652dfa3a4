"""What each in-rank kind does at the trainer's fault points and in DDP's communication hook.

One class per kind, named by the kind's `injector` in faults/plan.py KINDS. FaultHooks
(faults/inrank.py) builds one per fault at bind and calls it at the seams its methods name
(`at_point`, `in_comm`): nothing asks a fault its kind, so a new kind is its declaration and
its class. Every fault writes its ``fault`` event - flushed at once by the event log - before
it acts, so the judge sees it even when the act is a SIGKILL.

- kill: SIGKILL or SIGTERM to itself, ``os._exit(1)``, or a Python exception.
- hang: ``event`` waits on an Event nobody sets (GIL released); ``gil`` blocks in a C
  call that keeps the GIL (libc pause() through ctypes.PyDLL; see faults/blocking.py
  for why that and not a spin); ``sigstop`` stops itself, and if continued it stays
  blocked, so the fault is a hang whatever the harness does to wake it.
- straggler: sleeps `seconds` at its point (default the start) of each update in [step, until].
- comm_delay / comm_fail / skip_collective: inside the trainer's own gradient reduction
  (trainer/gradsync.py), which FaultHooks wraps on the faulty rank only, so every rank runs
  the same collectives except at the faulty update.
- nan_grad: writes NaN/inf into one element of the (already reduced) gradient at
  ``after_backward``, so this replica's parameters leave the others'; with at="local" into
  the rank's own gradient bucket inside the comm hook, before the all-reduce sums it into
  every rank's.
"""
from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any

from trainwreck.faults import blocking
from trainwreck.trainer import hooks as fp

if TYPE_CHECKING:
    import torch

    from trainwreck.faults.inrank import Rank

Fault = dict[str, Any]


class InjectedFault(RuntimeError):
    """The exception a `kill` fault with how="exception" (or a comm_fail) raises."""


class OnePoint:
    """A fault that acts once: at its `point` (else `default_point`) of update `step`."""

    default_point = fp.STEP_START

    def __init__(self, fault: Fault, hooks: Rank) -> None:
        self.fault, self.hooks, self.done = fault, hooks, False

    def at_point(self, point: str, step: int, ctx: dict[str, Any]) -> None:
        if self.done or step != self.fault["step"] or point != self.fault.get("point", self.default_point):
            return
        self.done = True  # before acting: redo work after a restart replays the update, not the fault
        self.act(f"at {point} of update {step}", ctx)

    def act(self, where: str, ctx: dict[str, Any]) -> None:
        raise NotImplementedError


class Kill(OnePoint):
    def act(self, where: str, ctx: dict[str, Any]) -> None:
        how = self.fault["how"]
        self.hooks.record(self.fault, f"rank {self.hooks.rank} killed ({how}) {where}")
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "sigterm":
            # With the default disposition the process is gone before kill() returns; a
            # trainer that handles SIGTERM decides itself what happens next.
            os.kill(os.getpid(), signal.SIGTERM)
        elif how == "exit":
            os._exit(1)
        else:
            raise InjectedFault(f"fault {self.fault['id']!r}: injected exception in rank {self.hooks.rank} {where}")


class Hang(OnePoint):
    def act(self, where: str, ctx: dict[str, Any]) -> None:
        self.hooks.record(self.fault, f"rank {self.hooks.rank} hangs ({self.fault['how']}) {where}")
        _hang(self.fault["how"])


def _hang(how: str) -> None:
    """Block forever, the way `how` says. A hung rank's stack dump shows this frame by its name
    (tests/frameworks/test_cmd.py looks for it there)."""
    if how == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
        blocking.releasing_gil()  # continued (e.g. to dump stacks): still hung
    elif how == "gil":
        blocking.holding_gil()
    else:
        blocking.releasing_gil()


class PoisonGradient(OnePoint):
    """at="reduced": at its point (after_backward) in the reduced gradient; at="local": in the
    first gradient bucket the comm hook is handed at its update, before the all-reduce."""

    default_point = fp.AFTER_BACKWARD

    def at_point(self, point: str, step: int, ctx: dict[str, Any]) -> None:
        if self.fault["at"] != "local":
            super().at_point(point, step, ctx)

    def act(self, where: str, ctx: dict[str, Any]) -> None:
        import torch

        model = ctx.get("model")
        params = [p for p in model.parameters() if p.grad is not None] if model is not None else []
        if not params:
            return  # nothing to poison: no event, so the run says the fault never fired
        value = float(self.fault["value"])
        self.hooks.record(self.fault, f"rank {self.hooks.rank}: gradient element 0 of its first parameter "
                                      f"set to {value} {where}")
        with torch.no_grad():
            params[0].grad.view(-1)[0] = value

    def in_comm(self, step: int, bucket: Any) -> None:
        if self.fault["at"] != "local" or self.done or step != self.fault["step"]:
            return
        self.done = True
        where = f"in its own gradient (bucket {bucket.index()}) before the all-reduce of update {step}"
        self.hooks.record(self.fault, f"rank {self.hooks.rank}: gradient element 0 set to {self.fault['value']} "
                                      f"{where}")
        bucket.buffer().view(-1)[0] = float(self.fault["value"])


class Straggler:
    """The sleep lands in the phase its point opens: at step_start in data, at after_data in
    forward (a slower model), at after_forward in backward."""

    def __init__(self, fault: Fault, hooks: Rank) -> None:
        self.fault, self.hooks, self.said = fault, hooks, False

    def at_point(self, point: str, step: int, ctx: dict[str, Any]) -> None:
        f = self.fault
        if point != f.get("point", fp.STEP_START) or not f["step"] <= step <= f.get("until", step):
            return
        if not self.said:
            self.said = True
            until = f.get("until")
            self.hooks.record(f, f"rank {self.hooks.rank} slowed by {f['seconds']} s per update from update "
                                 f"{f['step']}" + (f" to {until}" if until is not None else ""))
        time.sleep(f["seconds"])  # the slowness itself, not a synchronisation


class OneAllReduce:
    """A fault that acts once, in the first bucket of the rank's gradient all-reduce of update
    `step`: a Future it returns stands in for that bucket's all-reduce; None lets it run."""

    def __init__(self, fault: Fault, hooks: Rank) -> None:
        self.fault, self.hooks, self.done = fault, hooks, False

    def in_comm(self, step: int, bucket: Any) -> torch.futures.Future[torch.Tensor] | None:
        if self.done or step != self.fault["step"]:
            return None
        self.done = True
        return self.act(f"in the gradient all-reduce (bucket {bucket.index()}) of update {step}", bucket)

    def act(self, where: str, bucket: Any) -> torch.futures.Future[torch.Tensor] | None:
        raise NotImplementedError


class CommDelay(OneAllReduce):
    def act(self, where: str, bucket: Any) -> None:
        self.hooks.record(self.fault, f"rank {self.hooks.rank} delayed {self.fault['seconds']} s {where}")
        time.sleep(self.fault["seconds"])  # the delay itself


class CommFail(OneAllReduce):
    def act(self, where: str, bucket: Any) -> None:
        self.hooks.record(self.fault, f"rank {self.hooks.rank}: communication failure {where}")
        raise InjectedFault(f"fault {self.fault['id']!r}: injected communication failure {where}")


class SkipCollective(OneAllReduce):
    """This rank does not take part in the all-reduce: it waits for a result that never comes,
    or goes on with its own gradient as if reduced."""

    def act(self, where: str, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        import torch

        if self.fault["then"] == "wait":
            self.hooks.record(self.fault, f"rank {self.hooks.rank} skipped the collective {where} and waits "
                                          "for its result")
            return torch.futures.Future()  # never completed: DDP waits on it forever
        self.hooks.record(self.fault, f"rank {self.hooks.rank} skipped the collective {where} and went on unreduced")
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer().div_(self.hooks.world_size))
        return done
