"""`replicas`: all ranks of an attempt hold the same state at the same step.

An event's `digest` covers the state replicas must agree on (parameters, optimizer state,
the buffers they keep equal); it is compared at every step and restore. Its optional
`buffers` (docs/DESIGN.md) covers local buffers, a BatchNorm's running statistics, which
DDP ranks update each from its own batch: different at every step's end by design, so
compared only at a restore, where every rank loaded the same checkpoint. An old run whose
`digest` covered those buffers too carries no `buffers` and is judged as it always was.
The evidence names the part that differs."""

from __future__ import annotations

from typing import Any

from trainwreck.invariants.history import History, RankLog
from trainwreck.invariants.verdict import UNKNOWN, Evidence, Verdict

NAME = "replicas"


def check_replicas(history: History, golden: History | None = None) -> Verdict:
    evidence = Evidence()
    compared = 0
    with_digest = any(log.digests.count(None) != len(log.digests) for log in history.logs.values())
    multi_rank = False
    for attempt in sorted({a for a, _ in history.logs}):
        logs = [log for log in history.ranks_of(attempt) if log.steps]
        if len(logs) < 2:
            continue
        multi_rank = True
        shared, split = _disagreements(logs)
        compared += shared
        for step in sorted(split):
            evidence.add(f"attempt {attempt} step {step}: {STATE}: {_groups(_digests_at(logs, step))}")
    for attempt, step, rank, _, digest, src in history.duplicate_steps:
        log = history.logs.get((attempt, rank))
        first = log.digest_by_step().get(step) if log else None
        if first is not None and digest is not None and digest != first:
            evidence.add(f"attempt {attempt} rank {rank} reported step {step} twice, with digests {first} and {digest} ({src})")
    restores_compared = _check_restores(history, evidence)
    counts = {"steps_compared": compared, "restores_compared": restores_compared, "disagreements": evidence.total}
    if evidence:
        return Verdict(NAME, False, f"replicas diverged {evidence.total} time(s); first: {evidence.lines[0]}", counts, evidence.listing())
    if not with_digest:
        return Verdict(NAME, UNKNOWN, "no step digests: replica agreement cannot be shown", counts)
    if not multi_rank and restores_compared == 0:
        return Verdict(NAME, True, "a single replica in every attempt: nothing can disagree", counts)
    return Verdict(NAME, True, f"all ranks agree at {compared} (attempt, step) pair(s) and {restores_compared} restore(s)", counts)


def _disagreements(logs: list[RankLog]) -> tuple[int, set[int]]:
    """(steps reported by two or more ranks, steps where digests differ).

    Whole-rank dict comparisons first: when replicas agree - the common case -
    no step is looked at in Python. A missing digest cannot disagree."""
    first = logs[0]
    if all(log.steps == first.steps and log.digests == first.digests for log in logs[1:]):
        return len(first.steps), set()  # every rank reported the same steps and digests: C-level compares
    reference = first.digest_by_step()
    shared: set[int] = set()
    split: set[int] = set()
    for log in logs[1:]:
        digests = log.digest_by_step()
        if digests == reference:
            shared.update(digests)
            continue
        common = digests.keys() & reference.keys()
        shared.update(common)
        split.update(k for k in common if digests[k] != reference[k] and digests[k] is not None and reference[k] is not None)
    # Ranks that rank 0 (say) never reached can still disagree among themselves.
    seen: dict[int, Any] = {}
    for log in logs[1:]:
        for k in log.digest_by_step().keys() - reference.keys():
            digest = log.digest_by_step()[k]
            if k in seen:
                shared.add(k)
                if digest is not None and seen[k] is not None and digest != seen[k]:
                    split.add(k)
            else:
                seen[k] = digest
    return len(shared), split


def _digests_at(logs: list[RankLog], step: int) -> dict[int, Any]:
    return {log.rank: log.digest_by_step()[step] for log in logs if step in log.digest_by_step()}


STATE = "parameters or optimizer state differ"
BUFFERS = "buffers (running statistics) differ"


def _check_restores(history: History, evidence: Evidence) -> int:
    """Every rank loads the checkpoint itself; all must end in the same state, local buffers too."""
    by_attempt: dict[int, dict[str, dict[int, Any]]] = {}
    for ev in history.of_kind("restore"):
        for part in ("digest", "buffers"):
            if ev.get(part) is not None:
                by_attempt.setdefault(ev["attempt"], {}).setdefault(part, {})[ev["rank"]] = ev[part]
    compared = 0
    for attempt, parts in sorted(by_attempt.items()):
        if len(parts.get("digest", {})) < 2:
            continue
        compared += 1
        for part, what in (("digest", STATE), ("buffers", BUFFERS)):
            per_rank = parts.get(part, {})
            if len(set(map(str, per_rank.values()))) > 1:
                evidence.add(f"attempt {attempt} restore: {what}: {_groups(per_rank, part)}")
    return compared


def _groups(per_rank: dict[int, Any], part: str = "digest") -> str:
    """"rank(s) 0,1 digest aa; rank(s) 2 digest bb", the majority first."""
    by_digest: dict[str, list[int]] = {}
    for rank, digest in sorted(per_rank.items()):
        by_digest.setdefault(str(digest), []).append(rank)
    groups = sorted(by_digest.items(), key=lambda item: (-len(item[1]), item[1]))
    return "; ".join(f"rank(s) {','.join(map(str, ranks))} {part} {digest}" for digest, ranks in groups)
