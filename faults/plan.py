"""Fault plans as data: a validated, JSON-serialisable list of faults, and a builder.

    plan = Plan().kill(rank=1, step=12).hang(rank=0, step=5, how="gil")
    plan.to_json()          # '[{"id": "kill-1", "kind": "kill", ...}, ...]'
    parse_plan(text)        # Plan, or PlanError naming the fault id and the field
    validate_plan(plan, cfg, world_sizes)   # also checks ranks and steps against the job

A fault is a flat dict with an `id`, a `kind` and the kind's fields (see KINDS and
docs/FAULTS.md). `parse_plan` checks the shape of every fault (known kind, known
fields, types, choices); `validate_plan` additionally checks it against the job: ranks
inside the world size of the attempt it fires in, steps inside total_steps, save
points only at steps that save. Both run before any process starts.
"""
from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Iterable, Iterator, Mapping, Sequence

from trainwreck.trainer import hooks as fp
from trainwreck.faults.errors import PlanError
from trainwreck.rundir.arguments import loads_strict
from trainwreck.rundir.errors import InputError
from trainwreck.trainer.config import TrainConfig

PLAN_EXAMPLE = '[{"id": "k1", "kind": "kill", "rank": 1, "step": 12}]'
"""What a plan looks like, for error messages."""
IN_RANK, STORAGE, BETWEEN, HARNESS = "in-rank", "in-rank storage", "between attempts", "harness"
FOREIGN = "in-rank foreign save"
"""Inside a framework's own checkpoint save (faults/foreign.py intercepts its file operations)."""




@dataclass(frozen=True)
class Field:
    """One field of a fault kind: its JSON types, whether it is required, its default."""

    types: tuple[type, ...]
    required: bool = False
    default: Any = None
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    doc: str = ""

    def describe_type(self) -> str:
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        names = {int: "an integer", float: "a number", str: "a string", list: "a list", bool: "true/false"}
        text = " or ".join(names.get(t, t.__name__) for t in self.types)
        return f"{text} >= {self.minimum:g}" if self.minimum is not None else text


@dataclass(frozen=True)
class Kind:
    """A fault kind: where it runs, its fields, what it threatens."""

    name: str
    where: str
    fields: dict[str, Field]
    doc: str
    threatens: tuple[str, ...]
    hangs: bool = False
    """True: the harness must detect a hang, so the fault needs `expect: "hang"`."""
    comm_hook: bool = False
    """True: it acts inside DDP's gradient communication hook, which FSDP does not have, so
    under parallelism="fsdp" it could never fire (validate_plan refuses it there)."""
    injector: str = ""
    """Its implementation, `module:attribute`: the one place that says which code fires it. The
    rank's hooks (faults/inrank.py), its storage wrapper (faults/storage.py) and the harness
    (faults/external.py) load it with `load_injector` and call it at the seams it acts at."""
    strategy: str = ""
    """Its Hypothesis strategy in faults/strategies.py: a function of a `Slot`."""
    topics: tuple[str, ...] = ()
    """The interview topics a report raises for it (report/angles.py QUESTIONS keys)."""
    command: bool = False
    """True: a `trainwreck run --cmd` job takes it (its probe, or the harness, can reach it)."""
    chaos: str = ""
    """What it does to the attempt it fires in, for `trainwreck chaos`: STOP, SLOW or DAMAGE."""
    no_chaos: str = ""
    """Why chaos never draws it against the reference trainer (then `chaos` is empty)."""

    def load_injector(self) -> Any:
        """The object `injector` names, imported once per name; PlanError naming the kind and
        its declaration when it cannot be (a typo must stop the build, not leave a fault unfired)."""
        try:
            return _load(self.injector)
        except Exception as exc:  # noqa: BLE001 - whatever stops the import, the fix is the declaration
            raise PlanError(f"kind {self.name!r} declares injector {self.injector!r}, which cannot be loaded "
                            f"({type(exc).__name__}: {exc}); give its `injector=` in faults/plan.py KINDS as "
                            "`module:attribute` naming the class or function that fires it") from None


@cache
def _load(dotted: str) -> Any:
    module, _, path = dotted.partition(":")
    found: Any = importlib.import_module(module)
    for part in path.split("."):
        found = getattr(found, part)
    return found


INT, NUM, STR = (int,), (int, float), (str,)


def _rank(required: bool = True, default: int | None = None) -> Field:
    return Field(INT, required, default, minimum=0, doc="the rank the fault acts in")


def _step(required: bool = True, default: int | None = None, doc: str = "") -> Field:
    return Field(INT, required, default, minimum=0, doc=doc or "fires before update `step`")


_ATTEMPT = Field(INT, default=0, minimum=0,
                 doc="the attempt it fires in (redo work after a restart does not fire it again)")
_FROM_ATTEMPT = Field(INT, default=0, minimum=0,
                      doc="the first attempt that may fire it: the harness waits for an attempt that has its "
                          "ranks and reaches its step; it fires at most once per run")
_POINT = Field(STR, default=fp.STEP_START, choices=fp.ALL_POINTS, doc="the fault point it fires at")
_EXPECT = Field(STR, choices=("hang",), doc='"hang": the harness must detect a hang')
_SECONDS = Field(NUM, required=True, minimum=0, doc="seconds")


_PERIOD = {"step": _step(doc="the first update of the first burst"),
           "every": Field(INT, required=True, minimum=1, doc="the period, in updates"),
           "steps": Field(INT, default=1, minimum=1, doc="updates per burst"),
           "until": Field(INT, minimum=0, doc="no burst after this update (default: to the end)")}
"""The fields of a kind whose child process runs for bursts on a period (faults/periodic.py)."""


STOP, SLOW, DAMAGE = "stop", "slow", "damage"
"""What a fault does to its attempt, for chaos: ends it (a restart follows), slows it, or
damages the checkpoint store before it starts."""


def _kind(name: str, where: str, doc: str, threatens: tuple[str, ...], *, injector: str, strategy: str,
          topics: tuple[str, ...], chaos: str = "", no_chaos: str = "", command: bool = False,
          hangs: bool = False, comm_hook: bool = False, **fields: Field) -> Kind:
    common = {"id": Field(STR, required=True), "kind": Field(STR, required=True)}
    if where != HARNESS:
        common["attempt"] = _ATTEMPT
        common["expect"] = _EXPECT
    return Kind(name, where, {**common, **fields}, doc, threatens, hangs, comm_hook,
                injector=f"trainwreck.faults.{injector}", strategy=f"trainwreck.faults.strategies:{strategy}",
                topics=topics, command=command, chaos=chaos, no_chaos=no_chaos)


STORAGE_OPS = ("read", "write")
WRITE_ERRORS = ("ENOSPC", "EIO")
CORRUPTIONS = ("truncate", "flip", "delete_manifest", "tear_pointer", "stale_tmp", "break_newest_two")
CRASH_WHEN = ("before", "after", "torn")

KINDS: dict[str, Kind] = {k.name: k for k in (
    # ----- in-rank, at fault points -----------------------------------------------------
    _kind("kill", IN_RANK, "the rank dies at a fault point", ("progress", "continuity", "coverage", "atomicity"),
          injector="rankfaults:Kill", strategy="killed_ranks", topics=("resume", "frequency"), chaos=STOP,
          command=True,
          rank=_rank(), step=_step(), point=_POINT,
          how=Field(STR, default="sigkill", choices=("sigkill", "sigterm", "exit", "exception"),
                    doc="SIGKILL self, SIGTERM self, os._exit(1), or a Python exception")),
    _kind("hang", IN_RANK, "the rank stops making progress forever", ("hang", "progress"), hangs=True,
          injector="rankfaults:Hang", strategy="hung_ranks", topics=("hang",), chaos=STOP, command=True,
          rank=_rank(), step=_step(), point=_POINT,
          how=Field(STR, default="event", choices=("event", "gil", "sigstop"),
                    doc="wait on an Event (GIL released), block in C holding the GIL, or SIGSTOP self")),
    _kind("straggler", IN_RANK, "the rank is slower by `seconds` per update from `step` on", ("hang", "progress"),
          injector="rankfaults:Straggler", strategy="stragglers", topics=("hang",), chaos=SLOW,
          rank=_rank(), step=_step(), seconds=_SECONDS, point=_POINT,
          until=Field(INT, minimum=0, doc="last slow update (default: to the end)")),
    _kind("comm_delay", IN_RANK, "the rank's gradient all-reduce of update `step` starts `seconds` late",
          ("hang", "replicas", "continuity"), comm_hook=True, rank=_rank(), step=_step(), seconds=_SECONDS,
          injector="rankfaults:CommDelay", strategy="comm_delays", topics=("hang",), chaos=SLOW),
    _kind("comm_fail", IN_RANK, "the rank's gradient all-reduce of update `step` raises",
          ("progress", "continuity", "coverage"), comm_hook=True, rank=_rank(), step=_step(),
          injector="rankfaults:CommFail", strategy="comm_failures", topics=("resume",), chaos=STOP),
    _kind("nan_grad", IN_RANK, "one element of the rank's reduced gradient becomes NaN/inf at update `step`",
          ("replicas", "continuity"), rank=_rank(), step=_step(),
          injector="rankfaults:PoisonGradient", strategy="nan_grads", topics=("silent",),
          no_chaos="the reference trainer has no non-finite guard, so a NaN gradient is silent corruption "
                   "the judge reports as invalid: the chaos property would fail by design",
          value=Field(STR, default="nan", choices=("nan", "inf", "-inf")),
          at=Field(STR, default="reduced", choices=("reduced", "local"),
                   doc="reduced: at after_backward, in this replica's already reduced gradient (it alone leaves "
                       "the others); local: in the rank's own gradient as DDP hands it to the all-reduce, which "
                       "sums it into every rank's (a communicator-wide poison)")),
    _kind("skip_collective", IN_RANK, "the rank skips its gradient all-reduce of update `step` (a desync)",
          ("hang", "progress", "replicas"), hangs=True, comm_hook=True, rank=_rank(), step=_step(),
          injector="rankfaults:SkipCollective", strategy="skipped_collectives", topics=("silent",), chaos=STOP,
          then=Field(STR, default="wait", choices=("wait", "continue"),
                     doc="wait: the rank then waits for the missing result (others hang in the all-reduce); "
                         "continue: it goes on to its next collective (gloo aborts on the size mismatch)")),
    _kind("noisy_neighbour", IN_RANK, "a busy process takes `share` of the rank's core for `steps` updates "
          "every `every` updates from `step` on", ("hang", "progress"),
          injector="neighbour:NoisyNeighbour", strategy="noisy_neighbours", topics=("hang",), chaos=SLOW,
          rank=_rank(), **_PERIOD,
          share=Field(NUM, default=0.75, minimum=0, doc="the share of the core the neighbour takes (at most 0.95)")),
    _kind("disk_contention", IN_RANK, "a background process writes uncached `block_mb` MB blocks to the run "
          "directory's disk for `steps` updates every `every` updates from `step` on", ("hang", "progress"),
          injector="contention:DiskContention", strategy="disk_contentions", topics=("hang", "frequency"),
          chaos=SLOW, rank=_rank(), **_PERIOD,
          block_mb=Field(INT, default=4, minimum=1, doc="the size of each write, in MB (16 blocks are rewritten)")),
    # ----- in-rank, through the Storage seam ---------------------------------------------
    _kind("storage_stall", STORAGE, "matching storage ops take `seconds` longer", ("hang", "progress"),
          injector="storage:Stall", strategy="storage_stalls", topics=("hang", "frequency"),
          chaos=SLOW,
          rank=_rank(False, 0), step=_step(False, 0, "from update `step` on (0: from the attempt's restore)"),
          op=Field(STR, default="write", choices=STORAGE_OPS), seconds=_SECONDS,
          count=Field(INT, default=1, minimum=1, doc="how many ops to stall")),
    _kind("storage_throttle", STORAGE, "matching storage ops run at `bytes_per_s`", ("hang", "progress"),
          injector="storage:Throttle", strategy="storage_throttles", topics=("frequency", "hang"),
          chaos=SLOW,
          rank=_rank(False, 0), step=_step(False, 0, "from update `step` on (0: from the attempt's restore)"),
          op=Field(STR, default="write", choices=STORAGE_OPS),
          bytes_per_s=Field(NUM, required=True, minimum=1)),
    _kind("storage_error", STORAGE, "the `nth` write from update `step` on raises ENOSPC or EIO",
          ("atomicity", "progress", "continuity"),
          injector="storage:WriteError", strategy="storage_errors", topics=("silent", "frequency"),
          chaos=STOP,
          rank=_rank(False, 0), step=_step(False, 0, "count writes from update `step` on"),
          errno=Field(STR, default="ENOSPC", choices=WRITE_ERRORS), nth=Field(INT, default=1, minimum=1)),
    _kind("torn_write", STORAGE, "the `nth` write of the save at `step` persists half its bytes, then SIGKILL",
          ("atomicity", "continuity"), rank=_rank(False, 0), step=_step(doc="the update whose save is torn"),
          injector="storage:TornWrite", strategy="torn_writes", topics=("silent",), chaos=STOP,
          nth=Field(INT, default=1, minimum=1), file=Field(STR, doc="only writes of this file name count")),
    _kind("crash_op", STORAGE, "SIGKILL before/after the `op_index`-th mutating storage op of the save at `step`",
          ("atomicity", "continuity", "coverage"), rank=_rank(False, 0), step=_step(doc="the update whose save crashes"),
          injector="storage:CrashOp", strategy="crashed_ops", topics=("silent",), chaos=STOP,
          op_index=Field(INT, required=True, minimum=0, doc="0-based index among the save's mutating ops"),
          when=Field(STR, default="before", choices=CRASH_WHEN, doc="torn: a write persists half its bytes")),
    # ----- in-rank, inside a framework's own save (faults/foreign.py) -------------------
    _kind("foreign_crash", FOREIGN,
          "SIGKILL before/after the `op_index`-th file operation of a framework's save at `step`, or tear it",
          ("atomicity", "continuity", "coverage"), rank=_rank(False, 0),
          injector="foreign:ForeignSave", strategy="foreign_crashes", topics=("resume",), command=True,
          no_chaos="it fires only inside a framework's own save (a --cmd job); chaos runs the reference trainer",
          step=_step(doc="the framework's save after this update (the adapter says which saves exist)"),
          op_index=Field(INT, required=True, minimum=0,
                         doc="0-based index among the save's file operations (open for write, rename, remove, "
                             "mkdir, rmtree, torch.save, safetensors save_file)"),
          when=Field(STR, default="before", choices=CRASH_WHEN,
                     doc="torn: the written file is cut at a block boundary, then SIGKILL")),
    # ----- between attempts (rank 0 at bind of `attempt`) --------------------------------
    _kind("corrupt", BETWEEN, "damage checkpoint files before `attempt` selects one", ("atomicity", "continuity"),
          injector="corrupt:corrupt_run_dir", strategy="corruptions_of", topics=("silent",), chaos=DAMAGE,
          command=True,
          how=Field(STR, required=True, choices=CORRUPTIONS),
          target=Field(STR, default="newest", doc='"newest" committed checkpoint, or a name like step-00000008'),
          file=Field(STR, default="model.pt", doc="the file truncate/flip damage"),
          offset=Field(INT, minimum=0, doc="truncate: new size; flip: first byte (default: the middle)"),
          count=Field(INT, default=1, minimum=1, doc="flip: bytes to flip")),
    # ----- the harness's (faults/external.py applies them) -------------------------------
    _kind("signal", HARNESS, "the harness sends a signal to one rank", ("progress", "hang", "atomicity"),
          injector="external:Signal", strategy="signals", topics=("resume", "frequency"), chaos=STOP,
          command=True,
          rank=_rank(), signal=Field(STR, required=True, choices=("SIGKILL", "SIGSTOP", "SIGTERM")),
          step=_step(False), at_s=Field(NUM, minimum=0, doc="seconds after the attempt started"),
          from_attempt=_FROM_ATTEMPT, expect=_EXPECT),
    _kind("node_loss", HARNESS, "the harness kills a group of ranks at once", ("progress", "atomicity"),
          injector="external:NodeLoss", strategy="node_losses", topics=("world", "resume"), chaos=STOP,
          command=True,
          ranks=Field((list,), required=True, doc="a non-empty list of ranks"),
          signal=Field(STR, default="SIGKILL", choices=("SIGKILL", "SIGSTOP", "SIGTERM")),
          step=_step(False), at_s=Field(NUM, minimum=0, doc="seconds after the attempt started"),
          from_attempt=_FROM_ATTEMPT, expect=_EXPECT),
)}


def command_kinds() -> tuple[str, ...]:
    """The kinds a `trainwreck run --cmd` job takes (its probe's, the harness's and `corrupt`)."""
    return tuple(k.name for k in KINDS.values() if k.command)


def check_kinds(plan: Iterable[Mapping[str, Any]], supported: Sequence[str], job: str, why: str) -> None:
    """PlanError naming every fault of `plan` whose kind `job` cannot fire, and the kinds it can:
    the one refusal of every target that takes only some kinds (a --cmd run, replica groups).
    `why` says what the job lacks that the other kinds need."""
    refused = [f"{f.get('id')} ({f.get('kind')})" for f in plan if f.get("kind") not in supported]
    if refused:
        raise PlanError(f"fault(s) {', '.join(refused)}: {job} takes only {', '.join(supported)} ({why}); "
                        "remove the others")


class KindAttribute(Mapping[str, Any]):
    """A live read-only view `{kind name: one attribute of its declaration}`, for the modules
    that look a kind's attribute up by name (the report's topics): a kind declared later is in it."""

    def __init__(self, attribute: str) -> None:
        self.attribute = attribute

    def __getitem__(self, name: str) -> Any:
        return getattr(KINDS[name], self.attribute)

    def __iter__(self) -> Iterator[str]:
        return iter(KINDS)

    def __len__(self) -> int:
        return len(KINDS)


KIND_TOPICS = KindAttribute("topics")
"""Fault kind -> the report's interview topics it raises (report/angles.py reads it)."""

# Corruption is applied when attempt 1 starts unless the plan says otherwise.
_KIND_DEFAULTS = {"corrupt": {"attempt": 1}}


def defaults(kind: str) -> dict[str, Any]:
    """Every optional field's default for `kind` (what the injectors use when it is absent)."""
    out = {name: f.default for name, f in KINDS[kind].fields.items() if f.default is not None}
    out.update(_KIND_DEFAULTS.get(kind, {}))
    return out


def with_defaults(fault: Mapping[str, Any]) -> dict[str, Any]:
    return {**defaults(fault["kind"]), **fault}


# ----- checking one fault's shape --------------------------------------------------------


def _fid(raw: Mapping[str, Any], index: int) -> str:
    fid = raw.get("id")
    return repr(fid) if isinstance(fid, str) else f"#{index} (no valid id)"


def check_fault(raw: Any, index: int = 0) -> dict[str, Any]:
    """The fault as a plain dict if its shape is valid; else PlanError naming id and field."""
    if not isinstance(raw, Mapping):
        raise PlanError(f"fault #{index} is {raw!r}: each fault must be a JSON object with 'id' and 'kind'")
    fid = _fid(raw, index)
    if not isinstance(raw.get("id"), str) or not raw["id"]:
        raise PlanError(f"fault {fid}: field 'id'={raw.get('id')!r} must be a non-empty string")
    kind_name = raw.get("kind")
    if not isinstance(kind_name, str) or kind_name not in KINDS:  # a list is unhashable: `in` would raise
        raise PlanError(f"fault {fid}: field 'kind'={kind_name!r} is unknown; known kinds: {', '.join(KINDS)}")
    kind = KINDS[kind_name]
    for name, spec in kind.fields.items():
        if spec.required and name not in raw:
            raise PlanError(f"fault {fid}: kind {kind_name!r} needs field {name!r} ({spec.describe_type()})")
    for name, value in raw.items():
        if name not in kind.fields:
            hint = (" ('attempt' means exactly that attempt, which a signal cannot promise: use 'from_attempt')"
                    if name == "attempt" and "from_attempt" in kind.fields else "")
            raise PlanError(f"fault {fid}: field {name!r} is not a field of kind {kind_name!r}{hint}; "
                            f"its fields: {', '.join(kind.fields)}")
        _check_value(fid, name, value, kind.fields[name])
    _check_kind_rules(fid, kind, raw)
    return dict(raw)


def _check_value(fid: str, name: str, value: Any, spec: Field) -> None:
    # bool is an int in Python, never in a plan.
    ok = isinstance(value, spec.types) and not isinstance(value, bool)
    if ok and isinstance(value, float) and not math.isfinite(value):
        # A fault at Infinity seconds never fires (or never ends), and NaN passes every bound.
        raise PlanError(f"fault {fid}: field {name!r}={value!r} is not a finite number; give {spec.describe_type()}")
    if ok and spec.choices is not None:
        ok = value in spec.choices
    if ok and spec.minimum is not None:
        ok = value >= spec.minimum
    if not ok:
        raise PlanError(f"fault {fid}: field {name!r}={value!r} must be {spec.describe_type()}")


def _check_kind_rules(fid: str, kind: Kind, raw: Mapping[str, Any]) -> None:
    if kind.where == HARNESS:
        # The parser the harness will run decides (faults/external.py): its message names id and field.
        kind.load_injector().parse(raw)
    hang_expected = raw.get("expect") == "hang"
    # A SIGSTOPped rank is never continued, so the job hangs until the watchdog names it.
    stops = raw.get("signal") == "SIGSTOP"
    hangs = (kind.hangs and raw.get("then", "wait") == "wait") or stops
    if hangs and not hang_expected:
        what = "signal 'SIGSTOP' stops its rank for good, so the job hangs" if stops else f"kind {kind.name!r} hangs the job"
        raise PlanError(f"fault {fid}: {what}, and the harness must detect it: add \"expect\": \"hang\" "
                        "(without it the hang event is judged a false alarm)")
    if hang_expected and not hangs:
        raise PlanError(f"fault {fid}: field 'expect'='hang' but a {kind.name!r} fault does not hang the job "
                        "(a hang event would then be judged a false alarm); remove 'expect'")
    if kind.name == "straggler" and "until" in raw and raw["until"] < raw["step"]:
        raise PlanError(f"fault {fid}: field 'until'={raw['until']} is before step={raw['step']}")


# ----- the plan ----------------------------------------------------------------------


@dataclass
class Plan:
    """An ordered list of faults; builder methods append one and return the plan."""

    faults: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, *, id: str | None = None, **fields: Any) -> Plan:
        """Append a fault of `kind` (checked now); the id defaults to '<kind>-<n>'."""
        fault = {"id": id or self._next_id(kind), "kind": kind,
                 **{k: v for k, v in fields.items() if v is not None}}
        if KINDS.get(kind) is not None and KINDS[kind].hangs and fields.get("then", "wait") == "wait":
            fault.setdefault("expect", "hang")
        self.faults.append(check_fault(fault, len(self.faults)))
        _check_unique(self.faults)
        return self

    def _next_id(self, kind: str) -> str:
        taken = {f["id"] for f in self.faults}
        n = 1
        while f"{kind}-{n}" in taken:
            n += 1
        return f"{kind}-{n}"

    # One builder per kind, keyed by rank and step like the JSON fields.
    def kill(self, rank: int, step: int, how: str = "sigkill", point: str | None = None, **kw: Any) -> Plan:
        return self.add("kill", rank=rank, step=step, how=how, point=point, **kw)

    def hang(self, rank: int, step: int, how: str = "event", point: str | None = None, **kw: Any) -> Plan:
        return self.add("hang", rank=rank, step=step, how=how, point=point, **kw)

    def straggler(self, rank: int, step: int, seconds: float, **kw: Any) -> Plan:
        return self.add("straggler", rank=rank, step=step, seconds=seconds, **kw)

    def comm_delay(self, rank: int, step: int, seconds: float, **kw: Any) -> Plan:
        return self.add("comm_delay", rank=rank, step=step, seconds=seconds, **kw)

    def comm_fail(self, rank: int, step: int, **kw: Any) -> Plan:
        return self.add("comm_fail", rank=rank, step=step, **kw)

    def nan_grad(self, rank: int, step: int, value: str = "nan", at: str = "reduced", **kw: Any) -> Plan:
        return self.add("nan_grad", rank=rank, step=step, value=value, at=at, **kw)

    def skip_collective(self, rank: int, step: int, then: str = "wait", **kw: Any) -> Plan:
        return self.add("skip_collective", rank=rank, step=step, then=then, **kw)

    def storage_stall(self, seconds: float, op: str = "write", step: int = 0, **kw: Any) -> Plan:
        return self.add("storage_stall", seconds=seconds, op=op, step=step, **kw)

    def storage_throttle(self, bytes_per_s: float, op: str = "write", step: int = 0, **kw: Any) -> Plan:
        return self.add("storage_throttle", bytes_per_s=bytes_per_s, op=op, step=step, **kw)

    def storage_error(self, step: int = 0, errno: str = "ENOSPC", nth: int = 1, **kw: Any) -> Plan:
        return self.add("storage_error", step=step, errno=errno, nth=nth, **kw)

    def torn_write(self, step: int, nth: int = 1, file: str | None = None, **kw: Any) -> Plan:
        return self.add("torn_write", step=step, nth=nth, file=file, **kw)

    def crash_op(self, step: int, op_index: int, when: str = "before", **kw: Any) -> Plan:
        return self.add("crash_op", step=step, op_index=op_index, when=when, **kw)

    def corrupt(self, how: str, attempt: int = 1, target: str = "newest", **kw: Any) -> Plan:
        return self.add("corrupt", how=how, attempt=attempt, target=target, **kw)

    def signal(self, rank: int, signal: str, step: int | None = None, at_s: float | None = None,
               **kw: Any) -> Plan:
        if signal == "SIGSTOP":
            kw.setdefault("expect", "hang")
        return self.add("signal", rank=rank, signal=signal, step=step, at_s=at_s, **kw)

    def node_loss(self, ranks: Sequence[int], step: int | None = None, at_s: float | None = None,
                  **kw: Any) -> Plan:
        return self.add("node_loss", ranks=list(ranks), step=step, at_s=at_s, **kw)

    # ----- serialisation --------------------------------------------------------------

    def to_list(self) -> list[dict[str, Any]]:
        """The plan as JSON-ready dicts (what JobSpec.plan and run.json hold)."""
        return [dict(f) for f in self.faults]

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_list(), indent=indent)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.faults)

    def __len__(self) -> int:
        return len(self.faults)

    def kinds(self) -> set[str]:
        return {f["kind"] for f in self.faults}


def _check_unique(faults: Iterable[Mapping[str, Any]]) -> None:
    seen: set[str] = set()
    for fault in faults:
        if fault["id"] in seen:
            raise PlanError(f"fault {fault['id']!r}: field 'id' appears twice; ids must be unique")
        seen.add(fault["id"])


def parse_plan(source: str | bytes | Sequence[Mapping[str, Any]] | Plan) -> Plan:
    """A Plan from JSON text or a list of dicts; PlanError names the fault id and the field."""
    if isinstance(source, Plan):
        source = source.to_list()
    if isinstance(source, (str, bytes)):
        try:
            source = loads_strict(source, "plan", PLAN_EXAMPLE)
        except InputError as exc:
            raise PlanError(f"{exc}; a plan is a JSON list of fault objects") from None
    if not isinstance(source, (list, tuple)):
        raise PlanError(f"plan must be a JSON list of fault objects, got {type(source).__name__}")
    faults = [check_fault(raw, i) for i, raw in enumerate(source)]
    _check_unique(faults)
    return Plan(faults)


# ----- checking a plan against the job -----------------------------------------------


def save_steps(cfg: TrainConfig) -> list[int]:
    """The updates after which the trainer saves (the loop's rule)."""
    return cfg.save_steps()


def world_size_for(world_sizes: Sequence[int], attempt: int) -> int:
    return world_sizes[min(attempt, len(world_sizes) - 1)]


def validate_plan(plan: str | Sequence[Mapping[str, Any]] | Plan, cfg: TrainConfig,
                  world_sizes: Sequence[int]) -> Plan:
    """Parse `plan` and check every fault against the job; the Plan, or PlanError."""
    parsed = parse_plan(plan)
    sizes = list(world_sizes)
    if not sizes:
        raise PlanError("world_sizes is empty; give the world size of each attempt, e.g. [2]")
    for fault in parsed.faults:
        _check_against_job(with_defaults(fault), cfg, sizes)
    return parsed


def _check_against_job(fault: dict[str, Any], cfg: TrainConfig, sizes: list[int]) -> None:
    fid, kind = repr(fault["id"]), KINDS[fault["kind"]]
    if kind.comm_hook and cfg.parallelism != "ddp":
        raise PlanError(f"fault {fid}: kind {kind.name!r} acts in DDP's gradient communication hook, which "
                        f"parallelism={cfg.parallelism!r} does not have, so it could never fire; run it with "
                        "parallelism='ddp', or slow or stop the rank instead (a straggler, hang or kill fault)")
    if fault.get("at") == "local" and cfg.parallelism != "ddp":
        raise PlanError(f"fault {fid}: a nan_grad at='local' poisons the bucket DDP's communication hook "
                        f"hands to the all-reduce, which parallelism={cfg.parallelism!r} does not have; use "
                        "at='reduced', or parallelism='ddp'")
    attempt = fault.get("from_attempt" if kind.where == HARNESS else "attempt", 0)
    if kind.where == HARNESS:
        # The harness waits for an attempt that has the rank, so any later one will do.
        largest = max(sizes[min(attempt, len(sizes) - 1):])
        for rank in fault.get("ranks", [fault.get("rank")]):
            if rank >= largest:
                raise PlanError(f"fault {fid}: field 'rank{'s' if 'ranks' in fault else ''}' holds rank {rank}, "
                                f"outside world size {largest} (attempt {attempt} on); use a rank < {largest}")
    elif "rank" in fault:
        size = world_size_for(sizes, attempt)
        if fault["rank"] >= size:
            raise PlanError(f"fault {fid}: field 'rank'={fault['rank']} is outside the world size {size} of "
                            f"attempt {attempt}; use a rank < {size}")
    step = fault.get("step")
    if step is not None and step > cfg.total_steps:
        raise PlanError(f"fault {fid}: field 'step'={step} is beyond total_steps={cfg.total_steps}; "
                        f"use a step in 1..{cfg.total_steps}")
    if kind.where in (IN_RANK, FOREIGN) and step is not None and step < 1:
        raise PlanError(f"fault {fid}: field 'step'={step}: updates are numbered from 1")
    point = fault.get("point", fp.STEP_START)
    storage_in_save = fault["kind"] in ("torn_write", "crash_op")
    needs_save = point in fp.SAVE_POINTS or storage_in_save
    if needs_save or point == fp.SAVE_WAIT:
        # Rank 0 alone writes a DDP checkpoint and commits any checkpoint (the save points);
        # under FSDP every rank writes its own shards through its Storage.
        every_rank_writes = storage_in_save and cfg.parallelism == "fsdp"
        _check_save_step(fid, fault, cfg, point, writer_only=needs_save and not every_rank_writes)
    if fault["kind"] == "corrupt" and attempt == 0:
        raise PlanError(f"fault {fid}: field 'attempt'=0: corruption is applied when an attempt starts, and "
                        "attempt 0 finds no checkpoint to damage; use attempt >= 1 (after a kill or hang)")
    if fault["kind"] == "straggler" and fault.get("until", step) > cfg.total_steps:
        raise PlanError(f"fault {fid}: field 'until'={fault['until']} is beyond total_steps={cfg.total_steps}")


def _check_save_step(fid: str, fault: dict[str, Any], cfg: TrainConfig, point: str, writer_only: bool) -> None:
    saves = save_steps(cfg)
    if fault["step"] not in saves:
        raise PlanError(f"fault {fid}: field 'step'={fault['step']} has no checkpoint save, so "
                        f"{fault['kind']} at {point!r} would never fire; saves happen after updates "
                        f"{', '.join(map(str, saves))}")
    if writer_only and fault.get("rank", 0) != 0:
        raise PlanError(f"fault {fid}: field 'rank'={fault['rank']}: only rank 0 writes checkpoints (and commits "
                        "them); use rank 0, or parallelism='fsdp' for a storage fault in another rank's shard writes")
