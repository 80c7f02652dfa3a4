"""The interview angle: the question a case answers, answered with this run's measured numbers.

Each topic is triggered by what the run contains (the fault kinds of its plan, its
restarts, its world sizes, its hangs) or by an invariant it threatened or broke, and
its answer is a list of claims (report/claims.py): each sentence quotes figures
from the report and presumes the verdicts and facts it states, so an answer can never say
"matches the golden run" under an INVALID continuity verdict.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from trainwreck.faults.plan import KIND_TOPICS  # fault kind -> its topics, declared by each kind (Kind.topics)
from trainwreck.report.claims import F, Claims, Presume, fact, verdict
from trainwreck.report.presentation import PRESENTATIONS, cost_of
from trainwreck.invariants.verdict import verdict_word

GLOO_DEFAULT_TIMEOUT_S = 1800.0
"""torch.distributed's default collective timeout for gloo (30 minutes): a configured default, not a measurement."""
MTBF_ASSUMED_S = 3600.0
"""The mean time between failures every Young/Daly sum here assumes (reports and handbook alike): one failure
an hour for the whole job. An assumption, stated wherever it is used, never a measurement."""

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
"""fp32 parameters plus AdamW's two fp32 moments (4 + 4 + 4), all of it on every DDP rank; gradients add 4 more."""



def interview_angles(report: dict[str, Any], say: Claims | None = None) -> list[dict[str, Any]]:
    """The topics this run speaks to, the scenario's own question first, each answered by claims."""
    say = say if say is not None else Claims(report)
    triggers = _triggers(report)
    order = list(triggers)
    scenario_topic = _topic_of_question((report.get("scenario") or {}).get("question", ""))
    if scenario_topic in order:
        order.remove(scenario_topic)
        order.insert(0, scenario_topic)
    angles = []
    for topic in order:
        say.section = f"angle:{topic}"
        ANSWERS[topic](say, report)
        answer = say.text(say.section)
        if answer:
            question = QUESTIONS[topic]
            if topic == "hang" and not report["hangs"]:  # nothing hung: the case is telling slow from stuck
                question = "How do you tell a straggler from a hang?"
            angles.append({"topic": topic, "question": question, "answer": answer,
                           "raised_by": sorted(triggers[topic])})
    angles.extend(_violations(say, report))
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
    for name, judged in report["verdicts"].items():
        if judged.get("valid") is False and name in PRESENTATIONS:
            found.setdefault(PRESENTATIONS[name].topic, set()).add(f"invariant {name} violated")
    return found


def _topic_of_question(question: str) -> str | None:
    text = question.lower()
    for topic, words in (("async", ("background",)), ("hang", ("hang",)), ("world", ("world size",)), ("silent", ("silent",)),
                         ("frequency", ("frequency", "how often")), ("resume", ("resum",))):
        if any(w in text for w in words):
            return topic
    return None


# ----- answers --------------------------------------------------------------------------


def _but(say: Claims, report: dict[str, Any], *names: str) -> None:
    """A sentence for each named verdict that did not hold: an answer never ends on a pass it did not get."""
    for name in names:
        if name in report["verdicts"]:
            say(f"but.{name}", "But {name} is {word}: {summary}.", Presume(f"verdicts.{name}.valid", "!=", True),
                name=name, word=_word(report, name), summary=F(f"verdicts.{name}.summary"))


def _word(report: dict[str, Any], name: str) -> str:
    return verdict_word((report["verdicts"].get(name) or {}).get("valid"))


def _answer_resume(say: Claims, report: dict[str, Any]) -> None:
    restores = [i for i, a in enumerate(report["attempts"]) if a["restored"]]
    if not restores:
        return
    i = restores[0]
    first = report["attempts"][i]
    save = next((j for j, s in enumerate(report["saves"]) if s["attempt"] < first["attempt"]
                 and s["checkpoint"] == first["restored"]["checkpoint"]), None)
    at = f"attempts.{i}"
    if save is not None:
        say("resume.restored", "Attempt {a} restored {ckpt} (step {step}), saved by attempt {by} at +{t:.2f} s.",
            a=F(f"{at}.attempt"), ckpt=F(f"{at}.restored.checkpoint"), step=F(f"{at}.restored.step"),
            by=F(f"saves.{save}.attempt"), t=F(f"saves.{save}.t_s"))
    else:
        say("resume.restored", "Attempt {a} restored {ckpt} (step {step}).", a=F(f"{at}.attempt"),
            ckpt=F(f"{at}.restored.checkpoint"), step=F(f"{at}.restored.step"))
    if report["verdicts"].get("continuity", {}).get("counts"):
        say("resume.state", "Proof one, the state: {r} restore digest(s) were compared with the digest their save "
            "recorded ({m} equal), and {s} save(s) with the step they hold.",
            r=F("verdicts.continuity.counts.restores_checked"), m=F("facts.restores.matched"),
            s=F("verdicts.continuity.counts.saves_checked"))
        say("resume.golden", "Each of the {n} lineage steps matches an uninterrupted golden run of the same spec "
            "(digests where the world sizes match, losses within tolerance where not).", verdict("continuity"),
            fact("verdicts.continuity.counts.golden_steps_checked", ">", 0),
            n=F("verdicts.continuity.counts.golden_steps_checked"))
        say("resume.golden_broken", "Against an uninterrupted golden run of the same spec, {v} of the {n} lineage "
            "steps differ, the first at lineage step {step}.", verdict("continuity", False),
            fact("facts.continuity.first_kind", "in", ["golden_digest", "golden_loss"]),
            v=F("verdicts.continuity.counts.violations"), n=F("verdicts.continuity.counts.golden_steps_checked"),
            step=F("facts.continuity.first_step"))
    if report["verdicts"].get("coverage", {}).get("counts"):
        say("resume.data", "Proof two, the data: along the lineage ({l} steps, {e} epoch(s)) {d} (epoch, id) "
            "pair(s) were used twice and {u} id(s) of a completed epoch missed.",
            l=F("verdicts.coverage.counts.lineage_steps"), e=F("verdicts.coverage.counts.epochs"),
            d=F("verdicts.coverage.counts.duplicated_ids"), u=F("verdicts.coverage.counts.ids_not_covered"))
        _pairs(say)
        say("resume.redo", "The {r} redone step(s) ({s} samples) outside the lineage are cost, not error.",
            fact("totals.redo_steps", ">", 0), r=F("totals.redo_steps"), s=F("totals.samples_redone"))
    say("resume.moral", "A loss curve that looks continuous proves neither: digests and sample ids do.")
    _but(say, report, "continuity", "coverage")


def _pairs(say: Claims) -> None:
    """What a count of repeated ids counts: (epoch, id) pairs, so it can exceed the dataset's size."""
    say("counts.pairs", "An id counts once per epoch it repeats in ({split}), so the count of pairs can exceed "
        "the {size} ids of the dataset.", fact("verdicts.coverage.counts.duplicated_ids", ">", 0),
        fact("facts.coverage.twice_epochs", ">", 0),
        split=F("facts.coverage.twice_split"), size=F("spec.dataset_size"))


def _answer_silent(say: Claims, report: dict[str, Any]) -> None:
    committed = len({(s["attempt"], s["checkpoint"]) for s in report["saves"]})
    damaged = sorted({str(f["checkpoint"]) for f in report["faults"] if f["checkpoint"]})
    missed = report["missed_saves"]
    say("silent.danger", "The dangerous one is a checkpoint that looks fine and is not: a torn or half-renamed save "
        "that a restart loads without an error, or replicas that drift apart while the loss still falls.")
    say("silent.tally", "Here {c} save(s) committed, {m} due save(s) never committed{which}, {d} checkpoint(s) "
        "damaged by faults{dnames}, {r} rejected on verification{rnames}.",
        c=committed, m=len(missed), which=f" (step {', '.join(str(x['step']) for x in missed[:4])})" if missed else "",
        d=len(damaged), dnames=f" ({', '.join(damaged[:4])})" if damaged else "",
        r=len(report["facts"]["rejects"]),
        rnames=f" ({', '.join(str(r['checkpoint']) for r in report['facts']['rejects'][:4])})"
        if report["facts"]["rejects"] else "")
    for i, _ in enumerate(report["facts"]["rejects"][:4]):
        say("silent.reject", "Attempt {a} rejected {ckpt} on load: {reason}.", a=F(f"facts.rejects.{i}.attempt"),
            ckpt=F(f"facts.rejects.{i}.checkpoint"), reason=F(f"facts.rejects.{i}.reason"))
    _writer_hit(say, report)
    if "atomicity" in report["verdicts"]:
        say("silent.atomicity", "atomicity: {summary}.", verdict("atomicity"), summary=F("verdicts.atomicity.summary"))
    if report["verdicts"].get("replicas", {}).get("counts") and any(
            f.get("kind") in ("nan_grad", "skip_collective") for f in report["plan"]):
        say("silent.replicas", "replicas: {summary}.", verdict("replicas"), summary=F("verdicts.replicas.summary"))
    say("silent.defence", "The defence is a commit protocol (write to a temp name, fsync, rename, then record) and "
        "a verification on load that rejects what does not match its manifest.")
    _but(say, report, "atomicity", "replicas")


def _writer_hit(say: Claims, report: dict[str, Any]) -> None:
    """When a fault hit rank 0, the only checkpoint writer: how close to its last commit, and what came back."""
    for i, row in enumerate(report["recovery"]):
        fault = next((f for f in report["faults"] if f["id"] == str(row["fault_id"])), None)
        if fault is None or 0 not in fault["ranks"]:
            continue
        r = f"recovery.{i}"
        age = ("{age:.2f} s after it committed {ckpt}" if row["checkpoint"] and row["checkpoint_age_s"] is not None
               else "before it committed any checkpoint")
        back = "the restart loaded {back}" if row["restored"] else "no restart followed"
        say("silent.writer", "Fault {fid} hit rank 0, the checkpoint writer, " + age + "; " + back + ".",
            fid=fault["id"], age=row["checkpoint_age_s"], ckpt=F(f"{r}.checkpoint"),
            back=(row["restored"] or {}).get("checkpoint"))


def _answer_world(say: Claims, report: dict[str, Any]) -> None:
    sizes = [(i, a) for i, a in enumerate(report["attempts"]) if a["world_size"]]
    if len({a["world_size"] for _, a in sizes}) < 2:
        return
    for i, a in sizes:
        say("world.attempt", "Attempt {a} ran on {w} rank(s)" + (" ({b} samples each per update)." if a.get("rank_batch")
            else "."), a=F(f"attempts.{i}.attempt"), w=F(f"attempts.{i}.world_size"),
            **({"b": F(f"attempts.{i}.rank_batch")} if a.get("rank_batch") else {}))
    say("world.batch", "The global batch was configured as {g} samples.", g=F("spec.global_batch"))
    say("world.breaks", "What breaks: a sampler that shards by rank resumes at the wrong offset (samples skipped or "
        "repeated), per-rank state (RNG, data-loader position) has no owner on the new ranks, and digests can no "
        "longer match bit for bit because the gradient all-reduce sums in another order.")
    for name in ("coverage", "continuity"):
        if name in report["verdicts"]:
            say(f"world.{name}", name + ": {summary}.", verdict(name), summary=F(f"verdicts.{name}.summary"))
    _but(say, report, "coverage", "continuity")


def young_interval(save_s: float, mtbf_s: float = MTBF_ASSUMED_S) -> float:
    """Young's (1974) first-order optimum checkpoint interval, seconds: sqrt(2 * save cost * MTBF)."""
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float = MTBF_ASSUMED_S) -> float:
    """Daly's (2006) higher-order optimum, seconds of compute between saves:
    sqrt(2δM) * (1 + sqrt(δ/2M)/3 + (δ/2M)/9) - δ while δ < 2M, else M (δ the save cost, M the MTBF).
    It adds the terms Young's first-order expansion drops, which matter once δ is no longer
    small against M; for δ << M the two agree to within about δ."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def _answer_frequency(say: Claims, report: dict[str, Any]) -> None:
    phases, spec = report["phases"], report["spec"]
    saves = phases["save_seconds"]
    save_s, step_s, interval = saves.get("interval_mean"), phases.get("median_step_s"), spec.get("ckpt_interval")
    if save_s is not None and step_s and interval:
        say("frequency.cost", "Saving every {k} updates (configured) cost {c:.3f} s per save, measured over the {n} "
            "periodic save(s) (the end-of-run save left out), against {u:.3f} s per update (median): {share:.0%} of "
            "training time.", k=F("spec.ckpt_interval"), c=F("phases.save_seconds.interval_mean"),
            n=F("phases.save_seconds.interval_count"), u=F("phases.median_step_s"),
            share=save_s / (save_s + interval * step_s))
    for i, row in enumerate(report["recovery"]):
        r = f"recovery.{i}"
        if not row["progress_at_failure"]:
            say("frequency.nothing_lost", "Attempt {a} failed before its first update: no work to lose.",
                a=F(f"{r}.attempt"))
            continue
        say("frequency.age", "Attempt {a} failed {k} update(s)" + (" / {s:.2f} s" if row["checkpoint_age_s"] is not None
            else "") + " after its newest checkpoint ({ckpt}).", a=F(f"{r}.attempt"), k=F(f"{r}.checkpoint_age_steps"),
            ckpt=row["checkpoint"] or "none: back to step 0",
            **({"s": F(f"{r}.checkpoint_age_s")} if row["checkpoint_age_s"] is not None else {}))
        restored = row["restored"]
        if row["checkpoint"] and restored and restored["checkpoint"] != row["checkpoint"]:
            say("frequency.went_back", "That checkpoint was not usable, so the restart went back to {back} (step "
                "{step}).", back=F(f"{r}.restored.checkpoint"), step=F(f"{r}.restored.step"))
        elif row["checkpoint"] and not restored and row["resumed_after_s"] is not None:
            say("frequency.scratch", "That checkpoint was not usable, so the restart began from scratch (step 0).")
        say("frequency.redo", "{n} update(s) ({s} samples) were redone" + ("; it was back at update {k} {t:.2f} s "
            "after the failure." if row["recovered_after_s"] is not None else "."), n=F(f"{r}.steps_redone"),
            s=F(f"{r}.samples_redone"), **({"k": F(f"{r}.progress_at_failure"), "t": F(f"{r}.recovered_after_s")}
                                            if row["recovered_after_s"] is not None else {}))
    if save_s and step_s and interval:
        best = young_interval(save_s)
        say("frequency.young", "Young's rule puts the interval at √(2 × save cost × MTBF); assuming (not measuring) "
            "one failure an hour for the whole job, that is √(2 × {c:.3f} × {mtbf:g}) ≈ {best:.1f} s ≈ {steps:,.0f} "
            "updates, so this run saves about {ratio:,.0f}× more often than its own optimum.",
            c=F("phases.save_seconds.interval_mean"), mtbf=MTBF_ASSUMED_S, best=best, steps=best / step_s,
            ratio=best / step_s / interval)
        say("frequency.tradeoff", "Saving more often wastes save time; less often, each failure costs half an "
            "interval of redo on average.")
    _but(say, report, "progress")


def _answer_hang(say: Claims, report: dict[str, Any]) -> None:
    for i, hang in enumerate(report["hangs"]):
        h = f"hangs.{i}"
        fault = _hang_fault(report, hang)
        lead = "{delay:.2f} s after {fid} hit rank {frank}, " if fault and hang["t_s"] is not None else ""
        extra = {"delay": hang["t_s"] - fault["t_s"], "fid": fault["id"], "frank": fault["rank"]} if lead else {}
        say("hang.named", lead + "the watchdog named rank(s) {ranks} as the suspects (no progress for {d} s, "
            "measured, against a configured {timeout:g} s timeout)" + ("; rank(s) {waiting} were waiting behind them."
                                                                    if hang["waiting"] else "."),
            ranks=", ".join(map(str, hang["ranks"])) or "nobody", d=F(f"{h}.detected_after_s"),
            timeout=float(report["spec"].get("hang_timeout_s") or 0.0),
            **({"waiting": ", ".join(map(str, hang["waiting"]))} if hang["waiting"] else {}), **extra)
        frames = [f"rank {s['rank']} at {s['frame']}" for s in hang["stacks"] if s.get("frame")]
        if frames:
            say("hang.stacks", "Its stack dumps show {frames}.", frames="; ".join(frames[:4]))
        for j, stack in enumerate(hang["stacks"]):
            if stack.get("in_injector"):
                say("hang.injector", "Rank {r}'s stack sits inside the fault injector ({frame}): that frame is where "
                    "the planned fault holds the rank, not a bug in training.",
                    fact(f"{h}.stacks.{j}.in_injector", "==", True), r=F(f"{h}.stacks.{j}.rank"),
                    frame=F(f"{h}.stacks.{j}.frame"))
                say("hang.gate", "It is the injector's own wait at the start of the faulted update, where a rank "
                    "gives the harness time to send its signal: the SIGSTOP found it there.",
                    fact(f"{h}.stacks.{j}.frame", "contains", "_await_harness"))
        if fault and fault["rank"] not in hang["ranks"]:
            say("hang.missed", "It did not name rank {r}, the one the fault hit.", r=fault["rank"])
        elif fault and len(hang["ranks"]) > 1:
            say("hang.many", "It names every rank furthest behind: a stuck rank and the ranks blocked with it in "
                "the same collective phase look alike from progress alone; the stacks tell them apart.")
    if report["hangs"]:
        say("hang.gloo", "gloo alone would have waited {gloo:.0f} s (torch's default collective timeout, a "
            "configured value, not measured here) and then raised on the waiting ranks, naming nobody.",
            gloo=GLOO_DEFAULT_TIMEOUT_S)
        _but(say, report, "hang")
        return
    _straggler(say, report)
    _but(say, report, "hang")


def _straggler(say: Claims, report: dict[str, Any]) -> None:
    phases = report["phases"]
    if phases["slowest_rank"] is None:
        return
    i = next(i for i, r in enumerate(phases["ranks"]) if r["rank"] == phases["slowest_rank"])
    slow = phases["ranks"][i]
    others = _median([r["own_s"] for r in phases["ranks"] if r["rank"] != slow["rank"]])
    say("hang.none", "No hang was declared: a slow rank keeps changing its progress board, so it is not a hung "
        "rank.", fact("hangs", "==", []))
    say("hang.slowest", "Rank {r} spent {own:.2f} s in its own phases (data, forward, optimizer)"
        + (" ({ratio:.1f}× the others' median)" if others else "")
        + "; the others wait for it inside the all-reduce, which is where their time goes.",
        r=F(f"phases.ranks.{i}.rank"), own=F(f"phases.ranks.{i}.own_s"),
        **({"ratio": slow["own_s"] / others} if others else {}))


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


def _answer_sharding(say: Claims, report: dict[str, Any]) -> None:
    state, phases = report.get("state"), report["phases"]
    if state and state["parallelism"] == "fsdp" and state["rank_share"] is not None:
        world = state["world_size"] or len(state["rank_bytes"])
        say("sharding.shards", "Its newest checkpoint, {ckpt}, holds the model and AdamW state as {n} shard(s), one "
            "per rank, of {sizes} bytes: each rank keeps {share:.1%} of the {total:,} bytes of all shards together "
            "(1/{w} = {even:.1%}, plus the checkpoint format's own framing).", fact("state.parallelism", "==", "fsdp"),
            ckpt=F("state.checkpoint"), n=len(state["rank_bytes"]), sizes=_bytes(state["rank_bytes"]),
            share=F("state.rank_share"), total=F("state.state_bytes"), w=world, even=1 / world)
        say("sharding.bytes", "In fp32 AdamW the state is {b} bytes per parameter on a DDP rank (4 of parameters, "
            "8 of moments; gradients add 4 more) and {b}/{w} = {per:g} on each of {w} FSDP ranks.",
            b=ADAM_BYTES_PER_PARAM, w=world, per=ADAM_BYTES_PER_PARAM / world)
    if phases.get("median_step_s") is not None:
        say("sharding.price", "The price is communication: every forward and backward all-gathers the parameters and "
            "reduce-scatters the gradients; the median update here took {u:.3f} s.", u=F("phases.median_step_s"))
        say("sharding.when", "Move from DDP to FSDP when the parameters, gradients and optimizer state (16 bytes per "
            "parameter in fp32 AdamW, and 16 in mixed precision too: 2 + 2 of bf16 weights and gradients, 12 of "
            "fp32 master weights and moments), plus activations, no longer fit one device, not before.")
    _resharded(say, report)
    _but(say, report, "continuity", "coverage")


def _resharded(say: Claims, report: dict[str, Any]) -> None:
    """Each restore of a checkpoint that a different world size wrote: DCP re-sliced its shards on load."""
    sizes = {a["attempt"]: a["world_size"] for a in report["attempts"]}
    writers = {s["checkpoint"]: s["attempt"] for s in report["saves"]}
    for i, att in enumerate(report["attempts"]):
        restored = att["restored"]
        writer = writers.get(restored["checkpoint"]) if restored else None
        if writer is not None and sizes.get(writer) and att["world_size"] and sizes[writer] != att["world_size"]:
            say("sharding.resliced", "Attempt {a} on {w} rank(s) restored {ckpt}, written as shards by attempt {by} "
                "on {bw} rank(s): the shards were re-sliced for the new world size on load.",
                a=F(f"attempts.{i}.attempt"), w=F(f"attempts.{i}.world_size"),
                ckpt=F(f"attempts.{i}.restored.checkpoint"), by=writer, bw=sizes[writer])


def _answer_async(say: Claims, report: dict[str, Any]) -> None:
    phases, saves = report["phases"], report["phases"]["save_seconds"]
    i = next((i for i, r in enumerate(phases["ranks"]) if r["rank"] == 0), None)
    if i is not None and phases["ranks"][i].get("checkpoint_steps") and saves["count"]:
        rank0 = phases["ranks"][i]
        stall, paid = rank0["totals"].get("checkpoint", 0.0), rank0["checkpoint_steps"]
        say("async.stall", "The step pays only for a copy of the state into host memory: rank 0 spent {stall:.3f} s "
            "in the checkpoint phase of the {paid} step(s) that saved ({each:.3f} s each), while writing and "
            "committing each save took {mean:.3f} s on average in the background.",
            stall=F(f"phases.ranks.{i}.totals.checkpoint"), paid=F(f"phases.ranks.{i}.checkpoint_steps"),
            each=stall / paid, mean=F("phases.save_seconds.mean"))
    for j, row in enumerate(report["recovery"]):
        if row["restored"] is None:
            continue
        r = f"recovery.{j}"
        newest = row["checkpoint"] or "none"
        which = ("the newest committed checkpoint at the failure" if newest == row["restored"]["checkpoint"]
                 else f"although {newest} was the newest committed checkpoint at the failure")
        say("async.lost", "{cause}: the save in flight was lost, nothing committed was; the restart loaded {back}, "
            "{which}, and redid {n} update(s).", cause=_capital(row["cause"]), back=F(f"{r}.restored.checkpoint"),
            which=which, n=F(f"{r}.steps_redone"))
    say("async.why_not", "Why not always: the host copy doubles the state's memory while it is written, a failure "
        "surfaces one save later than it happened, and 'saved' must still mean committed, never 'handed to a "
        "thread'.")
    _but(say, report, "atomicity", "continuity")


def _a(word: str) -> str:
    """The indefinite article of `word` (the invariants' names: "an atomicity", "a coverage")."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _bytes(values: list[int]) -> str:
    shown = ", ".join(f"{v:,}" for v in values[:4])
    return f"{shown}{', ...' if len(values) > 4 else ''}"


ANSWERS: dict[str, Callable[[Claims, dict[str, Any]], None]] = {
    "resume": _answer_resume, "silent": _answer_silent, "world": _answer_world,
    "frequency": _answer_frequency, "hang": _answer_hang, "sharding": _answer_sharding, "async": _answer_async,
}


def _cost(say: Claims, report: dict[str, Any], name: str) -> None:
    """What this violation costs in production; for continuity, by what its first evidence blames."""
    bad = verdict(name, False)
    if name == "continuity":
        say("cost.continuity.state", "The resumed model is not the one that was saved (weights, optimizer moments or "
            "schedule drifted); training goes on without an error.", bad,
            fact("facts.continuity.first_kind", "in", ["restore_digest", "restore_step", "save_digest"]))
        say("cost.continuity.trajectory", "The run's trajectory left the one an uninterrupted run takes: training "
            "goes on without an error, on a model no uninterrupted run would have produced.", bad,
            fact("facts.continuity.first_kind", "not in", ["restore_digest", "restore_step", "save_digest"]))
        return
    if name == "coverage":
        say("cost.coverage.order", "Every id was used once per epoch, but in other batches than an uninterrupted "
            "run's: the model's trajectory is not the one the run claims to continue, and no loss curve shows it.",
            bad, fact("facts.coverage.order_only", "==", True))
        say("cost.coverage", _capital(cost_of("coverage")) + ".", bad,
            fact("facts.coverage.order_only", "==", False))
        return
    if name == "progress":  # the budget and the no-progress rule end a job for different reasons
        say("cost.progress.no_progress", "The job stopped because its restarts no longer advanced the newest "
            "checkpoint (the no-progress rule), not because it ran out of restarts: each attempt died before it "
            "could save, so restarting again would only repeat it.", bad,
            fact("facts.progress.no_progress", "==", True))
        say("cost.progress", _capital(cost_of("progress")) + ".", bad,
            fact("facts.progress.no_progress", "==", False))
        return
    say(f"cost.{name}", _capital(cost_of(name)) + ".", bad)


def _violations(say: Claims, report: dict[str, Any]) -> list[dict[str, Any]]:
    """For each broken invariant: what that failure would cost in production, with its first evidence."""
    out = []
    for name, v in report["verdicts"].items():
        if v.get("valid") is not False:
            continue
        say.section = f"angle:violation:{name}"
        _cost(say, report, name)
        say("violation.here", "Here: {summary}.", verdict(name, False), summary=F(f"verdicts.{name}.summary"))
        if name == "coverage":
            _pairs(say)
        if v.get("evidence"):
            say("violation.evidence", "First evidence: {first}.", verdict(name, False),
                first=F(f"verdicts.{name}.evidence.0"))
        if name == "continuity":
            say("cause.model_cleared", "The restored model is not to blame: all {m} restore digest(s) equal what "
                "their saves recorded.", verdict(name, False), fact("facts.restores.checked", ">", 0),
                fact("facts.restores.mismatched", "==", 0),
                fact("facts.continuity.first_kind", "not in", ["restore_digest", "restore_step", "save_digest"]),
                m=F("facts.restores.checked"))
        out.append({"topic": f"violation:{name}", "question": f"What does {_a(name)} {name} violation mean in production?",
                    "answer": say.text(say.section), "raised_by": [f"invariant {name} violated"]})
    return out
