"""The report's content, as one JSON-able dict (report.json): what happened, when, and the verdicts.

Everything a renderer draws comes from this dict, so report.json is the machine
view of the same facts the HTML and Markdown show. Times are seconds since the
run's first event. It reads only the run directory: verdicts.json when present
(the judgement against a golden run), otherwise it judges the run itself.
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from itertools import compress, islice, repeat
from operator import add, ge, le, ne
from typing import Any, Iterable, Sized

from trainwreck.report.angles import interview_angles
from trainwreck.report.violation_cause import cause_claims
from trainwreck.report.claims import F, Claims, Presume, fact
from trainwreck.report.facts import build_facts, overdue_ranks
from trainwreck.report.metrics import baselines
from trainwreck.report.period import slowdowns
from trainwreck.report.rawlog import TIMED_PHASES, LaneLog, RawRun, read_raw
from trainwreck.report.crash_cause import root_cause
from trainwreck.report.stackdump import by_faulthandler, thread_stacks, training_thread
from trainwreck.invariants import InputError, Lineage, judge, load_history, spill, vectors, walk_lineage
from trainwreck.invariants.history import History
from trainwreck.invariants.loader import load_spec
from trainwreck.trainer.config import saves_after_step
from trainwreck.rundir.files import SMALL_LIMIT, STACK_LIMIT, read_json, read_text
from trainwreck.rundir.layout import RunDir

REPORT_FORMAT = "trainwreck-report/1"
# Phases a collective cannot stretch: time a rank spends here is its own work. The
# others' extra backward (DDP's gradient all-reduce), sync and checkpoint (barrier)
# time is mostly waiting for the slowest rank, so those do not name it.
OWN_PHASES = ("data", "forward", "optimizer")


class NotARun(Exception):
    """The directory is not a trainwreck run directory; the message says which file and why."""


def build_report(run_dir: Path) -> dict[str, Any]:
    return build_report_and_plots(run_dir)[0]


def build_report_and_plots(run_dir: Path) -> tuple[dict[str, Any], Any]:
    """The report, and what its plots draw from: the checker's columns (report/plots.py Columns)
    when the lanes were taken from them, else None (the plots read the events)."""
    from trainwreck.report.plots import Columns  # plots imports nothing of the model

    run_dir = Path(run_dir)
    try:
        load_spec(str(run_dir))
    except InputError as exc:
        raise NotARun(str(exc)) from None
    history, load_error = _load(run_dir)
    # The History already holds every batch and step as columns; parsing them again was most of the cost.
    raw = read_raw(run_dir, batches=history is None, history=history)
    judged = _judgement(run_dir, history, load_error)
    lineage = walk_lineage(history) if history is not None else None
    attempts = _attempts(raw, lineage)
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "run_dir": str(run_dir),
        "name": run_dir.name,
        **judged,
        "spec": _spec_summary(raw.spec),
        "plan": list(raw.spec.get("faults", [])),
        "wall_s": _round((raw.t_end or 0) - (raw.t0 or 0)),
        "attempts": attempts,
        "saves": _saves(raw),
        "missed_saves": _missed_saves(raw),
        "prunes": [{"attempt": ev.get("attempt"), "checkpoint": ev.get("checkpoint"), "t_s": raw.rel(ev["t"])}
                   for ev in raw.of_kind("prune")],
        "faults": _faults(raw),
        "hangs": _hangs(raw, run_dir),
        "lineage": _lineage_json(lineage),
        "phases": _phases(raw, hung=bool(raw.of_kind("hang"))),
        "slowdowns": slowdowns(raw),
        "loss": _loss(raw),
        "state": _state(run_dir, raw),
        "recovery": _recovery(raw, attempts, lineage),
        "raw_notes": raw.notes,
    }
    cause = root_cause(run_dir, raw)
    report["root_cause"] = cause.to_json() if cause is not None else None
    report["scenario"] = _scenario(raw.spec, report.get("reproduce"))
    report["totals"] = _totals(report)
    report["metrics"] = baselines(report)
    report["loss"]["golden"] = _golden_loss(report)
    report["facts"] = build_facts(report, raw)
    say = Claims(report)
    cause_claims(say, report)
    report["cause"] = say.text("cause") or None
    report["angles"] = interview_angles(report, say)
    report["headline"] = headline(report, say)
    recovery_claims(say, report)
    report["recovery_text"] = say.text("recovery")
    report["claims"] = say.to_json()
    return report, (Columns.of(raw, history) if raw.columns and history is not None else None)


# ----- judgement ------------------------------------------------------------------------


def _load(run_dir: Path) -> tuple[History | None, str | None]:
    try:
        return load_history(run_dir, report=True), None
    except InputError as exc:
        return None, str(exc)


def _judgement(run_dir: Path, history: History | None, load_error: str | None) -> dict[str, Any]:
    """verdicts.json (judged against the golden run) when present; else judge here, without one."""
    stored = _read_json(RunDir(run_dir).verdicts)
    if isinstance(stored, dict) and "valid" in stored and isinstance(stored.get("verdicts"), dict):
        return {"valid": stored["valid"], "verdicts": stored["verdicts"],
                "unfired_faults": stored.get("unfired_faults", []), "notes": stored.get("notes", []),
                "judged_by": "verdicts.json", "golden": stored.get("golden"), "interrupted": stored.get("interrupted"),
                "reproduce": stored.get("reproduce"), "outcome": stored.get("outcome"), "error": None}
    base = {"judged_by": "report (no golden run: digests and batches not compared with an uninterrupted run)",
            "golden": None, "reproduce": None, "outcome": None}
    if history is None:
        return {**base, "valid": "unknown", "verdicts": {}, "unfired_faults": [], "notes": [], "interrupted": None,
                "error": f"the run could not be judged: {load_error}"}
    judgement = judge(history).to_json()
    return {**base, "interrupted": None, **judgement, "error": None}


def _read_json(path: Path) -> Any:
    try:
        return read_json(path, SMALL_LIMIT, root=path.parent)
    except (OSError, ValueError, RecursionError):
        return None


def _scenario(spec: dict[str, Any], reproduce: str | None) -> dict[str, Any] | None:
    """The scenario the run came from, as the harness recorded it in run.json; for a run
    directory written before it did, just the name from its reproduce command."""
    scenario = spec.get("scenario")
    if isinstance(scenario, dict) and isinstance(scenario.get("name"), str):
        return {"name": scenario["name"], "summary": str(scenario.get("summary") or ""),
                "question": str(scenario.get("question") or ""),
                "threatens": [t for t in scenario.get("threatens") or [] if isinstance(t, str)]}
    try:
        words = shlex.split(reproduce or "")
    except ValueError:
        return None
    if len(words) < 3 or words[:2] != ["trainwreck", "run"] or words[2].startswith("-"):
        return None
    return {"name": words[2], "summary": "", "question": "", "threatens": []}


def _spec_summary(spec: dict[str, Any]) -> dict[str, Any]:
    config = spec.get("config") if isinstance(spec.get("config"), dict) else {}
    keys = ("dataset_size", "global_batch", "drop_last", "total_steps", "hang_timeout_s", "hang_slack_s",
            "world_sizes", "max_restarts", "launcher")
    summary = {k: spec.get(k) for k in keys if k in spec}
    if isinstance(spec.get("host"), dict):  # the harness's measurement of the machine (absent in older runs)
        summary["host"] = {k: v for k, v in spec["host"].items() if k in ("cpus", "load_average_1m")}
    for k in ("ckpt_interval", "keep_last", "variant", "backend", "parallelism", "ckpt_mode", "width", "depth",
              "grad_accum", "rank_batch", "lr_scaling", "lr", "warmup_steps", "lr_rewarmup"):
        if k in config:
            summary[k] = config[k]
    return summary


# ----- attempts and lanes ---------------------------------------------------------------


def _attempts(raw: RawRun, lineage: Lineage | None) -> list[dict[str, Any]]:
    numbers = {a for a, _ in raw.lanes}
    numbers.update(ev["attempt"] for ev in raw.events if type(ev.get("attempt")) is int)
    return [_attempt(raw, a, lineage) for a in sorted(numbers)]


def _attempt(raw: RawRun, a: int, lineage: Lineage | None) -> dict[str, Any]:
    lanes = sorted((lane for (att, _), lane in raw.lanes.items() if att == a), key=lambda x: x.rank)
    mine = [ev for ev in raw.events if ev.get("attempt") == a]
    header = next((ev for ev in mine if ev.get("kind") == "attempt"), None)
    exits = {ev["rank"]: ev.get("code") for ev in mine if ev.get("kind") == "exit" and type(ev.get("rank")) is int}
    restores = sorted((ev for ev in mine if ev.get("kind") == "restore"), key=lambda ev: ev.get("rank", 0))
    starts = [lane.started for lane in lanes if lane.started is not None]
    first_steps = [lane.times[0] for lane in lanes if lane.times]
    start = header["t"] if header else (min(starts) if starts else (min(first_steps) if first_steps else None))
    ends = [ev["t"] for ev in mine if ev.get("kind") == "exit"] or \
        [t for lane in lanes for t in lane.times[-1:]] + [ev["t"] for ev in mine]
    world = (header or {}).get("world_size") or next((lane.world_size for lane in lanes if lane.world_size), None)
    segments = [(s.first, s.last) for s in (lineage.segments if lineage else []) if s.attempt == a]
    return {
        "attempt": a,
        "world_size": world,
        "start_s": raw.rel(start),
        "first_step_s": raw.rel(min(first_steps)) if first_steps else None,
        "end_s": raw.rel(max(ends)) if ends else None,
        "restored": ({"checkpoint": restores[0].get("checkpoint"), "step": restores[0].get("step")}
                     if restores else None),
        "rejected": sorted({str(ev.get("checkpoint")) for ev in mine if ev.get("kind") == "reject"}),
        "exits": {str(r): c for r, c in sorted(exits.items())},
        "ended": _ended(raw, a, mine, exits),
        "last_step": max((lane.steps[-1] for lane in lanes if lane.steps), default=None),
        "rank_batch": _rank_batch(raw, a),
        "lanes": [_lane(lane, segments, exits.get(lane.rank), raw) for lane in lanes],
        # --cmd's warm launcher fell back to fresh interpreters, and why (absent in older runs and elsewhere).
        "cold_reason": (header or {}).get("cold_reason"),
    }


def _rank_batch(raw: RawRun, a: int) -> int | None:
    """Samples one rank used per update in this attempt (rank 0's first batch): it changes with the world size."""
    first = raw.first_batch(a, 0)
    return raw.samples(a, 0, first) if first is not None else None


def _ended(raw: RawRun, a: int, mine: list[dict[str, Any]], exits: dict[int, Any]) -> str:
    end = next((ev for ev in reversed(raw.events) if ev.get("kind") == "end"), None)
    last = max((ev["attempt"] for ev in raw.events if type(ev.get("attempt")) is int), default=a)
    last = max([last] + [att for att, _ in raw.lanes])
    if any(ev.get("kind") == "hang" for ev in mine):
        return "hang"
    if end is not None and end.get("status") == "interrupted" and a == last:
        return "interrupted"  # the harness was stopped and killed the ranks: not a failure of theirs
    # A rank killed after its "done" for not exiting in time had finished training (exit_overdue).
    late = {r for ev in mine if ev.get("kind") == "exit_overdue" for r in overdue_ranks(ev)}
    exits = {r: 0 if r in late else code for r, code in exits.items()}
    if exits and all(code == 0 for code in exits.values()):
        return "completed"
    if any(code not in (0, None) for code in exits.values()):
        return "failed"
    if end is not None and a == last:
        return str(end.get("status"))
    return "failed" if a < last else "unknown"


def _lane(lane: LaneLog, segments: list[tuple[int, int]], code: Any, raw: RawRun) -> dict[str, Any]:
    done = ranges(lane.steps)
    in_lineage, redo = split_ranges(done, segments)
    return {
        "rank": lane.rank,
        "ranges": done,
        "lineage": in_lineage,
        "redo": redo,
        "first_s": raw.rel(lane.times[0]) if lane.times else None,
        "last_s": raw.rel(lane.times[-1]) if lane.times else None,
        "exit": code,
    }


def ranges(steps: Iterable[int]) -> list[list[int]]:
    """[1, 2, 3, 7, 8] -> [[1, 3], [7, 8]]: contiguous runs, so a picture draws bars, not cells.
    C-level passes (a run has a hundred thousand steps per lane): the run breaks where a step
    is not one more than the one before; numpy's for a long column (invariants/vectors.py)."""
    if isinstance(steps, Sized):
        runs = vectors.consecutive_runs(steps)
        if runs is not None:
            return runs
    ks = sorted(set(steps))
    if not ks:
        return []
    breaks = list(compress(range(1, len(ks)), map(ne, islice(ks, 1, None), map(add, ks, repeat(1)))))
    starts, ends = [0, *breaks], [*breaks, len(ks)]
    return [[ks[i], ks[j - 1]] for i, j in zip(starts, ends)]


def split_ranges(done: list[list[int]], segments: list[tuple[int, int]]) -> tuple[list[list[int]], list[list[int]]]:
    """`ranges` of the steps inside any of `segments`, and of those outside: what `ranges` of each
    part of the steps would give, cut from the ranges (pieces of one range are never adjacent: a
    covered stretch or a gap lies between them), not step by step."""
    cover: list[list[int]] = []
    for lo, hi in sorted(segments):  # the union: overlapping or adjacent segments join
        if cover and lo <= cover[-1][1] + 1:
            cover[-1][1] = max(cover[-1][1], hi)
        elif lo <= hi:
            cover.append([lo, hi])
    inside: list[list[int]] = []
    outside: list[list[int]] = []
    for lo, hi in done:
        at = lo
        for c_lo, c_hi in cover:
            if c_hi < at or c_lo > hi:
                continue
            if c_lo > at:
                outside.append([at, c_lo - 1])
            inside.append([max(at, c_lo), min(hi, c_hi)])
            at = min(hi, c_hi) + 1
            if at > hi:
                break
        if at <= hi:
            outside.append([at, hi])
    return inside, outside


# ----- checkpoints, faults, hangs -------------------------------------------------------


def _saves(raw: RawRun) -> list[dict[str, Any]]:
    return [{"attempt": ev.get("attempt"), "rank": ev.get("rank", 0), "step": ev.get("step"),
             "checkpoint": ev.get("checkpoint"), "t_s": raw.rel(ev["t"]), "seconds": ev.get("seconds")}
            for ev in raw.of_kind("save")]


def _missed_saves(raw: RawRun) -> list[dict[str, Any]]:
    """Saves the trainer was due to make (every ckpt_interval and at the end) after an update the
    writer applied, but that never committed: the attempt died before or during them."""
    config = raw.spec.get("config") if isinstance(raw.spec.get("config"), dict) else {}
    interval, total = config.get("ckpt_interval"), raw.spec.get("total_steps")
    if type(interval) is not int or interval <= 0:
        return []
    committed = {(ev.get("attempt"), ev.get("step")) for ev in raw.of_kind("save")}
    missed = []
    for (a, rank), lane in sorted(raw.lanes.items()):
        if rank != 0:
            continue
        for k in sorted(set(lane.steps)):
            if saves_after_step(k, interval, total if type(total) is int else -1) and (a, k) not in committed:
                missed.append({"attempt": a, "step": k})
    return missed


def _faults(raw: RawRun) -> list[dict[str, Any]]:
    plan = {str(f.get("id")): f for f in raw.spec.get("faults", []) if isinstance(f, dict)}
    seen: set[str] = set()
    out = []
    for ev in raw.of_kind("fault"):
        fid = str(ev.get("fault_id"))
        planned = plan.get(fid, {})
        rank = ev.get("rank")
        ranks = ev.get("ranks") or ([rank] if type(rank) is int else [])
        out.append({
            "id": fid, "kind": planned.get("kind", "?"), "signal": ev.get("signal") or planned.get("signal"),
            "attempt": ev.get("attempt"), "rank": rank, "ranks": ranks, "t_s": raw.rel(ev["t"]),
            "detail": ev.get("detail"), "checkpoint": ev.get("checkpoint"), "expect": planned.get("expect"),
            "in_step": _step_in_progress(raw, ev.get("attempt"), ranks, ev["t"]),
            "repeat": fid in seen,
        })
        seen.add(fid)
    return out


def _step_in_progress(raw: RawRun, attempt: Any, ranks: list[int], t: float) -> int | None:
    """The update the fault's rank was working on when it fired: one past its last applied step."""
    done = [k for r in ranks for k, tk in _lane_points(raw, attempt, r) if tk <= t]
    if not ranks or (attempt, ranks[0]) not in raw.lanes:
        return None
    return max(done, default=0) + 1


def _lane_points(raw: RawRun, attempt: Any, rank: int) -> list[tuple[int, float]]:
    lane = raw.lanes.get((attempt, rank))
    return list(zip(lane.steps, lane.times)) if lane else []


def _hangs(raw: RawRun, run_dir: Path) -> list[dict[str, Any]]:
    return [{"attempt": ev.get("attempt"), "ranks": ev.get("ranks", []), "waiting": ev.get("waiting", []),
             "last_step": ev.get("last_step"), "detected_after_s": ev.get("detected_after_s"),
             "t_s": raw.rel(ev["t"]),
             "stacks": [_stack(run_dir, str(s)) for s in ev.get("stacks", []) if isinstance(s, str)]}
            for ev in raw.of_kind("hang")]


_RANK_IN_NAME = re.compile(r"-r(\d+)")


def _stack(run_dir: Path, rel: str) -> dict[str, Any]:
    """Where a rank stood when the watchdog fired: the first trainer frame of its training thread's
    dump, and the innermost; `threads` counts the dump's thread blocks, `faulthandler` says whether
    faulthandler's C handler wrote it (its headers)."""
    match = _RANK_IN_NAME.search(Path(rel).name)
    out: dict[str, Any] = {"file": rel, "rank": int(match.group(1)) if match else None,
                           "frame": None, "innermost": None, "threads": 0, "faulthandler": False}
    try:  # only a regular file inside stacks/, bounded: the event's path is data, not a file to open
        text = read_text(run_dir / rel, STACK_LIMIT, root=RunDir(run_dir).stacks)
    except (OSError, ValueError):
        return out
    threads = thread_stacks(text)
    training = training_thread(threads)
    frames = training.frames if training else ()
    short = [f"{'/'.join(Path(f['path']).parts[-2:])}:{f['line']} {f['func']}" for f in frames]
    ours = [s for s, f in zip(short, frames) if re.search(r"/(trainer|faults)/", f["path"])]
    out["threads"], out["faulthandler"] = len(threads), by_faulthandler(text)
    out["innermost"] = short[0] if short else None
    out["frame"] = ours[0] if ours else out["innermost"]
    # A rank held by a planned fault stands in the injector's own code (faults/): the fault, not a bug.
    out["in_injector"] = bool(out["frame"]) and str(out["frame"]).startswith("faults/")
    return out


def _lineage_json(lineage: Lineage | None) -> dict[str, Any] | None:
    if lineage is None:
        return None
    return {"segments": [{"attempt": s.attempt, "first": s.first, "last": s.last, "restored": s.restored}
                         for s in lineage.segments],
            "final_step": lineage.final_step, "complete": lineage.complete, "problems": list(lineage.problems),
            "redo_steps": {str(a): n for a, n in sorted(lineage.redo.items())}}


# ----- phases ---------------------------------------------------------------------------


def _phases(raw: RawRun, hung: bool = False) -> dict[str, Any]:
    """Seconds per phase per rank. No rank is called the slowest in a run where a hang was declared: the
    watchdog names the suspect, and the ranks that waited for it pile up time of their own (a stopped
    rank reports no phases at all), so own work would point at a waiting rank."""
    per_rank: dict[int, dict[str, float]] = {}
    steps: dict[int, int] = {}
    paid: dict[int, int] = {}
    for (_, rank), lane in raw.lanes.items():
        totals = per_rank.setdefault(rank, {})
        for name, seconds in lane.phase_totals.items():
            totals[name] = totals.get(name, 0.0) + seconds
        steps[rank] = steps.get(rank, 0) + lane.phase_steps
        paid[rank] = paid.get(rank, 0) + lane.checkpoint_steps
    names = list(TIMED_PHASES) + sorted({n for t in per_rank.values() for n in t} - set(TIMED_PHASES))
    rows = []
    for rank in sorted(per_rank):
        totals = {n: round(per_rank[rank].get(n, 0.0), 6) for n in names}
        n = max(steps[rank], 1)
        rows.append({"rank": rank, "steps": steps[rank], "checkpoint_steps": paid[rank], "totals": totals,
                     "mean_step_s": round(sum(totals.values()) / n, 6),
                     "own_s": round(sum(totals.get(p, 0.0) for p in OWN_PHASES), 6)})
    rows = [r for r in rows if r["steps"]]
    slowest = max(rows, key=lambda r: r["own_s"])["rank"] if len(rows) > 1 and not hung else None
    saves = [s for s in (ev.get("seconds") for ev in raw.of_kind("save")) if isinstance(s, (int, float))]
    # The save after the last update also flushes the run's end: a Young/Daly cost quotes the periodic ones.
    total = raw.spec.get("total_steps")
    periodic = [ev["seconds"] for ev in raw.of_kind("save") if isinstance(ev.get("seconds"), (int, float))
                and ev.get("step") != total]
    # The median, not the mean: one hung step (seconds inside an all-reduce) would
    # otherwise pass for the cost of every step.
    work = sorted(w for lane in raw.lanes.values() for w in lane.work)
    return {"phase_names": names, "ranks": rows, "slowest_rank": slowest,
            "median_step_s": round(work[len(work) // 2], 6) if work else None,
            "save_seconds": {"count": len(saves), "mean": _round(sum(saves) / len(saves)) if saves else None,
                             "max": _round(max(saves)) if saves else None,
                             "interval_count": len(periodic),
                             "interval_mean": _round(sum(periodic) / len(periodic)) if periodic else None}}


# ----- loss and state ------------------------------------------------------------------


def _loss(raw: RawRun) -> dict[str, Any]:
    """Rank 0's loss per update, from the attempt that last applied it (the one whose state lives on):
    what a comparison across parallelisms quotes, where digests cannot match bit for bit."""
    from trainwreck.report.plots import lanes_losses  # plots imports nothing of the model

    # A lane's losses are floats, None where the event had no number (report/rawlog.py).
    best = lanes_losses((attempt, lane.steps, lane.losses) for (attempt, rank), lane in raw.lanes.items() if rank == 0)
    steps = list(best)
    return {"steps": steps, "values": list(best.values()), "final": best[steps[-1]] if steps else None}


def _golden_loss(report: dict[str, Any]) -> dict[str, Any] | None:
    """Rank 0's loss against the golden run's at the same updates: the final pair and the largest
    relative gap (what a sentence about "the loss" must say when the run left the golden curve)."""
    golden = report.get("golden")
    if not isinstance(golden, str) or not Path(golden).is_dir():
        return None
    from trainwreck.report.plots import lineage_losses  # plots imports nothing of the model

    theirs = lineage_losses(Path(golden))
    ours = dict(zip(report["loss"]["steps"], report["loss"]["values"]))
    common = sorted(set(ours) & set(theirs))
    if not common:
        return None
    gaps = [((ours[k] - theirs[k]) / max(abs(theirs[k]), 1e-12), k) for k in common]
    worst = max(gaps, key=lambda g: abs(g[0]))
    last = common[-1]
    return {"final_step": last, "final": theirs[last], "final_gap": _round(gaps[-1][0], 4),
            "max_gap": _round(worst[0], 4), "max_gap_step": worst[1]}


MANIFEST_LIMIT = 1 << 20
"""A checkpoint manifest is a few hundred bytes per file; a bigger one is not read."""
STATE_FILES = ("model.pt", "optimizer.pt")
"""A DDP checkpoint's model and optimizer payloads: the full state every replica holds (rank 0 writes it)."""
SHARD_FILE = re.compile(r"__(\d+)_0\.distcp")
"""torch.distributed.checkpoint's file for one rank's shards (FSDP)."""


def _state(run_dir: Path, raw: RawRun) -> dict[str, Any] | None:
    """What a rank holds of model + optimizer state, from the file sizes in the newest committed
    checkpoint's manifest (its own record, checked on every restore): FSDP writes one shard per rank,
    DDP one copy of the state that every rank holds in full. None without a readable manifest."""
    present = _checkpoint_names(run_dir)  # retention pruned most saves: read only what is there
    for save in reversed(raw.of_kind("save")):
        name = save.get("checkpoint")
        present_name = isinstance(name, str) and name in present and re.fullmatch(r"step-\d+", name)
        manifest = _manifest(run_dir, name) if present_name else None
        if manifest is not None:
            break
    else:
        return None
    sizes = {k: v.get("size") for k, v in manifest["files"].items() if isinstance(v, dict)}
    sizes = {k: v for k, v in sizes.items() if type(v) is int}
    world = manifest.get("world_size") if type(manifest.get("world_size")) is int else None
    shards = sorted((int(m.group(1)), sizes[k]) for k in sizes if (m := SHARD_FILE.fullmatch(k)))
    if shards:
        rank_bytes = [size for _, size in shards]
    elif world and all(k in sizes for k in STATE_FILES):
        rank_bytes = [sum(sizes[k] for k in STATE_FILES)] * world
    else:
        return None
    total = sum(rank_bytes) if shards else rank_bytes[0]
    return {"checkpoint": name, "step": manifest.get("step"), "parallelism": "fsdp" if shards else "ddp",
            "world_size": world, "rank_bytes": rank_bytes, "state_bytes": total,
            "rank_share": _round(max(rank_bytes) / total, 4) if total else None}


def _checkpoint_names(run_dir: Path) -> set[str]:
    """The names under checkpoints/ (none when it is missing, unreadable or itself a symlink)."""
    root = RunDir(run_dir).checkpoints
    try:
        return set() if root.is_symlink() else {entry.name for entry in os.scandir(root)}
    except OSError:
        return set()


def _manifest(run_dir: Path, name: str) -> dict[str, Any] | None:
    """checkpoints/NAME/manifest.json, only if no part of the path is a symlink (never followed out of
    the run directory) and it is a small JSON object with a `files` object."""
    root = RunDir(run_dir).checkpoints
    path = root / name / "manifest.json"
    try:
        if any(p.is_symlink() for p in (root, root / name, path)):
            return None
        data = read_json(path, MANIFEST_LIMIT, root=root)  # a regular file, bounded: never a FIFO's wait
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


# ----- recovery -------------------------------------------------------------------------


def _recovery(raw: RawRun, attempts: list[dict[str, Any]], lineage: Lineage | None) -> list[dict[str, Any]]:
    """One row per attempt that failed: what hit it, what it lost, how long until work resumed."""
    rows = []
    by_number = {a["attempt"]: a for a in attempts}
    for att in attempts:
        if att["ended"] in ("completed", "unknown", "interrupted") or not att["lanes"]:
            continue
        rows.append(_recovery_row(raw, att, by_number.get(att["attempt"] + 1), lineage))
    return rows


def _recovery_row(raw: RawRun, att: dict[str, Any], nxt: dict[str, Any] | None,
                  lineage: Lineage | None) -> dict[str, Any]:
    a = att["attempt"]
    mine = [ev for ev in raw.events if ev.get("attempt") == a]
    hang = next((ev for ev in mine if ev.get("kind") == "hang"), None)
    death = next((ev for ev in mine if ev.get("kind") == "exit" and ev.get("code") not in (0, None)), None)
    fault = _failing_fault(raw, mine, hang, death)
    cause_ev = fault or hang or death
    fail_t = cause_ev["t"] if cause_ev else raw.t0 + (att["end_s"] or 0.0)
    reached = [spill.extreme_where(lane.steps, lane.times, le, fail_t, highest=True)
               for (aa, _), lane in raw.lanes.items() if aa == a]
    progress = max((k for k in reached if k is not None), default=0)
    save = max((ev for ev in raw.of_kind("save") if ev["t"] <= fail_t and type(ev.get("step")) is int),
               key=lambda ev: (ev["step"], ev["t"]), default=None)
    seen_t = (hang or next((ev for ev in mine if ev.get("kind") == "exit"), None) or {}).get("t")
    segments = [(s.first, s.last) for s in lineage.segments if s.attempt == a] if lineage else []
    redo = [(r, k) for (aa, r), lane in raw.lanes.items() if aa == a
            for lo, hi in split_ranges(ranges(lane.steps), segments)[1] for k in range(lo, hi + 1)]
    row: dict[str, Any] = {
        "attempt": a,
        "cause": _cause(fault, hang, death),
        "fault_id": fault.get("fault_id") if fault else None,
        "failed_s": raw.rel(fail_t),
        "progress_at_failure": progress,
        "checkpoint": save.get("checkpoint") if save else None,
        "checkpoint_step": save.get("step") if save else 0,
        "checkpoint_age_steps": progress - (save["step"] if save else 0),
        "checkpoint_age_s": _round(fail_t - save["t"]) if save else None,
        "detected_after_s": _round(seen_t - fail_t) if seen_t is not None else None,
        "steps_redone": len({k for _, k in redo}),
        "samples_redone": sum(raw.samples(a, r, k) for r, k in redo),
        "restart_after_s": None, "resumed_after_s": None, "recovered_after_s": None,
        "restored": nxt["restored"] if nxt else None,
    }
    if nxt is not None:
        row.update(_resume_times(raw, nxt, fail_t, progress))
    return row


def _failing_fault(raw: RawRun, mine: list[dict[str, Any]], hang: dict[str, Any] | None,
                   death: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fault that ended the attempt. Only faults aimed at ranks count (damage to a checkpoint
    between attempts kills nobody); for a hang, the one planned to hang; otherwise the last one
    before the hang or the first death, since an earlier delay or stall was survived."""
    faults = [ev for ev in mine if ev.get("kind") == "fault" and (ev.get("rank") is not None or ev.get("ranks"))]
    if hang is not None:
        expected = {str(f.get("id")) for f in raw.spec.get("faults", []) if isinstance(f, dict)
                    and f.get("expect") == "hang"}
        planned = [ev for ev in faults if str(ev.get("fault_id")) in expected]
        if planned:
            return planned[0]
    end = (hang or death or {}).get("t")
    before = [ev for ev in faults if end is None or ev["t"] <= end]
    return (before or faults or [None])[-1] if end is not None else (faults or [None])[0]


def _cause(fault: dict[str, Any] | None, hang: dict[str, Any] | None, death: dict[str, Any] | None) -> str:
    if fault is not None:
        text = f"fault {fault.get('fault_id')}"
        return f"{text}: {fault['detail']}" if fault.get("detail") else text
    if hang is not None:
        return f"hang of rank(s) {', '.join(map(str, hang.get('ranks', [])))} (no planned fault)"
    if death is not None:
        return f"rank {death.get('rank')} exited with code {death.get('code')}"
    return "the attempt ended without completing"


def _resume_times(raw: RawRun, nxt: dict[str, Any], fail_t: float, progress: int) -> dict[str, Any]:
    back = min((t for (a, _), lane in raw.lanes.items() if a >= nxt["attempt"]
                for t in [spill.extreme_where(lane.times, lane.steps, ge, progress, highest=False)]
                if t is not None), default=None)
    t0 = raw.t0 or 0.0
    return {
        "restart_after_s": _round(t0 + nxt["start_s"] - fail_t) if nxt["start_s"] is not None else None,
        "resumed_after_s": _round(t0 + nxt["first_step_s"] - fail_t) if nxt["first_step_s"] is not None else None,
        "recovered_after_s": _round(back - fail_t) if back is not None else None,
    }


def _totals(report: dict[str, Any]) -> dict[str, Any]:
    applied = sum(len({k for lane in att["lanes"] for lo, hi in lane["ranges"] for k in range(lo, hi + 1)})
                  for att in report["attempts"])
    lineage = report["lineage"] or {}
    return {
        "attempts": len(report["attempts"]),
        "steps_applied": applied,
        "lineage_steps": sum(s["last"] - s["first"] + 1 for s in lineage.get("segments", [])),
        "redo_steps": sum(lineage.get("redo_steps", {}).values()),
        "samples_redone": sum(r["samples_redone"] for r in report["recovery"]),
        "final_step": lineage.get("final_step"),
    }


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


# ----- the one-line story ---------------------------------------------------------------

SAVE_FAULTS = ("torn_write", "crash_op", "storage_error")
"""Fault kinds that fire inside a checkpoint save (faults/plan.py), not inside an update."""


def headline(report: dict[str, Any], say: Claims | None = None) -> str:
    """What happened, in one sentence a reader can say out loud: each part a claim (section "summary")."""
    say = say if say is not None else Claims(report)
    say.section = "summary"
    fired = [i for i, f in enumerate(report["faults"]) if not f["repeat"]][:3]
    faults = [_fault_claim(say, i, report["faults"][i]) for i in fired]
    say("summary.no_fault", "no fault fired", fact("faults", "==", []))
    for i, row in enumerate(report["recovery"]):
        restored = row["restored"]
        where = "restarted from {ckpt} (step {step})" if restored else \
            ("restarted from scratch" if row["resumed_after_s"] is not None else "did not restart")
        when = "after update {k}" if row["progress_at_failure"] else "before its first update"
        r = f"recovery.{i}"
        say("summary.attempt", "attempt {a} failed " + when + " and " + where
            + ("; {n} update(s) of its work redone" if row["steps_redone"] else ""), a=F(f"{r}.attempt"),
            **({"k": F(f"{r}.progress_at_failure")} if row["progress_at_failure"] else {}),
            **({"ckpt": F(f"{r}.restored.checkpoint"), "step": F(f"{r}.restored.step")} if restored else {}),
            **({"n": F(f"{r}.steps_redone")} if row["steps_redone"] else {}))
    final = report["outcome"] or next((a["ended"] for a in reversed(report["attempts"])), "unknown")
    say("summary.end", "{final} at step {step} after {n} attempt(s)", final=final, step=F("totals.final_step"),
        n=F("totals.attempts"))
    verdicts = report["verdicts"]
    bad = [n for n, v in verdicts.items() if v.get("valid") is False]
    unsure = [n for n, v in verdicts.items() if v.get("valid") not in (True, False)]
    # "violated: a, b" says the others were not: it presumes every verdict's word, named or not.
    say("summary.violated", "violated: {names}", Presume("valid", "==", False),
        *(Presume(f"verdicts.{n}.valid", "==", v.get("valid")) for n, v in verdicts.items()), names=", ".join(bad))
    say("summary.unjudged", "not judged: {names}", Presume("valid", "not in", [True, False]), *_each(unsure, "unknown"),
        names=", ".join(unsure) or "see notes")
    say("summary.all_hold", "all {n} invariants hold", Presume("valid", "==", True), *_each(list(verdicts), True),
        n=len(verdicts))
    parts = [c.text for c in say.of("summary") if c.rendered and c not in faults]
    if faults:  # the faults are one part of the story, one claim each
        parts.insert(0, "; ".join(c.text for c in faults))
    story = " → ".join(parts) + "."
    cause = report.get("root_cause")
    return f"{_capital(cause['sentence'])}. {story}" if cause else story


def _each(names: list[str], valid: Any) -> list[Presume]:
    """A presumption per named verdict (the summary names them, so it presumes each one's word)."""
    if valid == "unknown":
        return [Presume(f"verdicts.{n}.valid", "not in", [True, False]) for n in names]
    return [Presume(f"verdicts.{n}.valid", "==", valid) for n in names]


def recovery_claims(say: Claims, report: dict[str, Any]) -> None:
    """The recovery section's sentences: nothing to recover from, or what each failure cost."""
    say.section = "recovery"
    say("recovery.none", "No attempt failed: nothing to recover from.", fact("recovery", "==", []))
    for i, row in enumerate(report["recovery"]):
        r = f"recovery.{i}"
        say("recovery.row", "Attempt {a} failed at +{t:.3f} s ({cause}), {age} update(s) after its newest checkpoint"
            + (" ({ckpt})" if row["checkpoint"] else " (none)") + "; it redid {n} update(s).",
            a=F(f"{r}.attempt"), t=F(f"{r}.failed_s"), cause=F(f"{r}.cause"), age=F(f"{r}.checkpoint_age_steps"),
            n=F(f"{r}.steps_redone"), **({"ckpt": F(f"{r}.checkpoint")} if row["checkpoint"] else {}))
        for j, reject in enumerate(report["facts"]["rejects"]):
            if reject["attempt"] == row["attempt"] + 1:
                say("recovery.reject", "Attempt {a} rejected {ckpt} on load: {reason}.", a=F(f"facts.rejects.{j}.attempt"),
                    ckpt=F(f"facts.rejects.{j}.checkpoint"), reason=F(f"facts.rejects.{j}.reason"))
        if row["resumed_after_s"] is not None:
            say("recovery.resumed", "Training ran again {s:.3f} s after that failure, measured from its fault, hang or "
                "first death.", s=F(f"{r}.resumed_after_s"))
    for k, _ in enumerate(report["facts"]["leftovers"]):
        left = f"facts.leftovers.{k}"
        say("recovery.leftover", "Attempt {a} left {n} process(es) running after its ranks were done (pid {pids}: "
            "{cmds}); the harness ended them with the attempt.", a=F(f"{left}.attempt"), n=F(f"{left}.count"),
            pids=F(f"{left}.pids"), cmds=F(f"{left}.commands"))
    for k, _ in enumerate(report["facts"]["exit_overdue"]):
        late = f"facts.exit_overdue.{k}"
        say("recovery.exit_overdue", "In attempt {a}, {who} published done but had not exited {s:.1f} s later, past "
            "the exit budget of {b:g} s (configured): the harness dumped the stacks ({stacks}) and killed {it} with "
            "SIGKILL. Training was over, so the attempt counts as completed.", a=F(f"{late}.attempt"),
            who=F(f"{late}.who"), it=F(f"{late}.it"), s=F(f"{late}.after_s"), b=F(f"{late}.budget_s"),
            stacks=F(f"{late}.stacks"))


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _fault_claim(say: Claims, i: int, fault: dict[str, Any]) -> Any:
    """One fired fault as the headline says it: what, at whom, in which update, in which attempt."""
    at = f"faults.{i}"
    facts: dict[str, Any] = {"what": F(f"{at}.signal") if fault["signal"] else F(f"{at}.kind"),
                             "a": F(f"{at}.attempt")}
    if fault["rank"] is not None:
        who, facts["who"] = "rank {who}", F(f"{at}.rank")
    elif fault["ranks"]:
        who, facts["who"] = "ranks {who}", ", ".join(map(str, fault["ranks"]))
    elif fault.get("checkpoint"):
        who, facts["who"] = "{who}", F(f"{at}.checkpoint")
    else:
        who = "the job"
    when = ""
    if fault["in_step"] and fault["kind"] in SAVE_FAULTS:  # they fire inside the save after the last update
        when, facts["before"] = " during the save after update {before}", fault["in_step"] - 1
    elif fault["in_step"]:
        when, facts["step"] = " in update {step}", F(f"{at}.in_step")
    return say("summary.fault", "{what} " + who + when + " (attempt {a})", **facts)
