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
"""
from __future__ import annotations

import math
import signal as _signal
from dataclasses import dataclass
from typing import Any, Mapping

from trainwreck.faults.errors import PlanError

EXTERNAL_KINDS = ("signal", "node_loss")
"""The kinds the harness applies from outside the ranks (faults/plan.py's HARNESS kinds are these)."""
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

    @property
    def signum(self) -> int:
        return int(SIGNALS[self.signal])

    def describe(self) -> str:
        when = f"step {self.step}" if self.step is not None else f"{self.at_s}s into the attempt"
        who = f"rank {self.ranks[0]}" if self.kind == "signal" else f"ranks {list(self.ranks)}"
        return f"{self.signal} to {who} at {when}"


def _int_field(raw: Mapping[str, Any], name: str, fid: str, minimum: int = 0) -> int:
    value = raw[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FaultError(f"fault {fid!r}: {name}={value!r} must be an integer >= {minimum}")
    return value


def parse_fault(raw: Mapping[str, Any]) -> ExternalFault:
    fid = str(raw.get("id", "?"))
    kind = raw["kind"]
    if kind == "signal":
        if "rank" not in raw:
            raise FaultError(f"fault {fid!r}: kind 'signal' needs 'rank' (an integer)")
        ranks: tuple[int, ...] = (_int_field(raw, "rank", fid),)
        default_signal = None
    else:
        value = raw.get("ranks")
        if not isinstance(value, list) or not value:
            raise FaultError(f"fault {fid!r}: kind 'node_loss' needs 'ranks', a non-empty list of integers")
        ranks = tuple(_int_field({"ranks": r}, "ranks", fid) for r in value)
        default_signal = "SIGKILL"
    name = raw.get("signal", default_signal)
    if not isinstance(name, str) or name not in SIGNALS:
        raise FaultError(f"fault {fid!r}: signal={name!r} is not one of {', '.join(SIGNALS)}")
    has_step, has_at = "step" in raw, "at_s" in raw
    if has_step == has_at:
        raise FaultError(f"fault {fid!r}: give exactly one of 'step' (an update number) or 'at_s' (seconds)")
    step = _int_field(raw, "step", fid, minimum=0) if has_step else None
    at_s = None
    if has_at:
        at_s = raw["at_s"]
        if not isinstance(at_s, (int, float)) or isinstance(at_s, bool) or not 0 <= at_s < math.inf:
            raise FaultError(f"fault {fid!r}: at_s={at_s!r} must be a number of seconds >= 0")
        at_s = float(at_s)
    if "attempt" in raw:
        raise FaultError(f"fault {fid!r}: field 'attempt' means 'exactly this attempt', which the harness cannot "
                         "promise for a signal; use 'from_attempt' (the first attempt that may fire it)")
    from_attempt = _int_field(raw, "from_attempt", fid) if "from_attempt" in raw else 0
    return ExternalFault(id=fid, kind=kind, ranks=ranks, signal=name, step=step, at_s=at_s,
                         from_attempt=from_attempt)


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
            if raw["kind"] in EXTERNAL_KINDS:
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
