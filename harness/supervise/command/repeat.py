"""Is a `--cmd` script deterministic? Its golden run's first steps, reproduced once.

Continuity compares every lineage step's digest with the golden run's. An unseeded script
(or one whose data order depends on the clock) differs from its own golden run with no fault
at all, and the verdict would blame the checkpoint ("the resumed model is not the one that
was saved"). So when a golden run is built, the command runs once more, uninterrupted, and
is stopped as soon as a rank reports update REPEAT_STEPS: its digests must equal the golden
run's at every step both reached. The finding is stored beside the golden run
(`repeat.json`), so it costs one short run per golden key, and `Command.judge` turns a
difference into "unknown: the script is not deterministic (step 1 digest A vs B): seed it".

Why a prefix and not a second whole golden run: the steps that matter are the first (an
unseeded init differs at step 1), and the prefix costs the process start and REPEAT_STEPS
updates instead of the whole job (measured in docs/FRAMEWORKS.md).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainwreck.invariants import Judgement
from trainwreck.invariants.verdict import UNKNOWN, Verdict, compose
from trainwreck.rundir.layout import iter_events

REPEAT_STEPS = 2
"""Updates the second run must reach before it is stopped."""
REPEAT_FILE = "repeat.json"
REPEAT_STOP = {"id": "repeat-stop", "kind": "signal", "signal": "SIGKILL", "rank": 0, "step": REPEAT_STEPS + 1}
"""The repeat run's only fault: it ends it (harness/judge/golden.py runs it; Command.repeat_spec plans it)."""


def step_digests(run_dir: Path) -> dict[int, str]:
    """step -> digest of the lowest rank that reported it (replicas are judged elsewhere)."""
    best: dict[int, tuple[int, str]] = {}
    for ev in iter_events(run_dir, batches=False):
        if ev.get("kind") != "step" or not isinstance(ev.get("step"), int) or not isinstance(ev.get("digest"), str):
            continue
        rank = ev.get("rank") if isinstance(ev.get("rank"), int) else 0
        if ev["step"] not in best or rank < best[ev["step"]][0]:
            best[ev["step"]] = (rank, ev["digest"])
    return {k: d for k, (_, d) in best.items()}


def record_repeat(golden_dir: Path, repeat_dir: Path, golden_s: float, repeat_s: float) -> dict[str, Any]:
    """Compare the repeat run's digests with the golden run's at every step both reached and write
    golden_dir/repeat.json: the steps compared and the first whose digest differs, if any."""
    golden, again = step_digests(golden_dir), step_digests(repeat_dir)
    common = sorted(set(golden) & set(again))
    first = next((k for k in common if golden[k] != again[k]), None)
    finding: dict[str, Any] = {"steps_compared": len(common), "repeat_s": round(repeat_s, 3),
                               "golden_s": round(golden_s, 3), "first_difference": None}
    if first is not None:
        finding["first_difference"] = {"step": first, "golden": golden[first], "again": again[first]}
    (golden_dir / REPEAT_FILE).write_text(json.dumps(finding, indent=1) + "\n")
    return finding


def nondeterminism(golden_dir: Path | None) -> str | None:
    """The reason a golden run cannot judge continuity (its script is not deterministic), or None."""
    if golden_dir is None:
        return None
    try:
        finding = json.loads((Path(golden_dir) / REPEAT_FILE).read_text())
        diff = finding.get("first_difference") if isinstance(finding, dict) else None
    except (OSError, ValueError):
        return None
    if not isinstance(diff, dict):
        return None
    return (f"the script is not deterministic (step {diff.get('step')} digest {diff.get('golden')} vs "
            f"{diff.get('again')} in two uninterrupted runs): seed it: call probe.seed(...) at the top of the "
            "script, before the model and the data are built (docs/FRAMEWORKS.md)")


def judged_without_golden(judgement: Judgement, reason: str) -> Judgement:
    """A judgement made without the golden run (it cannot be compared with): continuity is
    "unknown" with `reason` unless it was violated on its own (a restore whose digest differs
    from its save's is wrong however the script is seeded); the whole is never valid."""
    verdicts = dict(judgement.verdicts)
    own = verdicts.get("continuity")
    if own is None or own.valid is not False:
        verdicts["continuity"] = Verdict("continuity", UNKNOWN, reason, dict(own.counts) if own else {},
                                         list(own.evidence) if own else [])
    valid = compose([*(v.valid for v in verdicts.values()), UNKNOWN])
    return Judgement(valid, verdicts, judgement.unfired_faults, [reason, *judgement.notes])
