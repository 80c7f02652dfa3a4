"""Typed facts for the report's claims, read from the verdicts' evidence and the raw events.

The checkers write evidence as lines for people ("attempt 1 rank 0 step 9: epoch went back
from 1 to 0"). A sentence that explains a verdict needs those as values: which step the
epoch went back at, whether any restore digest differed from its save, how many (epoch, id)
pairs each epoch repeated. This module is the one place that reads them, so a claim can
presume a fact ("facts.restores.mismatched == 0") and the truth test can read it back from
report.json. A new kind of evidence (a checker's new line, a new field of a verdict) gets a
reader here and a key in `facts`; docs/REPORTS.md, "Claims", says how.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

from trainwreck.report.rawlog import RawRun

WENT_BACK = re.compile(r"attempt (\d+) rank (\d+) step (\d+): epoch went back from (\d+) to (\d+)")
TWICE = re.compile(r"epoch (\d+): ids used twice: ([\d,\-]+)(?: \(\+(\d+) more ids\))?;(?: id (\d+) at (.*))?")
USE = re.compile(r"attempt (\d+) rank (\d+) step (\d+)")
GOLDEN_BATCH = re.compile(r"step (\d+) \(attempt (\d+)\): global batch differs from the golden run")
RESTORE_DIGEST = re.compile(r"attempt (\d+) rank (\d+) restored (\S+): (?:[\w ()]+ differ: )?(?:digest )?\w+ != \w+ "
                            r"recorded by its save")
RESTORE_STEP = re.compile(r"attempt (\d+) rank (\d+) restored (\S+) as step (\d+), but it was saved at step (\d+)")
SAVE_DIGEST = re.compile(r"attempt (\d+) saved (\S+) at step (\d+) with digest")
GOLDEN_DIGEST = re.compile(r"lineage step (\d+) \(attempt (\d+)\): digest \w+ != golden")
GOLDEN_LOSS = re.compile(r"lineage step (\d+) \(attempt (\d+)\): loss .* vs golden .*beyond tolerance")
CONTINUITY_KINDS = (("restore_step", RESTORE_STEP), ("restore_digest", RESTORE_DIGEST), ("save_digest", SAVE_DIGEST),
                    ("golden_digest", GOLDEN_DIGEST), ("golden_loss", GOLDEN_LOSS))
"""Continuity's evidence, by what it blames: the restored state, a save, or the trajectory after a restore."""


def build_facts(report: dict[str, Any], raw: RawRun) -> dict[str, Any]:
    verdicts = report["verdicts"]
    bad = [name for name, v in verdicts.items() if v.get("valid") is False]
    return {
        "first_violated": bad[0] if bad else None,
        "restores": restore_digests(raw),
        "rejects": rejects(raw),
        "leftovers": leftovers(raw),
        "exit_overdue": exit_overdue(raw),
        "first_evidence_new": first_evidence_new(verdicts[bad[0]]) if bad else None,
        **{name: build(report, raw) for name, build in FACTS.items()},
        # A verdict may carry typed facts of its own (a `facts` object beside its counts, as the --cmd
        # jobs' judge adds them): copied as they are, so a claim can presume "facts.verdicts.NAME.FIELD".
        "verdicts": {name: dict(v["facts"]) for name, v in verdicts.items() if isinstance(v.get("facts"), dict)},
    }


def restore_digests(raw: RawRun) -> dict[str, Any]:
    """Each restore's digest against the digest its save recorded, straight from the events."""
    saves = sorted(raw.of_kind("save"), key=lambda ev: ev["t"])
    checked = mismatched = 0
    for ev in raw.of_kind("restore"):
        save = next((s for s in reversed(saves) if s.get("checkpoint") == ev.get("checkpoint") and s["t"] <= ev["t"]),
                    None)
        if save is None or ev.get("digest") is None or save.get("digest") is None:
            continue
        checked += 1
        mismatched += ev["digest"] != save["digest"]
    return {"checked": checked, "mismatched": mismatched, "matched": checked - mismatched}


def rejects(raw: RawRun) -> list[dict[str, Any]]:
    """Checkpoints a restart refused, with the reason its `reject` event gives; one row per checkpoint."""
    out: dict[tuple[Any, Any], dict[str, Any]] = {}
    for ev in raw.of_kind("reject"):
        key = (ev.get("attempt"), ev.get("checkpoint"))
        out.setdefault(key, {"attempt": ev.get("attempt"), "rank": ev.get("rank"), "checkpoint": ev.get("checkpoint"),
                             "reason": str(ev.get("reason") or "no reason recorded")})
    return list(out.values())


def leftovers(raw: RawRun) -> list[dict[str, Any]]:
    """Processes an attempt's ranks left running (children, `setsid` daemons) that the harness ended
    with the attempt, from its `leftover` events; one row per attempt, in attempt order."""
    out: dict[Any, dict[str, Any]] = {}
    for ev in raw.of_kind("leftover"):
        row = out.setdefault(ev.get("attempt"), {"attempt": ev.get("attempt"), "count": 0, "pids": [], "commands": []})
        row["count"] += 1
        row["pids"].append(ev.get("pid"))
        row["commands"].append(str(ev.get("cmdline") or "?")[:120])
    rows = sorted(out.values(), key=lambda r: (r["attempt"] is None, r["attempt"] if isinstance(r["attempt"], int) else 0))
    for row in rows:  # as a sentence quotes them
        row["pids"] = ", ".join(map(str, row["pids"]))
        row["commands"] = "; ".join(dict.fromkeys(row["commands"]))
    return rows


def exit_overdue(raw: RawRun) -> list[dict[str, Any]]:
    """Ranks that published "done" but were still running after the exit budget, which the harness
    stack-dumped and killed, from `exit_overdue` events; one row per event, in attempt order."""
    rows = []
    for ev in raw.of_kind("exit_overdue"):
        ranks = overdue_ranks(ev)
        named = ", ".join(map(str, ranks))
        rows.append({"attempt": ev.get("attempt"), "ranks": named, "who": f"rank {named}" if len(ranks) == 1
                     else f"ranks {named}", "it": "it" if len(ranks) == 1 else "them", "after_s": _seconds(ev.get("after_s")),
                     "budget_s": _seconds(ev.get("budget_s")),
                     "stacks": ", ".join(map(str, stacks)) if isinstance(stacks := ev.get("stacks"), list) and stacks
                     else "none written"})
    return sorted(rows, key=lambda r: r["attempt"] if isinstance(r["attempt"], int) else -1)


def overdue_ranks(ev: dict[str, Any]) -> list[int]:
    """The ranks an `exit_overdue` event names (a hostile log's non-list or non-integers name none)."""
    return [r for r in ev["ranks"] if type(r) is int] if isinstance(ev.get("ranks"), list) else []


def _seconds(value: Any) -> float | None:
    """A number of seconds as a sentence may format it (a hostile log's string or bool is no number)."""
    return float(value) if type(value) in (int, float) and math.isfinite(value) else None


def _count_intervals(text: str) -> int:
    total = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        total += int(hi) - int(lo) + 1 if hi else 1
    return total


def coverage_facts(v: dict[str, Any]) -> dict[str, Any]:
    """Where the sampler went back, and the repeated ids per epoch (the count is of (epoch, id) pairs)."""
    evidence = [str(e) for e in v.get("evidence") or []]
    back = next((m for m in map(WENT_BACK.match, evidence) if m), None)
    found = [m for m in map(TWICE.match, evidence) if m]
    twice = {int(m.group(1)): _count_intervals(m.group(2)) + int(m.group(3) or 0) for m in found}
    repeats = [_repeat(m) for m in found if m.group(4) is not None]
    return {
        "went_back": ({"attempt": int(back.group(1)), "rank": int(back.group(2)), "step": int(back.group(3)),
                       "from_epoch": int(back.group(4)), "to_epoch": int(back.group(5))} if back else None),
        "twice_by_epoch": {str(e): n for e, n in sorted(twice.items())},
        "twice_split": ", ".join(f"epoch {e}: {n} ids" for e, n in sorted(twice.items())),
        "twice_epochs": len(twice),
        # The evidence shows every use of each epoch's first repeated id: whether one attempt used it
        # twice (the pipeline deals it twice) or two attempts did (a restart replayed it).
        "twice_span": next((r for r in repeats if r["across"]), None),
        "twice_within": next((r for r in repeats if r["within"]), None),
        # The earliest lineage step whose global batch is not the golden run's, and its attempt: in
        # attempt 0 the order differs before any restart, so the resume cannot be what changed it.
        "first_golden_batch": min(({"step": int(m.group(1)), "attempt": int(m.group(2))}
                                   for m in map(GOLDEN_BATCH.match, evidence) if m),
                                  key=lambda row: row["step"], default=None),
        # Nothing repeated, missing or outside the dataset: only the batches differ from the golden run's.
        "order_only": not any((v.get("counts") or {}).get(k) for k in
                              ("duplicated_ids", "ids_not_covered", "ids_outside_dataset")),
    }


def _repeat(m: re.Match[str]) -> dict[str, Any]:
    """One evidence line's first repeated id and its uses ("attempt 0 rank 0 step 7"): the first
    use, and the next one by another attempt when there is one (else simply the next one)."""
    uses = [(int(u.group(1)), u.group(0)) for u in USE.finditer(m.group(5))] or [(-1, "")]
    again = next((u for u in uses[1:] if u[0] != uses[0][0]), uses[1:][0] if uses[1:] else uses[0])
    attempts = [a for a, _ in uses]
    return {"epoch": int(m.group(1)), "id": int(m.group(4)), "first": uses[0][1], "again": again[1],
            "attempt": again[0], "across": again[0] != uses[0][0], "within": len(attempts) > len(set(attempts))}


def continuity_facts(v: dict[str, Any]) -> dict[str, Any]:
    """What continuity's first evidence line blames, and at which step."""
    for line in [str(e) for e in v.get("evidence") or []][:1]:
        for kind, pattern in CONTINUITY_KINDS:
            m = pattern.match(line)
            if m:
                step = int(m.group(1)) if kind.startswith("golden") else None
                return {"first_kind": kind, "first_step": step, "first": line}
        return {"first_kind": "other", "first_step": None, "first": line}
    return {"first_kind": None, "first_step": None, "first": None}


def first_evidence_new(v: dict[str, Any]) -> str | None:
    """The violated verdict's first evidence line when its summary does not already say it (most
    summaries quote it: "1 violation(s): <the line>"), so a sentence says each thing once."""
    evidence = [str(e) for e in v.get("evidence") or []]
    return evidence[0] if evidence and evidence[0] not in str(v.get("summary", "")) else None


def progress_facts(report: dict[str, Any], raw: RawRun) -> dict[str, Any]:
    """How the job ended against total_steps, whether the last attempt's ranks all exited 0, and the
    signal fault that fired in that attempt (a preemption), from the events."""
    end = (raw.of_kind("end") or [{}])[-1]
    attempts = report.get("attempts") or []
    last = attempts[-1] if attempts else {}
    exits = list((last.get("exits") or {}).values())
    signal = next((f for f in reversed(report.get("faults") or [])
                   if f.get("signal") and f.get("attempt") == last.get("attempt")), None)
    total, final = (report.get("spec") or {}).get("total_steps"), end.get("final_step")
    return {
        "outcome": end.get("outcome"), "final_step": final, "total_steps": total, "attempts": len(attempts),
        "no_progress": end.get("outcome") == "no_progress",
        "short": final is not None and total is not None and final < total,
        "clean_exit": bool(exits) and all(code == 0 for code in exits),
        "signal": ({"fault": signal["id"], "signal": signal["signal"], "ranks": signal.get("ranks"),
                    "step": signal.get("in_step")} if signal else None),
    }


def hang_facts(report: dict[str, Any]) -> dict[str, Any]:
    """A hang event that named no rank after a fault that was planned to hang one: the stall was
    ended, but nothing said which rank stalled."""
    for h in report.get("hangs") or []:
        if h.get("ranks"):
            continue
        fault = next((f for f in report.get("faults") or [] if f.get("expect") == "hang"
                      and f.get("attempt") == h.get("attempt") and f.get("t_s", 0) <= h.get("t_s", 0)), None)
        if fault is not None:
            return {"unnamed": {"fault": fault["id"], "rank": fault.get("rank"), "attempt": h.get("attempt"),
                                "after_s": h.get("detected_after_s"), "waiting": h.get("waiting")}}
    return {"unnamed": None}


FACTS: dict[str, Callable[[dict[str, Any], RawRun], dict[str, Any]]] = {
    "coverage": lambda report, raw: coverage_facts(report["verdicts"].get("coverage") or {}),
    "continuity": lambda report, raw: continuity_facts(report["verdicts"].get("continuity") or {}),
    "progress": progress_facts,
    "hang": lambda report, raw: hang_facts(report),
}
"""Invariant -> the facts its evidence yields, under report.json `facts.NAME` (the invariants are
declared in report/presentation.py; tests/report/test_presentation.py ties the two)."""
