"""Faults the harness applies from outside the ranks: signals to one rank or to a group.

Kinds (other kinds in a plan belong to in-rank injectors and are ignored here):

``signal``     {id, kind, rank, signal: SIGKILL|SIGSTOP|SIGTERM, step | at_s, [from_attempt], [expect]}
``node_loss``  {id, kind, ranks: [..], [signal: default SIGKILL], step | at_s, [from_attempt]}

``step`` fires once the rank's progress board reports step >= N (any phase; for a
node loss, once any of its ranks does); ``at_s`` fires that many seconds after the
attempt started. ``from_attempt`` (default 0) is the first attempt allowed to fire it (an
in-rank fault's ``attempt`` means exactly that attempt; a signal can only wait for one).
Each fault fires at most once per run. This module is pure: it decides what is
due, the supervisor records the ``fault`` event and sends the signal.

A harness kind is one declared ``where=HARNESS`` in faults/plan.py KINDS; its declared injector
is a ``HarnessKind`` subclass here (``Signal``, ``NodeLoss``) that says which ranks it signals,
so the parser asks the declaration and never the kind's name.
"""
from __future__ import annotations

import math
import signal as _signal
from dataclasses import dataclass
from typing import Any, Mapping

from trainwreck.faults.errors import PlanError
from trainwreck.faults.plan import HARNESS, KINDS

SIGNALS = {"SIGKILL": _signal.SIGKILL, "SIGSTOP": _signal.SIGSTOP, "SIGTERM": _signal.SIGTERM}
FaultError = PlanError
"""The same error as every other plan check raises (kept as a name for the harness's own callers)."""


@dataclass(frozen=True)
class ExternalFault:
    id: str
    """Unique fault id from the plan."""
    kind: str
    """signal or node_loss."""
    ranks: tuple[int, ...]
    """Ranks that receive the signal (one for kind signal)."""
    signal: str
    """Signal name, one of SIGNALS."""
    step: int | None
    """Fire when a target rank reports step >= this (None: use at_s)."""
    at_s: float | None
    """Fire this many seconds after the attempt started (None: use step)."""
    from_attempt: int
    """First attempt in which the fault may fire (it fires at most once per run)."""
    group: bool = False
    """True: its kind signals a group of ranks at once (HarnessKind.group)."""

    @property
    def signum(self) -> int:
        return int(SIGNALS[self.signal])

    @property
    def rank(self) -> int | None:
        """The one rank its `fault` event names; None for a group (the event lists `ranks`)."""
        return None if self.group else self.ranks[0]

    def describe(self) -> str:
        when = f"step {self.step}" if self.step is not None else f"{self.at_s}s into the attempt"
        who = f"ranks {list(self.ranks)}" if self.group else f"rank {self.ranks[0]}"
        return f"{self.signal} to {who} at {when}"


def _int_field(raw: Mapping[str, Any], name: str, fid: str, minimum: int = 0) -> int:
    value = raw[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FaultError(f"fault {fid!r}: {name}={value!r} must be an integer >= {minimum}")
    return value


class HarnessKind:
    """The injector a harness kind declares: it parses a fault of the kind into an ExternalFault.
    What differs between kinds (which ranks, the default signal) is a subclass, never an `if`."""

    default_signal: str | None = None
    """The signal when the fault names none (None: the fault must name one)."""
    group = False
    """True: it signals a group of ranks at once, so its event names no single rank."""

    @classmethod
    def targets(cls, raw: Mapping[str, Any], fid: str) -> tuple[int, ...]:
        raise NotImplementedError

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ExternalFault:
        fid = str(raw.get("id", "?"))
        ranks = cls.targets(raw, fid)
        name = raw.get("signal", cls.default_signal)
        if not isinstance(name, str) or name not in SIGNALS:
            raise FaultError(f"fault {fid!r}: signal={name!r} is not one of {', '.join(SIGNALS)}")
        step, at_s = _when(raw, fid)
        if "attempt" in raw:
            raise FaultError(f"fault {fid!r}: field 'attempt' means 'exactly this attempt', which the harness cannot "
                             "promise for a signal; use 'from_attempt' (the first attempt that may fire it)")
        from_attempt = _int_field(raw, "from_attempt", fid) if "from_attempt" in raw else 0
        return ExternalFault(id=fid, kind=raw["kind"], ranks=ranks, signal=name, step=step, at_s=at_s,
                             from_attempt=from_attempt, group=cls.group)


class Signal(HarnessKind):
    """`signal`: the signal the fault names, to its one `rank`."""

    @classmethod
    def targets(cls, raw: Mapping[str, Any], fid: str) -> tuple[int, ...]:
        if "rank" not in raw:
            raise FaultError(f"fault {fid!r}: kind {raw['kind']!r} needs 'rank' (an integer)")
        return (_int_field(raw, "rank", fid),)


class NodeLoss(HarnessKind):
    """`node_loss`: SIGKILL (or the signal it names) to every rank in `ranks` at once."""

    default_signal = "SIGKILL"
    group = True

    @classmethod
    def targets(cls, raw: Mapping[str, Any], fid: str) -> tuple[int, ...]:
        value = raw.get("ranks")
        if not isinstance(value, list) or not value:
            raise FaultError(f"fault {fid!r}: kind {raw['kind']!r} needs 'ranks', a non-empty list of integers")
        for r in value:
            if not isinstance(r, int) or isinstance(r, bool) or r < 0:
                raise FaultError(f"fault {fid!r}: field 'ranks' holds {r!r}; it must list integers >= 0")
        return tuple(value)


def _when(raw: Mapping[str, Any], fid: str) -> tuple[int | None, float | None]:
    """(step, at_s): exactly one of them is given."""
    has_step, has_at = "step" in raw, "at_s" in raw
    if has_step == has_at:
        raise FaultError(f"fault {fid!r}: give exactly one of 'step' (an update number) or 'at_s' (seconds)")
    if has_step:
        return _int_field(raw, "step", fid, minimum=0), None
    at_s = raw["at_s"]
    if not isinstance(at_s, (int, float)) or isinstance(at_s, bool) or not 0 <= at_s < math.inf:
        raise FaultError(f"fault {fid!r}: at_s={at_s!r} must be a number of seconds >= 0")
    return None, float(at_s)


def is_harness_kind(kind: Any) -> bool:
    """Whether `kind` names a kind the harness applies (declared where=HARNESS)."""
    return isinstance(kind, str) and kind in KINDS and KINDS[kind].where == HARNESS


def parse_fault(raw: Mapping[str, Any]) -> ExternalFault:
    """An external fault, parsed by its kind's declared injector (a HarnessKind)."""
    return KINDS[raw["kind"]].load_injector().parse(raw)


class ExternalFaults:
    """The external part of a plan, and which of its faults have fired."""

    def __init__(self, plan: list[Mapping[str, Any]]) -> None:
        seen: set[str] = set()
        self.faults: list[ExternalFault] = []
        for raw in plan:
            if not isinstance(raw.get("id"), str) or not isinstance(raw.get("kind"), str):
                # a list or an object is unhashable: the `in seen` below would raise TypeError
                raise FaultError(f"fault {raw!r} needs an 'id' and a 'kind', both strings")
            if raw["id"] in seen:
                raise FaultError(f"fault id {raw['id']!r} appears twice; ids must be unique")
            seen.add(raw["id"])
            if is_harness_kind(raw["kind"]):
                self.faults.append(parse_fault(raw))
        self.fired: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.faults)

    def pending(self) -> list[ExternalFault]:
        return [f for f in self.faults if f.id not in self.fired]

    def due(self, attempt: int, steps_by_rank: Mapping[int, int], elapsed_s: float,
            world_size: int) -> list[ExternalFault]:
        """Faults to fire now, marked fired. `steps_by_rank`: latest published step per rank."""
        out = []
        for fault in self.pending():
            if attempt < fault.from_attempt or any(r >= world_size for r in fault.ranks):
                continue  # not yet, or this attempt has no such rank (it may in a later one)
            if fault.at_s is not None:
                ready = elapsed_s >= fault.at_s
            else:
                ready = any(steps_by_rank.get(r, -1) >= fault.step for r in fault.ranks)  # type: ignore[operator]
            if ready:
                self.fired.add(fault.id)
                out.append(fault)
        return out
