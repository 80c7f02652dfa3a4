"""`hang`: every expected hang is detected in time, naming the right rank, and
no hang is reported that no fault caused."""

from __future__ import annotations

from typing import Any

from trainwreck.invariants.history import History
from trainwreck.invariants.verdict import UNKNOWN, Evidence, Verdict

NAME = "hang"
DEFAULT_SLACK_S = 1.0


def hang_slack_s(history: History) -> float:
    value = history.spec.get("hang_slack_s")
    return DEFAULT_SLACK_S if value is None else float(value)


def first_firings(history: History) -> dict[Any, dict[str, Any]]:
    """fault_id -> its first `fault` event: a planned fault fires at most once,
    so a repeat is a duplicate record, not a second firing."""
    fired: dict[Any, dict[str, Any]] = {}
    for ev in history.of_kind("fault"):
        fired.setdefault(ev["fault_id"], ev)
    return fired


def check_hang(history: History, golden: History | None = None) -> Verdict:
    planned = [f for f in history.spec["faults"] if f.get("expect") == "hang"]
    hangs = history.of_kind("hang")
    fired = first_firings(history)
    timeout = float(history.spec["hang_timeout_s"])
    slack = hang_slack_s(history)
    evidence = Evidence()
    expected_attempts: set[int] = set()
    unfired = []
    detected = 0
    for fault in planned:
        ev = fired.get(fault["id"])
        if ev is None:
            unfired.append(fault["id"])
            continue
        expected_attempts.add(ev["attempt"])
        if _judge_one(fault, ev, hangs, timeout, slack, evidence):
            detected += 1
    for h in hangs:
        if h["attempt"] not in expected_attempts:
            evidence.add(
                f"false alarm: hang event in attempt {h['attempt']} naming rank(s) {h['ranks']} ({h['_src']}),"
                " but no fault expected to hang fired in that attempt"
            )
    counts = {
        "planned": len(planned),
        "fired": len(planned) - len(unfired),
        "detected": detected,
        "hang_events": len(hangs),
        "violations": evidence.total,
    }
    bound = f"{timeout:g} s + {slack:g} s slack"
    if evidence:
        return Verdict(NAME, False, f"{evidence.total} violation(s): {evidence.lines[0]}", counts, evidence.listing())
    if unfired:
        return Verdict(NAME, UNKNOWN, f"planned hang fault(s) never fired: {', '.join(map(str, unfired))}", counts)
    if not planned:
        return Verdict(NAME, True, "no hang expected and none reported (nothing to detect)", counts)
    return Verdict(NAME, True, f"{detected} expected hang(s) detected within {bound}, naming the hung rank; no false alarm", counts)


def _judge_one(
    fault: dict[str, Any],
    ev: dict[str, Any],
    hangs: list[dict[str, Any]],
    timeout: float,
    slack: float,
    evidence: Evidence,
) -> bool:
    rank = ev.get("rank") if ev.get("rank") is not None else fault.get("rank")
    what = f"fault {fault['id']!r} (rank {rank}, attempt {ev['attempt']}, {ev['_src']})"
    after = [h for h in hangs if h["attempt"] == ev["attempt"] and h["t"] >= ev["t"]]
    if not after:
        evidence.add(f"{what} hung, but no hang event followed in that attempt")
        return False
    naming = [h for h in after if rank in h["ranks"]]
    if not naming:
        h = after[0]
        evidence.add(f"{what}: hang event names rank(s) {h['ranks']}, not the hung rank {rank} ({h['_src']})")
        return False
    h = naming[0]
    delay = h["t"] - ev["t"]
    if delay > timeout + slack:
        evidence.add(f"{what}: detected {delay:.2f} s after it fired, beyond {timeout:g} s + {slack:g} s slack ({h['_src']})")
        return False
    return True
