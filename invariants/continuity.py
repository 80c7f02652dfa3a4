"""`continuity`: training state survives restarts unchanged.

Without a golden run: every `restore` digest equals the digest its `save`
recorded, the restore names the save's step, and each save recorded the state
its attempt reported after that update. With a golden run: each lineage step
matches the golden run - by digest where the world sizes match, by loss within
a tolerance where they differ (only float summation order may differ then).
"""

from __future__ import annotations

from typing import Any

from trainwreck.invariants.history import History
from trainwreck.invariants.lineage import (Lineage, batch_changed, content_of, damage_of, restore_point,
                                           save_of_restore, walk_lineage)
from trainwreck.invariants.verdict import UNKNOWN, Evidence, Verdict

NAME = "continuity"
DEFAULT_LOSS_TOLERANCE = 1e-3


def loss_tolerance(history: History) -> float:
    value = history.spec.get("loss_tolerance")
    return DEFAULT_LOSS_TOLERANCE if value is None else float(value)


def losses_match(loss: float, golden_loss: float, tolerance: float) -> bool:
    """|loss - golden| <= tolerance * max(1, |golden|): relative for large
    losses, absolute near zero where a relative test would demand exactness."""
    return abs(loss - golden_loss) <= tolerance * max(1.0, abs(golden_loss))


def check_continuity(history: History, golden: History | None = None) -> Verdict:
    evidence = Evidence()
    unverified: list[str] = []
    counts: dict[str, int] = {"restores_checked": 0, "saves_checked": 0, "golden_steps_checked": 0}
    _check_restores(history, evidence, unverified, counts)
    _check_saves(history, evidence, counts)
    lineage = walk_lineage(history)
    stops: list[str] = []
    diagnosis = _check_golden(history, lineage, golden, evidence, unverified, counts, stops) if golden is not None else []
    counts["violations"] = evidence.total
    if evidence:
        return Verdict(NAME, False, f"{evidence.total} discontinuit{'y' if evidence.total == 1 else 'ies'}: {evidence.lines[0]}", counts, evidence.listing() + diagnosis + stops)
    if unverified:
        return Verdict(NAME, UNKNOWN, f"continuity cannot be shown: {unverified[0]}", counts, unverified[:10] + stops)
    if not _has_digests(history):
        return Verdict(NAME, UNKNOWN, "no digests in the run: state continuity cannot be shown", counts)
    restores = counts["restores_checked"]
    if golden is None and restores == 0:
        return Verdict(NAME, True, f"no restore to check: the lineage is one attempt; {counts['saves_checked']} save digest(s) match their steps", counts)
    golden_note = f", {counts['golden_steps_checked']} lineage steps match the golden run" if golden is not None else ""
    if stops:
        golden_note += f" up to step {counts['global_batch_changed_at_step']}; {stops[0]}"
    return Verdict(NAME, True, f"{restores} restore digest(s) equal their saves{golden_note}", counts)


def _has_digests(history: History) -> bool:
    if any(ev.get("digest") is not None for kind in ("save", "restore") for ev in history.of_kind(kind)):
        return True
    return any(log.digests.count(None) != len(log.digests) for log in history.logs.values())


def _check_restores(history: History, evidence: Evidence, unverified: list[str], counts: dict[str, int]) -> None:
    for ev in history.of_kind("restore"):
        where = f"attempt {ev['attempt']} rank {ev['rank']} restored {ev['checkpoint']}"
        save = save_of_restore(history, ev)
        if save is None:
            unverified.append(f"{where}, which no earlier save committed: no digest to compare")
            continue
        by_content = content_of(ev) is not None and content_of(ev) == content_of(save)
        if save["step"] != ev["step"]:
            what = (f"but those bytes (content {content_of(save)}) were saved as {save['checkpoint']} at step"
                    if by_content else "but it was saved at step")
            evidence.add(f"{where} as step {ev['step']}, {what} {save['step']} (attempt {save['attempt']})")
        if ev.get("digest") is None or save.get("digest") is None:
            unverified.append(f"{where}: restore or save has no digest")
            continue
        counts["restores_checked"] += 1
        damage = damage_of(history, ev, save)
        damaged = f"; its bytes were damaged by fault {damage['fault_id']!r} ({damage['_src']})" if damage else ""
        by = f"recorded by its save (attempt {save['attempt']} step {save['step']})"
        if ev["digest"] != save["digest"]:
            evidence.add(f"{where}: parameters or optimizer state differ: digest {ev['digest']} != {save['digest']} {by}{damaged}")
        elif ev.get("buffers") is not None and save.get("buffers") is not None and ev["buffers"] != save["buffers"]:
            evidence.add(f"{where}: buffers (running statistics) differ: {ev['buffers']} != {save['buffers']} {by}{damaged}")


def _check_saves(history: History, evidence: Evidence, counts: dict[str, int]) -> None:
    """A save must hold the state after its update: compare with that step's digest."""
    saves = [save for save in history.of_kind("save") if save.get("digest") is not None]
    reported = _reported_digests(history, saves)
    for save in saves:
        digests = reported.get((save["attempt"], save["step"]), set())
        if not digests:
            continue
        counts["saves_checked"] += 1
        if save["digest"] not in digests:
            evidence.add(
                f"attempt {save['attempt']} saved {save['checkpoint']} at step {save['step']} with digest"
                f" {save['digest']}, but step {save['step']} reported {sorted(map(str, digests))[0]}"
            )


def _reported_digests(history: History, saves: list[dict[str, Any]]) -> dict[tuple[int, int], set[Any]]:
    """(attempt, step) -> the digests its ranks reported for that update, for each save's: each rank's
    steps looked up together (a long run's twenty thousand saves, each a lookup per rank, took 6 s)."""
    wanted: dict[Any, set[Any]] = {}
    for save in saves:
        wanted.setdefault(save["attempt"], set()).add(save["step"])
    reported: dict[tuple[int, int], set[Any]] = {}
    for attempt, steps in wanted.items():
        ordered = sorted(steps)  # the loader admits integer steps only
        for log in history.ranks_of(attempt):
            for step, digest in zip(ordered, log.digests_at(ordered)):
                if digest is not None:
                    reported.setdefault((attempt, step), set()).add(digest)
    return reported


def _check_golden(
    history: History, lineage: Lineage, golden: History, evidence: Evidence, unverified: list[str], counts: dict[str, int],
    stops: list[str],
) -> list[str]:
    """Each lineage step against the golden run's; where comparing stops (a changed global batch),
    `stops` gets the sentence saying from which step and why."""
    if not lineage.complete:
        unverified.extend(lineage.problems[:1])
    golden_at = dict(walk_lineage(golden).steps())
    tolerance = loss_tolerance(history)
    checked = 0
    diagnosis: list[str] = []
    for k, attempt in lineage.steps():
        ours = history.step_record(attempt, k)
        if ours is None:
            _note(unverified, f"no step event for lineage step {k} (attempt {attempt})")
            continue
        g_attempt = golden_at.get(k, max(golden_at.values(), default=0))
        changed = batch_changed(history, attempt, golden, g_attempt)
        if changed is not None:  # a per-device batch on another world size: steps are other updates
            if not stops:
                counts.update(global_batch_changed_at_step=k, global_batch_golden=changed[0],
                              global_batch_after_change=changed[1])
                stops.append(_stop_sentence(history, golden, k, attempt, g_attempt, changed))
            continue
        if k not in golden_at:
            _note(unverified, f"the golden run has no step {k}")
            continue
        theirs = golden.step_record(g_attempt, k)
        if theirs is None:
            _note(unverified, f"the golden run has no step event for step {k}")
            continue
        same_world = history.world_sizes.get(attempt) == golden.world_sizes.get(g_attempt)
        (loss, digest), (g_loss, g_digest) = ours, theirs
        if same_world and digest is not None and g_digest is not None:
            checked += 1
            if digest != g_digest:
                if not evidence:
                    diagnosis = _diagnose(history, lineage, golden, k, attempt, counts)
                evidence.add(f"lineage step {k} (attempt {attempt}): digest {digest} != golden {g_digest} (same world size {history.world_sizes.get(attempt)})")
        elif _is_num(loss) and _is_num(g_loss):
            checked += 1
            if not losses_match(loss, g_loss, tolerance):
                why = "world size {} vs golden {}".format(history.world_sizes.get(attempt), golden.world_sizes.get(g_attempt)) if not same_world else "no digests"
                evidence.add(f"lineage step {k} (attempt {attempt}): loss {loss!r} vs golden {g_loss!r}, beyond tolerance {tolerance:g} ({why})")
        else:
            _note(unverified, f"lineage step {k}: neither digests nor losses to compare with the golden run")
    counts["golden_steps_checked"] = checked
    return diagnosis


def _stop_sentence(history: History, golden: History, k: int, attempt: int, g_attempt: int,
                   changed: tuple[int, int]) -> str:
    """Why the comparison with the golden run ends at lineage step k."""
    worlds = (golden.world_sizes.get(g_attempt), history.world_sizes.get(attempt))
    return (f"from lineage step {k} on (attempt {attempt}) steps are not compared with the golden run: the global "
            f"batch changed ({changed[0]} -> {changed[1]} samples per update, world size {worlds[0]} -> {worlds[1]}), "
            f"so step {k} is another update than the golden run's step {k}")


def _diagnose(history: History, lineage: Lineage, golden: History, k: int, attempt: int,
              counts: dict[str, int]) -> list[str]:
    """Facts for the first lineage step that leaves the golden run after a restore that was exact
    (restored digest == saved digest): the digest covers parameters and optimizer state, so the
    difference lies in state it does not cover. Whether step k's global batch equals golden's
    tells sampler position / data order apart from RNG / LR schedule."""
    seg = next((s for s in lineage.segments if s.attempt == attempt and s.first <= k <= s.last), None)
    restore = restore_point(history, attempt) if seg is not None and seg.restored is not None else None
    save = save_of_restore(history, restore) if restore is not None else None
    if restore is None or save is None or restore.get("digest") is None or restore.get("digest") != save.get("digest"):
        return []
    golden_attempt = dict(walk_lineage(golden).steps()).get(k)
    same_batch = golden_attempt is not None and history.global_batch(attempt, k) == golden.global_batch(golden_attempt, k)
    counts.update(diverged_step=k, diverged_after_exact_restore_step=restore["step"],
                  diverged_batch_matches_golden=int(same_batch))
    missing = (f"step {k} used the golden run's batch, so the RNG state (dropout, augmentation) or the LR schedule"
               if same_batch else
               f"step {k}'s global batch differs from the golden run's, so the sampler position or the data order")
    return [f"the restore of {restore['checkpoint']} at step {restore['step']} was exact (its digest equals the "
            f"save's: parameters and optimizer state), yet lineage step {k} left the golden run: {missing} "
            "was not restored (the digest does not cover it)"]


def _is_num(x: Any) -> bool:
    return type(x) in (int, float)


def _note(lines: list[str], line: str) -> None:
    if len(lines) < 10:
        lines.append(line)
