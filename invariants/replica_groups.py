"""Judging replica-group runs (torchft): continuity across a heal, progress of the survivors,
and coverage as a measured quantity.

The classic checkers assume whole-job restarts: one lineage of attempts, each resuming from
a checkpoint. A replica-group job never restarts as a whole. One group dies and is started
again alone, heals its state from a live peer over the network, and the other groups keep
committing steps meanwhile. So the questions change:

- **continuity**: does a healed group hold exactly the state its peer had committed at that
  step (the `heal` digest equals the sender's `heal_send` digest and the peers' `step` digest
  there), do all groups that committed a step agree on it, and does every incarnation of a
  group number its updates without repeating or skipping one (a heal may move it forward)?
- **progress**: the job completed `total_steps`; after a group was lost, the others kept
  committing (they did not wait for it), and the longest pause of any survivor stayed within
  the lighthouse's heartbeat timeout plus its join timeout plus a stated slack;
- **coverage**: torchft's sampler gives every group a fixed shard, so a lost group's shard is
  not taken over, a restarted group replays its shard from the start, and a healing or failed
  step's batch is dropped. That is a design choice, so it is *measured* (replayed, dropped and
  never-seen ids per epoch) and held to exactly-once only when the job claims it (run.json
  `"exactly_once": true`): then any loss is a violation.

The run-format extension these read is in docs/DESIGN.md ("Replica groups"). The checkers
read the event files themselves (stdlib JSON, a torn last line skipped), so they depend on
nothing the classic loader keeps; `judge` calls them for a run whose run.json has
`replica_groups`.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainwreck.invariants.history import InputError
from trainwreck.invariants.verdict import UNKNOWN, Evidence, Verdict

STALL_SLACK_S = 3.0
"""Stated slack over heartbeat + join timeout for a survivor's pause (process start and
scheduling on a loaded machine): a pause longer than the sum is a violation."""


@dataclass
class ReplicaRun:
    """A replica-group run's events, in time order, and its run.json."""

    spec: dict[str, Any]
    events: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]

    @property
    def groups(self) -> int:
        return int(self.spec["replica_groups"]["groups"])

    @property
    def group_world_size(self) -> int:
        return int(self.spec["replica_groups"].get("group_world_size", 1))

    def group_of(self, event: dict[str, Any]) -> int | None:
        group = event.get("replica_group")
        if isinstance(group, int):
            return group
        rank = event.get("rank")
        return rank // self.group_world_size if isinstance(rank, int) else None


def is_replica_run(spec: dict[str, Any]) -> bool:
    return isinstance(spec.get("replica_groups"), dict)


def load_replica_run(run_dir: str | Path) -> ReplicaRun:
    root = Path(run_dir)
    spec = json.loads((root / "run.json").read_text())
    events: list[dict[str, Any]] = []
    notes: list[str] = []
    for path in sorted((root / "events").glob("*.jsonl")):
        lines = path.read_text(errors="replace").splitlines()
        for n, line in enumerate(lines):
            try:
                event = json.loads(line)
            except ValueError:
                if n == len(lines) - 1:
                    notes.append(f"skipped a torn last line in events/{path.name}")
                    continue
                raise InputError(f"events/{path.name} line {n + 1} is not JSON; the run cannot be judged") from None
            if isinstance(event, dict) and isinstance(event.get("t"), (int, float)):
                events.append(event)
    events.sort(key=lambda e: e["t"])
    return ReplicaRun(spec, events, notes)


# ----- continuity --------------------------------------------------------------------------


def check_heal_continuity(run: ReplicaRun) -> Verdict:
    steps = run.of("step")
    if not steps:
        return Verdict("continuity", UNKNOWN, "no step events: nothing says what state any group committed")
    evidence = Evidence()
    committed: dict[int, dict[tuple[int, int], str]] = defaultdict(dict)  # step -> (group, incarnation) -> digest
    for e in steps:
        committed[int(e["step"])][(run.group_of(e) or 0, int(e.get("incarnation", 0)))] = e.get("digest")
    split = [k for k, by in sorted(committed.items()) if len(set(by.values())) > 1]
    for k in split[:3]:
        evidence.add(f"step {k}: groups committed different states: " + ", ".join(
            f"group {g} (incarnation {i}) {d}" for (g, i), d in sorted(committed[k].items())))
    if split:
        for g, inc in _started_over(run):
            evidence.add(f"group {g} incarnation {inc} committed update 1 again with no heal and no restore: it "
                         "found no live peer and no checkpoint, and started over from the initial state")
    bad_heals = _check_heals(run, committed, evidence)
    numbering = _check_numbering(run, evidence)
    counts = {"committed_steps": len(committed), "split_steps": len(split), "heals": len(run.of("heal")),
              "bad_heals": bad_heals, "numbering_errors": numbering}
    if evidence:
        parts = [f"{len(split)} step(s) where groups disagree" if split else "",
                 f"{bad_heals} heal(s) whose state differs from the peer's" if bad_heals else "",
                 f"{numbering} step-numbering error(s)" if numbering else ""]
        return Verdict("continuity", False, "; ".join(p for p in parts if p), counts, evidence.listing())
    return Verdict("continuity", True, f"{len(committed)} committed step(s), every group agrees at each; "
                   f"{counts['heals']} heal(s), each equal to its peer's state at that step", counts)


def _started_over(run: ReplicaRun) -> list[tuple[int, int]]:
    """Restarted incarnations whose first record is a committed step 1 (no heal, no restore)."""
    first: dict[tuple[int, int], dict[str, Any]] = {}
    for e in run.events:
        if e.get("kind") in ("heal", "restore", "step") and int(e.get("incarnation", 0)) > 0:
            first.setdefault((run.group_of(e) or 0, int(e["incarnation"])), e)
    return sorted(k for k, e in first.items() if e["kind"] == "step" and e.get("step") == 1)


def _check_heals(run: ReplicaRun, committed: dict[int, dict[tuple[int, int], str]], evidence: Evidence) -> int:
    """Each heal against the state a peer served for it: the latest `heal_send` at that step by
    another group before the heal (else the latest `step` another group committed there). Whether
    that state agrees with the rest of the history is the split-step check's business."""
    bad = 0
    for heal in run.of("heal"):
        step, group, digest, t = heal.get("step"), run.group_of(heal), heal.get("digest"), float(heal["t"])
        if not isinstance(step, int):
            evidence.add(f"group {group}: a heal with no step (the transport never named what it fetched)")
            bad += 1
            continue
        served = [e for e in run.of("heal_send") if e.get("step") == step and run.group_of(e) != group
                  and float(e["t"]) <= t and e.get("digest") is not None]
        if not served:
            served = [e for e in run.of("step") if e.get("step") == step and run.group_of(e) != group
                      and float(e["t"]) <= t]
        if not served:
            evidence.add(f"group {group} healed at step {step}, but no peer recorded its state there")
            bad += 1
        elif served[-1].get("digest") != digest:
            peer = served[-1]
            evidence.add(f"group {group} incarnation {heal.get('incarnation')} healed at step {step} to {digest}; "
                         f"group {run.group_of(peer)} (incarnation {peer.get('incarnation')}) held "
                         f"{peer.get('digest')} there")
            bad += 1
    return bad


def _check_numbering(run: ReplicaRun, evidence: Evidence) -> int:
    """Each incarnation's committed updates follow one another; a heal or a restore at s moves it to s."""
    last: dict[tuple[int, int, Any], int] = {}
    errors = 0
    for e in run.events:
        if e.get("kind") not in ("heal", "restore", "step") or not isinstance(e.get("step"), int):
            continue
        key = (run.group_of(e) or 0, int(e.get("incarnation", 0)), e.get("rank"))
        if e["kind"] in ("heal", "restore"):
            last[key] = e["step"]
            continue
        expected = last.get(key, 0) + 1
        if e["step"] != expected:
            errors += 1
            what = "repeated" if e["step"] < expected else "skipped to"
            evidence.add(f"group {key[0]} incarnation {key[1]} rank {key[2]}: {what} step {e['step']} "
                         f"where {expected} was next")
        last[key] = e["step"]
    return errors


# ----- progress ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Loss:
    """One group lost: when, and what the other groups did about it."""

    fault_id: str
    group: int | None
    t: float
    stall_s: float | None
    """The longest pause between two commits of a surviving group, from its last commit before
    the loss until the lost group's first commit after it (None: a survivor never committed again)."""
    alone_steps: int
    """Steps the survivors committed without the lost group, until it was back."""
    crashed: tuple[tuple[int, int], ...] = ()
    """(group, exit code) of surviving groups whose ranks died too before the lost group was back."""


def group_losses(run: ReplicaRun) -> list[Loss]:
    commits = [e for e in run.of("commit") if e.get("committed")]
    losses = []
    for fault in run.of("fault"):
        rank = fault.get("rank")
        group = rank // run.group_world_size if isinstance(rank, int) else None
        t = float(fault["t"])
        rejoined = min((float(e["t"]) for e in commits if run.group_of(e) == group and float(e["t"]) > t),
                       default=float("inf"))
        stalls: list[float | None] = []
        for g in (g for g in range(run.groups) if g != group):
            mine = [float(e["t"]) for e in commits if run.group_of(e) == g]
            before = [x for x in mine if x <= t]
            window = [x for x in mine if t < x <= rejoined]
            if not before:
                continue
            if not window:
                stalls.append(None)
                continue
            later = [x for x in mine if x > rejoined][:1]  # the first commit with the group back, if any
            times = [before[-1], *window, *later]
            if not later:  # it stopped committing: the pause runs to its last decision, committed or not
                times.append(max(float(e["t"]) for e in run.of("commit") if run.group_of(e) == g))
            stalls.append(max(b - a for a, b in zip(times, times[1:])))
        alone = {int(e["step"]) for e in commits if run.group_of(e) != group and t < float(e["t"]) < rejoined
                 and int(e.get("participants", run.groups)) < run.groups}
        stall = None if (not stalls or None in stalls) else max(s for s in stalls if s is not None)
        crashed = tuple((run.group_of(e), int(e["code"])) for e in run.of("exit")
                        if run.group_of(e) not in (None, group) and isinstance(e.get("code"), int) and e["code"] != 0
                        and not e.get("stopped_by_harness") and t < float(e["t"]) <= rejoined)
        losses.append(Loss(str(fault.get("fault_id")), group, t, stall, len(alone), crashed))
    return losses


def check_replica_progress(run: ReplicaRun) -> Verdict:
    ends = run.of("end")
    if not ends:
        return Verdict("progress", UNKNOWN, "no end event: the job's outcome is not recorded")
    end = ends[-1]
    total = run.spec.get("total_steps")
    rg = run.spec["replica_groups"]
    bound = float(rg.get("heartbeat_timeout_s", 5.0)) + float(rg.get("join_timeout_s", 0.0)) + STALL_SLACK_S
    evidence = Evidence()
    if end.get("status") != "completed" or (isinstance(total, int) and end.get("final_step") != total):
        evidence.add(f"the job ended {end.get('status')} at step {end.get('final_step')} (total_steps {total})")
    losses = group_losses(run)
    group_restart = rg.get("restart", "group") == "group"
    for loss in losses:
        lost = f"group {loss.group}" if loss.group is not None else "the lighthouse"
        for g, code in loss.crashed:
            evidence.add(f"after {loss.fault_id} ({lost}) group {g} crashed (exit code {code})"
                         + (f" before group {loss.group} was back" if loss.group is not None else ""))
        if loss.stall_s is None and group_restart:
            evidence.add(f"after {loss.fault_id} ({lost}) a surviving group committed nothing "
                         f"until {lost} was back (or the job ended)")
        elif loss.stall_s is not None and loss.stall_s > bound and group_restart:
            evidence.add(f"after {loss.fault_id} ({lost}) a survivor paused {loss.stall_s:.2f} s, more "
                         f"than heartbeat {rg.get('heartbeat_timeout_s')} s + join {rg.get('join_timeout_s')} s + "
                         f"slack {STALL_SLACK_S} s (configured)")
    counts: dict[str, Any] = {"losses": len(losses),
                              "stall_s": [None if x.stall_s is None else round(x.stall_s, 3) for x in losses],
                              "alone_steps": [x.alone_steps for x in losses]}
    if evidence:
        return Verdict("progress", False, evidence.lines[0], counts, evidence.listing())
    detail = "; ".join(f"{x.fault_id}: survivors paused {x.stall_s:.2f} s, {x.alone_steps} step(s) alone"
                       for x in losses if x.stall_s is not None)
    scope = f"(bound {bound:.1f} s)" if group_restart else "(whole-job restarts: the pause is measured, not bounded)"
    return Verdict("progress", True, f"completed at step {end.get('final_step')}"
                   + (f"; {detail} {scope}" if detail else ""), counts)


# ----- coverage ----------------------------------------------------------------------------


@dataclass
class EpochFigures:
    used: Counter[int] = field(default_factory=Counter)
    dropped: set[int] = field(default_factory=set)

    def figures(self, size: int, completed: bool) -> dict[str, int]:
        replayed = sum(n - 1 for n in self.used.values() if n > 1)
        dropped = len(self.dropped - set(self.used))
        never = size - len(set(self.used) | self.dropped) if completed else 0
        return {"replayed": replayed, "dropped": dropped, "never_seen": never}


def coverage_figures(run: ReplicaRun) -> dict[int, dict[str, int]]:
    """epoch -> replayed (extra uses of an id in committed, contributing batches), dropped (ids
    read only by batches that did not count: uncommitted or healing steps), never_seen (ids no
    batch read, in an epoch a later one followed)."""
    outcome = {(e.get("rank"), e.get("incarnation", 0), e.get("step")): e for e in run.of("commit")}
    epochs: dict[int, EpochFigures] = defaultdict(EpochFigures)
    for b in run.of("batch"):
        epoch = epochs[int(b["epoch"])]
        result = outcome.get((b.get("rank"), b.get("incarnation", 0), b.get("step")))
        if result is not None and result.get("committed") and result.get("participating", True):
            epoch.used.update(b["samples"])
        else:
            epoch.dropped.update(b["samples"])
    size = int(run.spec["dataset_size"])
    last = max(epochs, default=-1)
    return {e: epochs[e].figures(size, e < last) for e in sorted(epochs)}


def check_replica_coverage(run: ReplicaRun) -> Verdict:
    if not run.of("batch"):
        return Verdict("coverage", UNKNOWN, "no batch events: nothing says which samples were used")
    per_epoch = coverage_figures(run)
    totals = {k: sum(f[k] for f in per_epoch.values()) for k in ("replayed", "dropped", "never_seen")}
    counts: dict[str, Any] = {**totals, "per_epoch": {str(e): f for e, f in per_epoch.items()}}
    lossy = [f"epoch {e}: {f['replayed']} replayed, {f['dropped']} dropped, {f['never_seen']} never seen"
             for e, f in per_epoch.items() if any(f.values())]
    figures = f"{totals['replayed']} replayed, {totals['dropped']} dropped, {totals['never_seen']} never seen"
    if run.spec.get("exactly_once") is True:
        if lossy:
            return Verdict("coverage", False, f"the job claims exactly-once data but {figures} over "
                           f"{len(per_epoch)} epoch(s)", counts, lossy[:10])
        return Verdict("coverage", True, f"exactly once, as the job claims: {len(per_epoch)} epoch(s), "
                       "no id replayed, dropped or missed", counts)
    return Verdict("coverage", True, f"measured, not judged (the job does not claim exactly-once): {figures} "
                   f"over {len(per_epoch)} epoch(s)", counts, lossy[:10])


REPLICA_KINDS = ("quorum", "commit", "heal", "heal_send", "group_start")
"""The extension's kinds (docs/DESIGN.md "Replica groups"): the classic loader skips them, these checkers read them."""

REPLICA_CHECKERS: dict[str, Callable[[ReplicaRun], Verdict]] = {
    "coverage": check_replica_coverage,
    "continuity": check_heal_continuity,
    "progress": check_replica_progress,
}
"""What replaces the lineage-based checkers for a replica-group run (`judge` keeps `hang`)."""


def replica_checkers(run_dir: str | Path) -> dict[str, Callable[..., Verdict]]:
    """`judge`'s checkers for a replica run: the run is read once, each checker is
    History-shaped (its arguments ignored) so `check_safe` turns a crash into "unknown"."""
    cache: list[ReplicaRun] = []

    def bound(fn: Callable[[ReplicaRun], Verdict]) -> Callable[..., Verdict]:
        def checker(*_: Any) -> Verdict:
            if not cache:
                cache.append(load_replica_run(run_dir))
            return fn(cache[0])
        return checker

    return {name: bound(fn) for name, fn in REPLICA_CHECKERS.items()}
