"""Slowdowns that repeat: their period, and whether one rank or every rank pays them.

"Slow every 20 minutes" is debugged in two moves: find what repeats on the same period, then
compare the ranks' per-step phase timings at the slow steps. An update is slow when it takes
more than SLOW_FACTOR times the median of the updates around it (wall time of its slowest
rank; an attempt's first update, which pays the warm-up, is left out). Consecutive
slow updates of an attempt form one episode; episodes are grouped by where their extra time
went: checkpoint side work (a save, storage) or the update itself (compute and its
collectives). For each group the report gives the period (the commonest gap between episode
starts, in updates, and the median gap in seconds) and the ranks whose own time grew:
- localized: one rank's own phases (data, forward, optimizer) grew; the others only wait for
  it in the collective (backward, sync);
- systemic: every rank's own work or checkpoint time grew at the same updates (shared storage,
  a node-wide neighbour).
"""
from __future__ import annotations

from collections import Counter
from statistics import median
from typing import Any

from trainwreck.report.rawlog import RawRun

SLOW_FACTOR = 3.0
"""An update is slow when its wall time exceeds this many times the median update around it (on
2 cores at a load average of 20, single updates often take twice the median; an update under a
neighbour taking 0.95 of its core takes ten to twenty times)."""
WINDOW = 5
"""Around it: the 2·WINDOW+1 updates of its attempt nearest it (a busy machine's load drifts over
a run; a period is found against the updates near it, not the whole run's)."""
GREW_SHARE = 0.1
"""A rank's own time grew in an episode when its own extra seconds (its checkpoint extra, for an
episode spent in the checkpoint) are at least this share of the episode's extra wall seconds ...
(a rank stopped by a neighbour is stopped in its backward too, so its own work is only part of it)"""
COMPARABLE = 0.5
"""... and at least this share of the rank that grew most: one rank far ahead of the others is localized."""
OWN = ("data", "forward", "optimizer")
WAIT = ("backward", "sync")
CKPT = ("checkpoint",)


def _extra(phases: dict[str, float], base: dict[str, float], names: tuple[str, ...]) -> float:
    return sum(phases.get(n, 0.0) - base.get(n, 0.0) for n in names)


def slowdowns(raw: RawRun) -> dict[str, Any]:
    """The run's repeating slowdowns (report.json `slowdowns`); empty series when none repeats."""
    steps: dict[tuple[int, int], dict[int, tuple[float, dict[str, float]]]] = {}
    for (attempt, rank), lane in raw.lanes.items():
        for step, timed in lane.step_phases.items():
            steps.setdefault((attempt, step), {})[rank] = timed
    firsts = {a: min(s for (b, s) in steps if b == a) for (a, _) in steps}
    for attempt, step in firsts.items():  # an attempt's first update also pays its warm-up
        del steps[(attempt, step)]
    ranks = sorted({r for (_, r) in raw.lanes})
    walls = {k: max(sum(p.values()) for _, p in v.values()) for k, v in steps.items()}
    if len(walls) < 3:
        return {"slow_factor": SLOW_FACTOR, "window": WINDOW, "median_step_s": None, "slow_steps": 0, "series": []}
    local = _local_medians(walls)
    slow = sorted(k for k, w in walls.items() if w > SLOW_FACTOR * local[k])
    typical = median(walls.values())
    base = {r: {n: median(p.get(n, 0.0) for k, v in steps.items() if k not in slow and r in v for _, p in [v[r]])
                for n in OWN + WAIT + CKPT} for r in ranks}
    where = {k: _where(steps[k], base) for k in slow}
    episodes: list[list[tuple[int, int]]] = []
    for key in slow:  # a save right after a burst is its own episode, not part of the burst
        last = episodes[-1][-1] if episodes else None
        if last == (key[0], key[1] - 1) and where[last] == where[key]:
            episodes[-1].append(key)
        else:
            episodes.append([key])
    groups: dict[str, list[dict[str, Any]]] = {}
    for keys in episodes:
        one = _episode(keys, steps, walls, local, base, ranks)
        groups.setdefault(one["where"], []).append(one)
    series = [_series(where, eps, len(ranks)) for where, eps in groups.items()]
    series.sort(key=lambda s: -s["episodes"])
    return {"slow_factor": SLOW_FACTOR, "window": WINDOW, "median_step_s": round(typical, 6), "slow_steps": len(slow),
            "series": series}


def _where(ranks: dict[int, tuple[float, dict[str, float]]], base: dict[int, dict[str, float]]) -> str:
    """Where a slow update's extra time went, summed over its ranks: the checkpoint, or the update."""
    ckpt = sum(_extra(p, base[r], CKPT) for r, (_, p) in ranks.items())
    own = sum(_extra(p, base[r], OWN) for r, (_, p) in ranks.items())
    return "checkpoint" if ckpt > own else "update"


def _local_medians(walls: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """Each update's baseline: the median of the 2·WINDOW+1 updates of its attempt nearest it, the
    window shifted at an attempt's ends so that a burst there is still measured against calm updates."""
    out = {}
    for attempt in {a for a, _ in walls}:
        keys = sorted(k for k in walls if k[0] == attempt)
        size = min(len(keys), 2 * WINDOW + 1)
        for i, key in enumerate(keys):
            lo = min(max(0, i - WINDOW), len(keys) - size)
            out[key] = median(walls[k] for k in keys[lo:lo + size])
    return out


def _episode(keys: list[tuple[int, int]], steps: dict[tuple[int, int], dict[int, Any]], walls: dict[Any, float],
             local: dict[Any, float], base: dict[int, dict[str, float]], ranks: list[int]) -> dict[str, Any]:
    extra = sum(walls[k] - local[k] for k in keys)
    per_rank = {}
    for r in ranks:
        timed = [steps[k][r][1] for k in keys if r in steps[k]]
        per_rank[r] = {group: sum(_extra(p, base[r], names) for p in timed)
                       for group, names in (("own", OWN), ("wait", WAIT), ("checkpoint", CKPT))}
    where = _where(steps[keys[0]], base)
    paid = {r: v["own" if where == "update" else "checkpoint"] for r, v in per_rank.items()}
    top = max(paid.values(), default=0.0)
    grew = [r for r, x in paid.items() if x >= max(GREW_SHARE * extra, COMPARABLE * top)]
    start = keys[0]
    return {"attempt": start[0], "first_step": start[1], "steps": len(keys), "extra_s": extra, "where": where,
            "grew": grew, "t": min(t for t, _ in steps[start].values()), "per_rank": per_rank}


def _series(where: str, eps: list[dict[str, Any]], world: int) -> dict[str, Any]:
    gaps = [b["first_step"] - a["first_step"] for a, b in zip(eps, eps[1:]) if a["attempt"] == b["attempt"]]
    seconds = [b["t"] - a["t"] for a, b in zip(eps, eps[1:]) if a["attempt"] == b["attempt"]]
    period, regular = Counter(gaps).most_common(1)[0] if gaps else (None, 0)
    grew = Counter(r for e in eps for r in e["grew"])
    suspects = sorted(r for r, n in grew.items() if n * 2 > len(eps))
    scope = "systemic" if world > 1 and len(suspects) == world else "localized" if len(suspects) == 1 else "unclear"
    totals = {r: {g: round(sum(e["per_rank"][r][g] for e in eps if r in e["per_rank"]), 4)
                  for g in ("own", "wait", "checkpoint")} for r in sorted({r for e in eps for r in e["per_rank"]})}
    return {"where": where, "episodes": len(eps), "first_steps": [e["first_step"] for e in eps],
            "steps_per_episode": round(sum(e["steps"] for e in eps) / len(eps), 3),
            "period_steps": period, "regular_gaps": regular, "gaps": len(gaps),
            "period_s": round(median(seconds), 4) if seconds else None,
            "extra_s_per_episode": round(sum(e["extra_s"] for e in eps) / len(eps), 4),
            "scope": scope, "ranks": suspects,
            "per_rank": [{"rank": r, **v} for r, v in totals.items()]}
