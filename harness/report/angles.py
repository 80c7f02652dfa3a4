"""The interview angle: the question a case answers, answered with this run's measured numbers.

Each topic is triggered by what the run contains (the fault kinds of its plan, its
restarts, its world sizes, its hangs) or by an invariant it threatened or broke, and
its answer quotes figures from the report, so a reader can explain the case out loud
with evidence instead of folklore.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from trainwreck.faults.plan import KIND_TOPICS  # fault kind -> its topics, declared by each kind (Kind.topics)
from trainwreck.invariants.verdict import verdict_word

GLOO_DEFAULT_TIMEOUT_S = 1800.0
"""torch.distributed's default collective timeout for gloo (30 minutes)."""

QUESTIONS: dict[str, str] = {
    "resume": "How do you know a resumed run is the same run?",
    "silent": "What is the most dangerous silent failure around a checkpoint?",
    "world": "What breaks when the world size changes?",
    "frequency": "How do you pick the checkpoint frequency?",
    "hang": "How do you find the rank that hangs?",
    "sharding": "When do you move from DDP to FSDP, and what happens to sharded state when the world size changes?",
    "async": "Why not checkpoint asynchronously, and what does a crash during the background write lose?",
}
ADAM_BYTES_PER_PARAM = 12
"""fp32 parameters plus AdamW's two fp32 moments (4 + 4 + 4), all of it on every DDP rank."""

# Invariants -> the topic that explains them, and what their violation costs in production.
INVARIANT_TOPICS: dict[str, str] = {
    "coverage": "resume", "continuity": "resume", "atomicity": "silent", "replicas": "silent",
    "hang": "hang", "progress": "frequency",
}
VIOLATION_COST: dict[str, str] = {
    "coverage": "samples were trained twice or never: the model silently saw a different data "
                "distribution, and no loss curve shows it",
    "continuity": "the resumed model is not the one that was saved (weights, optimizer moments or "
                  "schedule drifted); training goes on without an error",
    "atomicity": "a checkpoint that was not (or no longer) intact was loaded, or an intact newer one "
                 "was skipped and its work thrown away",
    "hang": "a hung rank went unnoticed, or the watchdog blamed the wrong rank or a healthy job",
    "replicas": "DDP replicas diverged: each rank now trains its own model while the job looks healthy",
    "progress": "the job did not finish within its restart budget",
}


def interview_angles(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The topics this run speaks to, the scenario's own question first, each answered from the report."""
    triggers = _triggers(report)
    order = list(triggers)
    scenario_topic = _topic_of_question((report.get("scenario") or {}).get("question", ""))
    if scenario_topic in order:
        order.remove(scenario_topic)
        order.insert(0, scenario_topic)
    angles = []
    for topic in order:
        answer = ANSWERS[topic](report)
        if answer:
            question = QUESTIONS[topic]
            if topic == "hang" and not report["hangs"]:  # nothing hung: the case is telling slow from stuck
                question = "How do you tell a straggler from a hang?"
            angles.append({"topic": topic, "question": question, "answer": answer,
                           "raised_by": sorted(triggers[topic])})
    angles.extend(_violations(report))
    return angles


def _triggers(report: dict[str, Any]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for fault in report["plan"]:
        kind = str(fault.get("kind"))
        topics = KIND_TOPICS.get(kind, ())
        if kind == "signal" and fault.get("signal") == "SIGSTOP":
            topics = ("hang",)
        elif kind == "signal" and fault.get("signal") == "SIGTERM" and fault.get("rank") == 0:
            topics = ("silent", "resume")
        for topic in topics:
            found.setdefault(topic, set()).add(f"fault kind {kind}")
    if any(a["restored"] for a in report["attempts"]):
        found.setdefault("resume", set()).add("a restart restored a checkpoint")
    if len({a["world_size"] for a in report["attempts"] if a["world_size"]}) > 1:
        found.setdefault("world", set()).add("the world size changed between attempts")
    if report["hangs"]:
        found.setdefault("hang", set()).add("the watchdog declared a hang")
    if report["recovery"]:
        found.setdefault("frequency", set()).add("an attempt failed and its work since the last checkpoint was lost")
    spec = report["spec"]
    if spec.get("parallelism") == "fsdp":
        found.setdefault("sharding", set()).add("parallelism fsdp")
    if spec.get("ckpt_mode") == "async":
        found.setdefault("async", set()).add("ckpt_mode async")
    for name, verdict in report["verdicts"].items():
        if verdict.get("valid") is False and name in INVARIANT_TOPICS:
            found.setdefault(INVARIANT_TOPICS[name], set()).add(f"invariant {name} violated")
    return found


def _topic_of_question(question: str) -> str | None:
    text = question.lower()
    for topic, words in (("async", ("background",)), ("hang", ("hang",)), ("world", ("world size",)), ("silent", ("silent",)),
                         ("frequency", ("frequency", "how often")), ("resume", ("resum",))):
        if any(w in text for w in words):
            return topic
    return None


# ----- answers --------------------------------------------------------------------------


def _verdict(report: dict[str, Any], name: str) -> dict[str, Any]:
    return report["verdicts"].get(name) or {}


def _counts(report: dict[str, Any], name: str) -> dict[str, Any]:
    return _verdict(report, name).get("counts") or {}


def _but(report: dict[str, Any], *names: str) -> str:
    """A clause naming the verdicts that did not hold; empty when they all did."""
    bad = [f"{n} is {verdict_word(_verdict(report, n).get('valid'))}: {_verdict(report, n).get('summary', '')}"
           for n in names if n in report["verdicts"] and _verdict(report, n).get("valid") is not True]
    return (" But " + "; ".join(bad) + ".") if bad else ""


def _answer_resume(report: dict[str, Any]) -> str:
    restores = [a for a in report["attempts"] if a["restored"]]
    if not restores:
        return ""
    first = restores[0]
    saves = {s["checkpoint"]: s for s in report["saves"] if s["attempt"] < first["attempt"]}
    save = saves.get(first["restored"]["checkpoint"])
    out = [f"Attempt {first['attempt']} restored {first['restored']['checkpoint']} (step {first['restored']['step']})"
           + (f", saved by attempt {save['attempt']} at +{save['t_s']:.2f} s" if save else "") + "."]
    cont = _counts(report, "continuity")
    if cont:
        out.append(f"Proof one, the state: {cont.get('restores_checked', 0)} restore digest(s) were compared with "
                   f"the digest their save recorded, and {cont.get('saves_checked', 0)} save(s) with the step they hold.")
        if cont.get("golden_steps_checked"):
            out.append(f"Each of the {cont['golden_steps_checked']} lineage steps matches an uninterrupted golden run of "
                       "the same spec (digests where the world sizes match, losses within tolerance where not).")
    cov = _counts(report, "coverage")
    if cov:
        totals = report["totals"]
        out.append(f"Proof two, the data: along the lineage ({cov.get('lineage_steps', 0)} steps, "
                   f"{cov.get('epochs', 0)} epoch(s)) {cov.get('duplicated_ids', 0)} sample id(s) were used twice and "
                   f"{cov.get('ids_not_covered', 0)} missed; the {totals['redo_steps']} redone step(s) "
                   f"({totals['samples_redone']} samples) outside it are cost, not error.")
    out.append("A loss curve that looks continuous proves neither: digests and sample ids do.")
    return " ".join(out) + _but(report, "continuity", "coverage")


def _answer_silent(report: dict[str, Any]) -> str:
    committed = len({(s["attempt"], s["checkpoint"]) for s in report["saves"]})
    damaged = [f for f in report["faults"] if f["checkpoint"]]
    rejected = sorted({c for a in report["attempts"] for c in a["rejected"]})
    missed = report["missed_saves"]
    out = ["The dangerous one is a checkpoint that looks fine and is not: a torn or half-renamed save that a "
           "restart loads without an error, or replicas that drift apart while the loss still falls."]
    out.append(f"Here {committed} save(s) committed, {len(missed)} due save(s) never committed"
               + (f" (step {', '.join(str(m['step']) for m in missed[:4])})" if missed else "")
               + f", {len(damaged)} checkpoint(s) damaged by faults"
               + (f" ({', '.join(sorted({str(f['checkpoint']) for f in damaged})[:4])})" if damaged else "")
               + f", {len(rejected)} rejected on verification"
               + (f" ({', '.join(rejected[:4])})" if rejected else "") + ".")
    out += _writer_hit(report)
    atom = _verdict(report, "atomicity")
    if atom:
        out.append(f"atomicity: {atom.get('summary', '')}.")
    reps = _counts(report, "replicas")
    if reps and any(f.get("kind") in ("nan_grad", "skip_collective") for f in report["plan"]):
        out.append(f"replicas: {_verdict(report, 'replicas').get('summary', '')}.")
    out.append("The defence is a commit protocol (write to a temp name, fsync, rename, then record) and a "
               "verification on load that rejects what does not match its manifest.")
    return " ".join(out) + _but(report, "atomicity", "replicas")


def _writer_hit(report: dict[str, Any]) -> list[str]:
    """When a fault hit rank 0, the only checkpoint writer: how close to its last commit, and what came back."""
    out = []
    for row in report["recovery"]:
        fault = next((f for f in report["faults"] if f["id"] == str(row["fault_id"])), None)
        if fault is None or 0 not in fault["ranks"]:
            continue
        age = f"{row['checkpoint_age_s']:.2f} s after it committed {row['checkpoint']}" if row["checkpoint"] else \
            "before it committed any checkpoint"
        back = f"the restart loaded {row['restored']['checkpoint']}" if row["restored"] else "no restart followed"
        out.append(f"Fault {fault['id']} hit rank 0, the checkpoint writer, {age}; {back}.")
    return out


def _answer_world(report: dict[str, Any]) -> str:
    sizes = [(a["attempt"], a["world_size"], a.get("rank_batch")) for a in report["attempts"] if a["world_size"]]
    if len({w for _, w, _ in sizes}) < 2:
        return ""
    story = ", ".join(f"attempt {a} ran on {w} rank(s)" + (f" ({b} samples each per step)" if b else "")
                      for a, w, b in sizes)
    out = [f"{story[0].upper()}{story[1:]}; the global batch stayed {report['spec'].get('global_batch')} samples."]
    out.append("What breaks: a sampler that shards by rank resumes at the wrong offset (samples skipped or "
               "repeated), per-rank state (RNG, data-loader position) has no owner on the new ranks, and "
               "digests can no longer match bit for bit because the gradient all-reduce sums in another order.")
    cov, cont = _verdict(report, "coverage"), _verdict(report, "continuity")
    if cov:
        out.append(f"coverage: {cov.get('summary', '')}.")
    if cont:
        out.append(f"continuity: {cont.get('summary', '')} (losses compared within a tolerance across world sizes).")
    return " ".join(out) + _but(report, "coverage", "continuity")


def _answer_frequency(report: dict[str, Any]) -> str:
    phases, spec = report["phases"], report["spec"]
    save_s, interval = phases["save_seconds"]["mean"], spec.get("ckpt_interval")
    step_s = phases.get("median_step_s")
    out = []
    if save_s is not None and step_s:
        every = f"every {interval} steps" if interval else "at this rate"
        share = save_s / (save_s + (interval or 1) * step_s)
        out.append(f"Saving {every} cost {save_s:.3f} s per save (max {phases['save_seconds']['max']:.3f} s) against "
                   f"{step_s:.3f} s per step: {share:.0%} of training time.")
    for row in report["recovery"]:
        if not row["progress_at_failure"]:
            out.append(f"Attempt {row['attempt']} failed before its first update: no work to lose.")
            continue
        age_s = f" / {row['checkpoint_age_s']:.2f} s" if row["checkpoint_age_s"] is not None else ""
        back = (f"; it was back at step {row['progress_at_failure']} {row['recovered_after_s']:.2f} s after the failure"
                if row["recovered_after_s"] is not None else "")
        restored = row["restored"]
        went_back = ""
        if row["checkpoint"] and restored and restored["checkpoint"] != row["checkpoint"]:
            went_back = (f" That checkpoint was not usable, so the restart went back to {restored['checkpoint']} "
                         f"(step {restored['step']}).")
        elif row["checkpoint"] and not restored and row["resumed_after_s"] is not None:
            went_back = " That checkpoint was not usable, so the restart began from scratch (step 0)."
        out.append(f"Attempt {row['attempt']} failed {row['checkpoint_age_steps']} step(s){age_s} after its newest "
                   f"checkpoint ({row['checkpoint'] or 'none: back to step 0'}).{went_back} "
                   f"{row['steps_redone']} step(s) ({row['samples_redone']} samples) were redone{back}.")
    if save_s and step_s:
        mtbf = 3600.0
        best_s = math.sqrt(2 * save_s * mtbf)
        out.append(f"Young's rule puts the interval at √(2 × save cost × MTBF): with a failure per hour that is "
                   f"√(2 × {save_s:.3f} × 3600) ≈ {best_s:.1f} s ≈ {best_s / step_s:,.0f} steps. Saving more often "
                   "wastes save time; less often, each failure costs half an interval of redo on average.")
    return " ".join(out) + _but(report, "progress")


def _answer_hang(report: dict[str, Any]) -> str:
    timeout = float(report["spec"].get("hang_timeout_s") or 0.0)
    out = []
    for hang in report["hangs"]:
        fault = _hang_fault(report, hang)
        delay = (hang["t_s"] - fault["t_s"]) if fault and hang["t_s"] is not None else None
        named = ", ".join(map(str, hang["ranks"])) or "nobody"
        out.append((f"{delay:.2f} s after {fault['id']} hit rank {fault['rank']}, " if delay is not None else "")
                   + f"the watchdog named rank(s) {named} as the suspects "
                   + f"(no progress for {hang['detected_after_s']} s against a {timeout:g} s timeout)"
                   + (f"; rank(s) {', '.join(map(str, hang['waiting']))} were waiting behind them" if hang["waiting"] else "")
                   + ".")
        frames = [f"rank {s['rank']} at {s['frame']}" for s in hang["stacks"] if s.get("frame")]
        if frames:
            out.append(f"Its stack dumps show {'; '.join(frames[:4])}.")
        if fault and fault["rank"] not in hang["ranks"]:
            out.append(f"It did not name rank {fault['rank']}, the one the fault hit.")
        elif fault and len(hang["ranks"]) > 1:
            out.append("It names every rank furthest behind: a stuck rank and the ranks blocked with it in the "
                       "same collective phase look alike from progress alone; the stacks tell them apart.")
    if out:
        out.append(f"gloo alone would have waited {GLOO_DEFAULT_TIMEOUT_S:.0f} s (its default collective timeout) "
                   "and then raised on the waiting ranks, naming nobody.")
        return " ".join(out) + _but(report, "hang")
    phases = report["phases"]
    if phases["slowest_rank"] is not None:
        rows = {r["rank"]: r for r in phases["ranks"]}
        slow = rows[phases["slowest_rank"]]
        others = _median([r["own_s"] for r in phases["ranks"] if r["rank"] != slow["rank"]])
        ratio = f" ({slow['own_s'] / others:.1f}× the others' median)" if others else ""
        out.append(f"No hang was declared: a slow rank keeps changing its progress board, so it is not a hung rank. "
                   f"Rank {slow['rank']} spent {slow['own_s']:.2f} s in its own phases (data, forward, optimizer)"
                   f"{ratio}; the others wait for it inside the all-reduce, which is where their time goes.")
    return " ".join(out) + _but(report, "hang")


def _hang_fault(report: dict[str, Any], hang: dict[str, Any]) -> dict[str, Any] | None:
    """The fault behind a hang: the one planned to hang, else the last one at a rank before it."""
    mine = [f for f in report["faults"] if f["attempt"] == hang["attempt"] and f["rank"] is not None
            and not f["repeat"]]
    planned = [f for f in mine if f.get("expect") == "hang"]
    before = [f for f in mine if f["t_s"] is not None and hang["t_s"] is not None and f["t_s"] <= hang["t_s"]]
    return (planned or before or [None])[-1]


def _median(values: list[float]) -> float:
    values = sorted(v for v in values if v is not None)
    if not values:
        return 0.0
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _answer_sharding(report: dict[str, Any]) -> str:
    state, phases = report.get("state"), report["phases"]
    out = []
    if state and state["parallelism"] == "fsdp" and state["rank_share"] is not None:
        world = state["world_size"] or len(state["rank_bytes"])
        out.append(f"Its newest checkpoint, {state['checkpoint']}, holds the model and AdamW state as "
                   f"{len(state['rank_bytes'])} shard(s), one per rank, of {_bytes(state['rank_bytes'])}: each rank "
                   f"keeps {state['rank_share']:.1%} of the {state['state_bytes']:,} bytes of all shards together "
                   f"(1/{world} = {1 / world:.1%}, plus the checkpoint format's own framing). In fp32 AdamW that is {ADAM_BYTES_PER_PARAM} bytes per parameter on a DDP rank and "
                   f"{ADAM_BYTES_PER_PARAM}/{world} = {ADAM_BYTES_PER_PARAM / world:g} on each of {world} FSDP ranks.")
    if phases.get("median_step_s") is not None:
        out.append(f"The price is communication: every forward and backward all-gathers the parameters and "
                   f"reduce-scatters the gradients; the median update here took {phases['median_step_s']:.3f} s. "
                   "Move from DDP to FSDP when 12 bytes per parameter, plus gradients and activations, no longer fit "
                   "one device, not before.")
    out += _resharded(report)
    return " ".join(out) + _but(report, "continuity", "coverage")


def _resharded(report: dict[str, Any]) -> list[str]:
    """Each restore of a checkpoint that a different world size wrote: DCP re-sliced its shards on load."""
    sizes = {a["attempt"]: a["world_size"] for a in report["attempts"]}
    writers = {s["checkpoint"]: s["attempt"] for s in report["saves"]}
    out = []
    for att in report["attempts"]:
        restored = att["restored"]
        writer = writers.get(restored["checkpoint"]) if restored else None
        if writer is not None and sizes.get(writer) and att["world_size"] and sizes[writer] != att["world_size"]:
            out.append(f"Attempt {att['attempt']} on {att['world_size']} rank(s) restored {restored['checkpoint']}, "
                       f"written as shards by attempt {writer} on {sizes[writer]} rank(s): the shards were re-sliced "
                       "for the new world size on load, and the global batch stayed "
                       f"{report['spec'].get('global_batch')} samples.")
    return out


def _answer_async(report: dict[str, Any]) -> str:
    phases, saves = report["phases"], report["phases"]["save_seconds"]
    rank0 = next((r for r in phases["ranks"] if r["rank"] == 0), None)
    out = []
    if rank0 and rank0.get("checkpoint_steps") and saves["count"]:
        stall, paid = rank0["totals"].get("checkpoint", 0.0), rank0["checkpoint_steps"]
        out.append(f"The step pays only for a copy of the state into host memory: rank 0 spent {stall:.3f} s in the "
                   f"checkpoint phase of the {paid} step(s) that saved ({stall / paid:.3f} s each), while writing "
                   f"and committing each save took {saves['mean']:.3f} s on average in the background.")
    for row in report["recovery"]:
        if row["restored"] is None:
            continue
        newest = row["checkpoint"] or "none"
        which = ("the newest committed checkpoint at the failure" if newest == row["restored"]["checkpoint"]
                 else f"although {newest} was the newest committed checkpoint at the failure")
        out.append(f"{_capital(row['cause'])}: the save in flight was lost, nothing committed was; the restart "
                   f"loaded {row['restored']['checkpoint']}, {which}, and redid {row['steps_redone']} update(s).")
    out.append("Why not always: the host copy doubles the state's memory while it is written, a failure surfaces "
               "one save later than it happened, and 'saved' must still mean committed, never 'handed to a thread'.")
    return " ".join(out) + _but(report, "atomicity", "continuity")


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _bytes(values: list[int]) -> str:
    shown = ", ".join(f"{v:,}" for v in values[:4])
    return f"{shown}{', ...' if len(values) > 4 else ''} bytes"


ANSWERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "resume": _answer_resume, "silent": _answer_silent, "world": _answer_world,
    "frequency": _answer_frequency, "hang": _answer_hang, "sharding": _answer_sharding, "async": _answer_async,
}


def _violations(report: dict[str, Any]) -> list[dict[str, Any]]:
    """For each broken invariant: what that failure would cost in production, with its first evidence."""
    out = []
    for name, verdict in report["verdicts"].items():
        if verdict.get("valid") is not False:
            continue
        evidence = (verdict.get("evidence") or [""])[0]
        cost = VIOLATION_COST.get(name, "the run broke an invariant")
        out.append({"topic": f"violation:{name}",
                    "question": f"What does a {name} violation mean in production?",
                    "answer": f"{cost[0].upper()}{cost[1:]}. Here: {verdict.get('summary', '')}."
                              + (f" First evidence: {evidence}." if evidence else ""),
                    "raised_by": [f"invariant {name} violated"]})
    return out
