"""The executable handbook: interview questions on distributed training, answered by runs made on the spot.

A suite beside demo, chaos and defects. The handbook is data: CASES are the runs (built-in
scenarios, the handbook's own plans, planted defects from harness/defects.py, the reference
trainer on a defect's scenario as its control, and benchmark jobs of benchmarks/fsdp.py run
through its command), CHAPTERS the questions. Each chapter's answer is built from the
runs' report.json by an answer function that can only quote numbers through Evidence, which
records every quoted number with the report field it came from (handbook.json), so a test
can check each claim against the reports. No answer holds a literal result.

A planted defect that trainwreck catches is the suite passing and is shown as CAUGHT, in its
own table, never among the VALID runs.
"""
from __future__ import annotations

import json
import math
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Callable

from trainwreck.harness.defects import Row, get_defect, judge_row, run_defect
from trainwreck.harness.procs import signal_group
from trainwreck.harness.report.casebook import load_case
from trainwreck.harness.runner import JudgedRun, run_judged, spec_for
from trainwreck.harness.scenarios import Scenario, get_scenario
from trainwreck.invariants.continuity import DEFAULT_LOSS_TOLERANCE, losses_match
from trainwreck.invariants.verdict import verdict_word
from trainwreck.trainer.rundir import RunDir

GLOO_DEFAULT_TIMEOUT_S = 1800.0
"""torch.distributed's default process-group timeout for gloo (30 minutes): how long a collective
waits for a peer that will never arrive before anyone says anything."""
MTBF_ASSUMED_S = 24 * 3600.0
"""The mean time between failures the Young/Daly chapter assumes for the whole job: one a day."""
PAGE_CKPT_AGE_INTERVALS = 3
"""Page when the newest checkpoint is older than this many checkpoint intervals' worth of updates."""
PAGE_SLOWDOWN = 2.0
"""Page when the slowest rank's mean update takes this many times the run's median update."""
PAGE_ATTEMPTS = 3
"""Page when a job needs more attempts than this: it is restarting, not training."""


# ----- the runs -------------------------------------------------------------------------------


RESTART_LOOP = Scenario(
    name="restart-loop",
    summary="rank 1 is SIGKILLed before update 3 in every attempt, before any checkpoint exists",
    question="What should page someone?",
    threatens=("progress",),
    plan=tuple({"id": f"kill-a{a}", "kind": "kill", "rank": 1, "step": 3, "attempt": a} for a in (0, 1)))
"""A correct trainer that can never get past update 3: the supervisor must stop restarting it.
Default config, so its `trainwreck run --plan ...` reproduce line is exact."""
WIDE = {"input_dim": 32, "num_classes": 8, "width": 1024, "depth": 3, "dropout": 0.0, "dataset_size": 4096,
        "global_batch": 256, "warmup_steps": 0}
"""The model and data of benchmarks/fsdp.py's SPEC (2.1 M parameters; a test keeps them equal), so the bytes
the benchmark measures are this model's. Big enough that a save shows in the step's phases: the tiny
model's saves take milliseconds either way."""
ASYNC_QUESTION = "Why not make the training loop asynchronous, and when do you move from DDP to FSDP?"


def _wide(name: str, summary: str, **config: Any) -> Scenario:
    return Scenario(name=name, summary=summary, question=ASYNC_QUESTION, threatens=("continuity", "progress"),
                    config={**WIDE, **config})


CKPT_SYNC = _wide("wide-sync", "the 2.1 M-parameter MLP on 2 ranks, DDP, a synchronous checkpoint every 4 updates")
CKPT_ASYNC = _wide("wide-async", "the same job with asynchronous checkpoints (ckpt_mode=async)", ckpt_mode="async")
FSDP_WIDE = _wide("wide-fsdp", "the same job with FSDP2 (parallelism=fsdp): each rank holds half the state",
                  parallelism="fsdp")
_SHRINK = get_scenario("shrink-world")
FSDP_SHRINK = Scenario(
    name="fsdp-shrink-world",
    summary="FSDP on 4 ranks loses a node of 2 mid-epoch; the 4-way sharded checkpoint is resumed on 2 ranks",
    question="What breaks when the world size changes on resume?", threatens=("coverage", "continuity", "progress"),
    plan=_SHRINK.plan, world_sizes=_SHRINK.world_sizes, config={**_SHRINK.config, "parallelism": "fsdp"})
PLANS = {s.name: s for s in (RESTART_LOOP, CKPT_SYNC, CKPT_ASYNC, FSDP_WIDE, FSDP_SHRINK)}

MEASUREMENT_FORMAT = "trainwreck-measurement/1"
MEASURE_WORLD, MEASURE_STEPS = 2, 6
MEASURE_TIMEOUT_S = 300.0
"""The benchmark job normally takes about 10 s here (three fresh interpreters importing torch)."""


def measure_command(parallelism: str) -> list[str]:
    """benchmarks/fsdp.py's command for one job. The handbook runs it rather than importing it: the
    harness may not import benchmarks/ (docs/DESIGN.md, Layout), and the command is its reproduce line."""
    return ["python", "-m", "trainwreck.benchmarks.fsdp", "--parallelism", parallelism,
            "--world", str(MEASURE_WORLD), "--steps", str(MEASURE_STEPS)]


def run_measurement(parallelism: str, run_dir: Path) -> dict[str, Any]:
    """Rank 0's bytes of parameters, gradients and AdamW state after a real step, its median step and its
    losses (the benchmark's JSON), with bytes per parameter; written to RUN_DIR/measurement.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # Its own session: on a timeout or Ctrl-C the whole group (the benchmark and its ranks) is killed.
    proc = subprocess.Popen([sys.executable, *measure_command(parallelism)[1:]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=MEASURE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{shlex.join(measure_command(parallelism))} exited {proc.returncode}: {last}")
    result = json.loads(out)
    numel = result["numel"]
    measured = {"format": MEASUREMENT_FORMAT, "command": shlex.join(measure_command(parallelism)),
                "parallelism": parallelism, "world_size": MEASURE_WORLD, "steps": MEASURE_STEPS, **result,
                "bytes_per_param": {k: round(result[k] / numel, 3) for k in ("params", "grads", "optimizer")}}
    measured["bytes_per_param"]["state"] = round((result["params"] + result["optimizer"]) / numel, 3)
    (run_dir / "measurement.json").write_text(json.dumps(measured, indent=1) + "\n", encoding="utf-8")
    return measured


@dataclass(frozen=True)
class Case:
    """One run of the handbook. kind: scenario (a built-in scenario), plan (a handbook plan from
    PLANS), defect (a planted defect on its scenario), control (the reference trainer on the
    scenario of defect `name`) or measure (benchmarks/fsdp.py's job for parallelism `name`).
    `expect` is the verdict a correct suite gives it (MEASURED for a measurement)."""

    key: str
    kind: str
    name: str
    expect: str = "VALID"

    def report_file(self, run_dir: Path) -> Path:
        """What the chapters quote: the run's report.json, or a measurement's measurement.json."""
        return run_dir / "measurement.json" if self.kind == "measure" else RunDir(run_dir).report_file("report.json")

    def scenario(self) -> Scenario:
        if self.kind == "plan":
            return PLANS[self.name]
        return get_scenario(self.name) if self.kind == "scenario" else get_defect(self.name).scenario

    def summary(self) -> str:
        if self.kind == "measure":
            return (f"benchmarks/fsdp.py: rank 0's bytes and step time for {self.name.upper()} on {MEASURE_WORLD} "
                    f"ranks, the same 2.1 M-parameter model, {MEASURE_STEPS} steps")
        if self.kind == "defect":
            return f"planted defect: {get_defect(self.name).bug} ({self.scenario().name})"
        prefix = "reference trainer, control of the defects: " if self.kind == "control" else ""
        return prefix + self.scenario().summary

    def run(self, run_dir: Path, golden_cache: Path | None) -> JudgedRun:
        if self.kind == "defect":
            return run_defect(get_defect(self.name), run_dir, golden_cache)
        if self.kind == "control":  # `trainwreck defects` reruns this control beside the defect
            return run_judged(spec_for(self.scenario(), run_dir), golden_cache=golden_cache,
                              reproduce=f"trainwreck defects --only {self.name} --out DIR")
        named = self.name if self.kind == "scenario" else None  # a handbook plan is not a built-in name
        return run_judged(spec_for(self.scenario(), run_dir), named, golden_cache=golden_cache)


CASES: tuple[Case, ...] = (
    Case("resume", "control", "sampler_not_saved"),
    Case("sampler_not_saved", "defect", "sampler_not_saved"),
    Case("optimizer_not_saved", "defect", "optimizer_not_saved"),
    Case("scheduler_not_saved", "defect", "scheduler_not_saved"),
    Case("rng_not_restored", "defect", "rng_not_restored"),
    Case("pad_uneven_shards", "defect", "pad_uneven_shards"),
    Case("shrink-world", "scenario", "shrink-world"),
    Case("world_size_reslices", "defect", "world_size_reslices"),
    Case("hang-sigstop", "control", "disabled"),
    Case("watchdog_disabled", "defect", "disabled"),
    Case("hang-holding-gil", "scenario", "hang-holding-gil"),
    Case("straggler", "scenario", "straggler"),
    Case("slow-disk", "scenario", "slow-disk"),
    Case("restart-loop", "plan", "restart-loop", expect="INVALID"),
    Case("wide-sync", "plan", "wide-sync"),
    Case("wide-async", "plan", "wide-async"),
    Case("async-kill-persist", "scenario", "async-kill-persist"),
    Case("wide-fsdp", "plan", "wide-fsdp"),
    Case("fsdp-shrink-world", "plan", "fsdp-shrink-world"),
    Case("bytes-ddp", "measure", "ddp", expect="MEASURED"),
    Case("bytes-fsdp", "measure", "fsdp", expect="MEASURED"),
)


def get_case(key: str) -> Case:
    for case in CASES:
        if case.key == key:
            return case
    raise KeyError(f"unknown handbook run {key!r}; runs: {', '.join(c.key for c in CASES)}")


# ----- evidence: every quoted number goes through here ------------------------------------------


@dataclass
class Evidence:
    """The runs' reports, and the claims a chapter quotes from them (field path -> value)."""

    reports: dict[str, dict[str, Any]]
    claims: list[dict[str, Any]] = field(default_factory=list)
    derived: list[dict[str, Any]] = field(default_factory=list)

    def get(self, run: str, *path: str | int) -> Any:
        """A report.json value, recorded as a claim of the chapter being built (so the text must show it)."""
        value: Any = self.reports[run]
        for part in path:
            value = value[part]
        self.claims.append({"run": run, "path": list(path), "value": value})
        return value

    def q(self, run: str, *path: str | int, unit: str = "") -> str:
        """The value, formatted for the text and marked as a claim."""
        value = self.get(run, *path)
        return claim_html(fmt(value) + unit, f"{run}: {source_file(self.reports[run])} {'.'.join(map(str, path))}")

    def derive(self, label: str, value: float, formula: str, inputs: dict[str, float], unit: str = "") -> str:
        """A number computed from claims (say, the Young/Daly interval); the formula is recorded."""
        self.derived.append({"label": label, "value": value, "formula": formula, "inputs": inputs})
        return claim_html(fmt(value) + unit, f"{label} = {formula}")


def source_file(report: dict[str, Any]) -> str:
    """The file a claim's number was read from, as the page's tooltip names it."""
    return "measurement.json" if report.get("format") == MEASUREMENT_FORMAT else "report.json"


def fmt(value: Any) -> str:
    """One spelling of a quoted value, used by the text and by the tests that find it there."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return verdict_word(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1 else f"{value:,.1f}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def claim_html(text: str, source: str) -> str:
    return f'<b class="claim" title="{escape(source)}">{escape(text)}</b>'


def word(value: Any) -> str:
    return verdict_word(value)


@dataclass(frozen=True)
class Chapter:
    slug: str
    question: str
    runs: tuple[str, ...]
    """Case keys the chapter quotes, in the order it shows them."""
    answer: Callable[[Evidence], list[str]]
    """Paragraphs of HTML built from the evidence."""
    plots: tuple[tuple[str, str], ...] = ()
    """(case key, plot name in report.plots.PLOTS) shown under the answer."""


# ----- the chapters: each answer is computed from the runs' reports ------------------------------

PHASES = ("data", "forward", "backward", "sync", "optimizer", "checkpoint")


def _phase_row(ev: Evidence, run: str, i: int) -> str:
    rank = ev.get(run, "phases", "ranks", i, "rank")
    parts = ", ".join(f"{p} {ev.q(run, 'phases', 'ranks', i, 'totals', p, unit=' s')}" for p in PHASES)
    return f"rank {rank} over {ev.q(run, 'phases', 'ranks', i, 'steps')} updates: {parts}"


def one_step(ev: Evidence) -> list[str]:
    ranks = len(ev.reports["straggler"]["phases"]["ranks"])
    return [
        "One step is one optimizer update: load a batch (data), forward, backward (where DDP all-reduces "
        "gradients bucket by bucket), an explicit sync, the optimizer step, and every few updates a checkpoint. "
        f"The reference trainer, killed mid-epoch and resumed, spent: {_phase_row(ev, 'resume', 0)}. "
        f"Its median update took {ev.q('resume', 'phases', 'median_step_s', unit=' s')}.",
        "The synchronization boundary is the gradient all-reduce: no rank can start its optimizer step until "
        "every rank has contributed. The straggler run shows it by moving the time: "
        + "; ".join(_phase_row(ev, "straggler", i) for i in range(ranks))
        + f". The slow rank's delay shows up in its own phase (data), the others pay it as waiting in backward; "
        f"that is why the report names rank {ev.q('straggler', 'phases', 'slowest_rank')} from the phases a "
        "collective cannot stretch (data, forward, optimizer).",
    ]


def partition(ev: Evidence) -> list[str]:
    return [
        "The elastic sampler deals each epoch's shuffled ids to ranks by position and checkpoints its position, "
        "so a resume continues the same permutation. Proof is a count, not an argument: over "
        f"{ev.q('resume', 'verdicts', 'coverage', 'counts', 'lineage_steps')} lineage steps and "
        f"{ev.q('resume', 'verdicts', 'coverage', 'counts', 'epochs')} epochs the resumed reference run used "
        f"{ev.q('resume', 'verdicts', 'coverage', 'counts', 'duplicated_ids')} id(s) twice, left "
        f"{ev.q('resume', 'verdicts', 'coverage', 'counts', 'ids_not_covered')} uncovered, and "
        f"{ev.q('resume', 'verdicts', 'coverage', 'counts', 'golden_mismatched_steps')} step(s) used a batch "
        "other than the uninterrupted golden run's (coverage "
        f"{ev.q('resume', 'verdicts', 'coverage', 'valid')}).",
        "With the sampler's position left out of the checkpoint (CAUGHT): "
        f"{ev.q('sampler_not_saved', 'verdicts', 'coverage', 'counts', 'duplicated_ids')} id(s) used twice within "
        f"an epoch and {ev.q('sampler_not_saved', 'verdicts', 'coverage', 'counts', 'golden_mismatched_steps')} "
        "step(s) whose batch differs from the golden run: the resumed job replayed the epoch from its start. "
        "In the pictures below each column is one update; red cells are ids seen a second time.",
    ]


def restart_state(ev: Evidence) -> list[str]:
    out = ["Everything that decides the next update: model weights, optimizer moments, the LR schedule's "
           "position, every RNG stream, and the sampler's position. The reference run restored "
           f"{ev.q('resume', 'verdicts', 'continuity', 'counts', 'restores_checked')} checkpoint(s), each "
           "digest equal to what its save recorded, and matched the golden run at "
           f"{ev.q('resume', 'verdicts', 'continuity', 'counts', 'golden_steps_checked')} steps with "
           f"{ev.q('resume', 'verdicts', 'continuity', 'counts', 'violations')} violation(s). Drop one piece each:"]
    for run in ("optimizer_not_saved", "scheduler_not_saved", "rng_not_restored"):
        out.append(f"<code>{run}</code> (CAUGHT by continuity): "
                   f"{ev.q(run, 'verdicts', 'continuity', 'counts', 'violations')} discontinuities; first: "
                   f"{ev.q(run, 'verdicts', 'continuity', 'evidence', 0)}.")
    out.append("<code>sampler_not_saved</code> (CAUGHT by coverage, not continuity's first line of defence): "
               f"{ev.q('sampler_not_saved', 'verdicts', 'coverage', 'counts', 'duplicated_ids')} ids used twice. "
               "An optimizer that forgot its moments still loads bit-exact weights, so only the digests of the "
               "steps after the restore, compared with the golden run, show it; the loss plot marks where.")
    return out


def health_metric(ev: Evidence) -> list[str]:
    return [
        "Forward progress: the newest update every rank has applied, over time. Loss, GPU utilisation and "
        "heartbeats all look alive while a peer is stopped; progress does not. With rank 1 SIGSTOPped "
        f"(<code>hang-sigstop</code>), no rank got past update {ev.q('hang-sigstop', 'hangs', 0, 'last_step')}; "
        f"after {ev.q('hang-sigstop', 'hangs', 0, 'detected_after_s', unit=' s')} without progress (timeout "
        f"{ev.q('hang-sigstop', 'spec', 'hang_timeout_s', unit=' s')}) the watchdog named rank(s) "
        f"{ev.q('hang-sigstop', 'hangs', 0, 'ranks')} as suspects, rank(s) "
        f"{ev.q('hang-sigstop', 'hangs', 0, 'waiting')} as waiting behind them, and restarted.",
        f"The straggler is slow, not broken: it finished at step {ev.q('straggler', 'totals', 'final_step')} in "
        f"{ev.q('straggler', 'totals', 'attempts')} attempt(s), its hang verdict "
        f"{ev.q('straggler', 'verdicts', 'hang', 'valid')}: its line bends but never goes flat for a timeout.",
    ]


def resumed_correct(ev: Evidence) -> list[str]:
    seg = ev.reports["resume"]["lineage"]["segments"]
    return [
        "Compare it with a run that never failed. Every update emits a digest of the model and optimizer state; "
        f"the resumed run restored {ev.q('resume', 'lineage', 'segments', len(seg) - 1, 'restored')} and its "
        f"{ev.q('resume', 'verdicts', 'continuity', 'counts', 'golden_steps_checked')} lineage steps were checked "
        "against the golden run's digests (same world size: bit-identical, not merely close), with "
        f"{ev.q('resume', 'verdicts', 'continuity', 'counts', 'violations')} violation(s); continuity "
        f"{ev.q('resume', 'verdicts', 'continuity', 'valid')}. The "
        f"{ev.q('resume', 'totals', 'redo_steps')} update(s) redone after the kill are outside the lineage and "
        "not compared. The loss plot below lies on the golden curve.",
    ]


def world_size(ev: Evidence) -> list[str]:
    return [
        f"DDP {ev.q('shrink-world', 'attempts', 0, 'world_size')} → "
        f"{ev.q('shrink-world', 'attempts', 1, 'world_size')}: the effective batch must stay "
        f"{ev.q('shrink-world', 'spec', 'global_batch')} samples, so each rank's share went from "
        f"{ev.q('shrink-world', 'attempts', 0, 'rank_batch')} to "
        f"{ev.q('shrink-world', 'attempts', 1, 'rank_batch')}; the sampler repartitions the rest of the epoch "
        "by global position, not per-rank position. Coverage "
        f"{ev.q('shrink-world', 'verdicts', 'coverage', 'valid')} with "
        f"{ev.q('shrink-world', 'verdicts', 'coverage', 'counts', 'duplicated_ids')} duplicated id(s).",
        "<code>world_size_reslices</code> (CAUGHT) keeps per-rank positions and re-slices: "
        f"{ev.q('world_size_reslices', 'verdicts', 'coverage', 'counts', 'duplicated_ids')} id(s) used twice and "
        f"{ev.q('world_size_reslices', 'verdicts', 'coverage', 'counts', 'golden_mismatched_steps')} step(s) "
        "off the golden batches.",
        "Sharded state: with FSDP every rank holds and saves only its shard, so a checkpoint written by "
        f"{ev.q('fsdp-shrink-world', 'attempts', 0, 'world_size')} ranks must be re-sliced to load on "
        f"{ev.q('fsdp-shrink-world', 'attempts', 1, 'world_size')}. In <code>fsdp-shrink-world</code> attempt 1 "
        f"restored {ev.q('fsdp-shrink-world', 'attempts', 1, 'restored', 'checkpoint')}, written as shards by the "
        "4-rank attempt, and torch.distributed.checkpoint re-sliced it on load; its "
        f"{ev.q('fsdp-shrink-world', 'verdicts', 'continuity', 'counts', 'golden_steps_checked')} lineage steps "
        "match the 4-rank golden run (losses within tolerance, since the reduction order changed), coverage "
        f"{ev.q('fsdp-shrink-world', 'verdicts', 'coverage', 'valid')} with "
        f"{ev.q('fsdp-shrink-world', 'verdicts', 'coverage', 'counts', 'duplicated_ids')} duplicated id(s). Its "
        f"newest checkpoint, saved on {ev.q('fsdp-shrink-world', 'state', 'world_size')} ranks, holds "
        f"{ev.q('fsdp-shrink-world', 'state', 'rank_bytes')} bytes per rank: on this tiny model the checkpoint "
        "format's framing outweighs the tensors, so chapter 11 measures the sharding on a bigger one.",
    ]


def periodic_stall(ev: Evidence) -> list[str]:
    saves = ev.reports["slow-disk"]["saves"]
    worst = max(range(len(saves)), key=lambda i: saves[i]["seconds"] or 0.0)
    ranks = len(ev.reports["slow-disk"]["phases"]["ranks"])
    per_rank = "; ".join(f"rank {ev.q('slow-disk', 'phases', 'ranks', i, 'rank')}: checkpoint "
                         f"{ev.q('slow-disk', 'phases', 'ranks', i, 'totals', 'checkpoint', unit=' s')}, forward "
                         f"{ev.q('slow-disk', 'phases', 'ranks', i, 'totals', 'forward', unit=' s')}"
                         for i in range(ranks))
    return [
        "Find what repeats on the same period. Here the storage stalls during one save: the save of step "
        f"{ev.q('slow-disk', 'saves', worst, 'step')} took "
        f"{ev.q('slow-disk', 'saves', worst, 'seconds', unit=' s')} against a mean of "
        f"{ev.q('slow-disk', 'phases', 'save_seconds', 'mean', unit=' s')} over "
        f"{ev.q('slow-disk', 'phases', 'save_seconds', 'count')} saves. The per-rank phase breakdown puts the time "
        f"in checkpoint side work on every rank ({per_rank}), not in compute: every rank waits at the save's "
        "barrier for the writer. The progress line goes flat at the save and the checkpoint age keeps rising "
        "until the save commits.",
    ]


def silent_duplication(ev: Evidence) -> list[str]:
    return [
        "Silent duplication: padding uneven shards by repeating ids trains on some samples twice per epoch. "
        "Nothing crashes and the loss keeps falling (the plot). Only counting ids shows it: "
        "<code>pad_uneven_shards</code> (CAUGHT) used "
        f"{ev.q('pad_uneven_shards', 'verdicts', 'coverage', 'counts', 'duplicated_ids')} id(s) twice within "
        f"an epoch over {ev.q('pad_uneven_shards', 'verdicts', 'coverage', 'counts', 'epochs')} epochs. Against a "
        "golden run the trajectory also drifts (continuity "
        f"{ev.q('pad_uneven_shards', 'verdicts', 'continuity', 'valid')}), but in production there is no golden "
        "run: the coverage count is the check you can keep.",
    ]


def ckpt_interval(ev: Evidence) -> list[str]:
    cost = float(ev.get("resume", "phases", "save_seconds", "mean"))
    step = float(ev.get("resume", "phases", "median_step_s"))
    interval = math.sqrt(2 * cost * MTBF_ASSUMED_S)
    return [
        f"Young/Daly: interval = √(2 · save cost · MTBF). Measured here, a save costs "
        f"{ev.q('resume', 'phases', 'save_seconds', 'mean', unit=' s')} (mean of "
        f"{ev.q('resume', 'phases', 'save_seconds', 'count')} saves) and an update "
        f"{ev.q('resume', 'phases', 'median_step_s', unit=' s')}. Assuming one failure a day (MTBF "
        f"{fmt(MTBF_ASSUMED_S)} s, an assumption, not a measurement), the interval is "
        + ev.derive("young_daly_interval_s", interval, "sqrt(2 * save_cost_s * mtbf_s)",
                    {"save_cost_s": cost, "mtbf_s": MTBF_ASSUMED_S}, " s")
        + ", about " + ev.derive("young_daly_interval_steps", interval / step, "young_daly_interval_s / step_s",
                                 {"young_daly_interval_s": interval, "step_s": step}, " updates")
        + f". The run checkpoints every {ev.q('resume', 'spec', 'ckpt_interval')} updates, so each failure cost "
        f"little: {ev.q('resume', 'recovery', 0, 'steps_redone')} update(s) "
        f"({ev.q('resume', 'recovery', 0, 'samples_redone')} samples) redone, the checkpoint "
        f"{ev.q('resume', 'recovery', 0, 'checkpoint_age_s', unit=' s')} old at the failure. For a real model, "
        "measure the save cost with <code>python -m trainwreck.benchmarks.checkpoint</code> and redo this sum.",
    ]


def _suspect_stack(ev: Evidence, run: str) -> str:
    """Where the first suspect stood, from its stack dump; a rank that never ran Python again may leave none."""
    hang = ev.reports[run]["hangs"][0]
    found = [i for i, st in enumerate(hang["stacks"]) if st.get("rank") in hang["ranks"] and st.get("frame")]
    if not found:
        return "no stack of a suspect could be dumped"
    return (f"rank {ev.q(run, 'hangs', 0, 'stacks', found[0], 'rank')}'s stack at "
            f"{ev.q(run, 'hangs', 0, 'stacks', found[0], 'frame')}")


def which_rank_hangs(ev: Evidence) -> list[str]:
    stop = ev.get("hang-sigstop", "hangs", 0, "detected_after_s")
    gil = ev.get("hang-holding-gil", "hangs", 0, "detected_after_s")
    return [
        "gloo does not know a peer is stopped: its sockets stay open, so every other rank blocks inside the "
        f"all-reduce until the process group's timeout ({fmt(GLOO_DEFAULT_TIMEOUT_S)} s by default), and then the "
        "error names the collective that timed out on the waiting rank, not the rank that stopped. trainwreck's "
        "watchdog watches progress files from outside and names the rank furthest behind.",
        f"SIGSTOP on rank 1: rank(s) {ev.q('hang-sigstop', 'hangs', 0, 'ranks')} named after "
        f"{ev.q('hang-sigstop', 'hangs', 0, 'detected_after_s', unit=' s')}, {_suspect_stack(ev, 'hang-sigstop')}; "
        + ev.derive("sigstop_speedup", GLOO_DEFAULT_TIMEOUT_S / stop, "gloo_timeout_s / detected_after_s",
                    {"gloo_timeout_s": GLOO_DEFAULT_TIMEOUT_S, "detected_after_s": stop}, "×")
        + " sooner than gloo. A hang that holds the GIL (no Python thread of the rank runs again, so an in-process "
        f"watchdog thread cannot help): rank(s) {ev.q('hang-holding-gil', 'hangs', 0, 'ranks')} named after "
        f"{ev.q('hang-holding-gil', 'hangs', 0, 'detected_after_s', unit=' s')} ("
        + ev.derive("gil_speedup", GLOO_DEFAULT_TIMEOUT_S / gil, "gloo_timeout_s / detected_after_s",
                    {"gloo_timeout_s": GLOO_DEFAULT_TIMEOUT_S, "detected_after_s": gil}, "×")
        + f" sooner), {_suspect_stack(ev, 'hang-holding-gil')}.",
        "With the watchdog disabled (CAUGHT by the hang invariant): "
        f"{ev.q('watchdog_disabled', 'verdicts', 'hang', 'summary')}",
    ]


def _ckpt_phase(ev: Evidence, run: str) -> str:
    """Rank 0's checkpoint-phase seconds, quoted, then derived per step that paid for a save (the save
    after the last update is in no step's phases)."""
    i = next(i for i, r in enumerate(ev.reports[run]["phases"]["ranks"]) if r["rank"] == 0)
    total = float(ev.get(run, "phases", "ranks", i, "totals", "checkpoint"))
    saves = ev.get(run, "phases", "ranks", i, "checkpoint_steps")
    return (f"{ev.q(run, 'phases', 'ranks', i, 'totals', 'checkpoint', unit=' s')} in the checkpoint phase of "
            f"the {ev.q(run, 'phases', 'ranks', i, 'checkpoint_steps')} steps that saved, "
            + ev.derive(f"{run}_stall_per_save_s", total / saves, "checkpoint_phase_s / saves",
                        {"checkpoint_phase_s": total, "saves": saves}, " s") + " per save")


def async_checkpoints(ev: Evidence) -> list[str]:
    return [
        "Make the checkpoint asynchronous, not the step. A training step ends at the gradient all-reduce: "
        "every rank must agree on the update before the next one, which is what makes a replica's digest "
        "comparable at all. A save is different: once the state is copied, nothing in the next update needs "
        f"it on disk. The same 2.1 M-parameter job ({ev.q('wide-sync', 'state', 'state_bytes')} bytes of model "
        "and AdamW state per checkpoint), saved every "
        f"{ev.q('wide-sync', 'spec', 'ckpt_interval')} updates: synchronously, rank 0's steps spent "
        f"{_ckpt_phase(ev, 'wide-sync')}; asynchronously {_ckpt_phase(ev, 'wide-async')} (the copy into host "
        "memory), while the background thread took "
        f"{ev.q('wide-async', 'phases', 'save_seconds', 'mean', unit=' s')} per save to write and commit, against "
        f"{ev.q('wide-sync', 'phases', 'save_seconds', 'mean', unit=' s')} inside the step. The background "
        "write is not free: it competes with the ranks for the same cores (2 here), so it runs slower than a "
        "synchronous one and can stretch the steps beside it; the median update took "
        f"{ev.q('wide-sync', 'phases', 'median_step_s', unit=' s')} with synchronous saves and "
        f"{ev.q('wide-async', 'phases', 'median_step_s', unit=' s')} with asynchronous ones. The trajectory is "
        f"the same (continuity {ev.q('wide-async', 'verdicts', 'continuity', 'valid')} against its golden run).",
        "What it can lose: <code>async-kill-persist</code> SIGKILLs rank 0 after the first file of the step-8 "
        "background persist, while training has moved on. The restart loaded "
        f"{ev.q('async-kill-persist', 'recovery', 0, 'restored', 'checkpoint')}, the newest committed checkpoint "
        f"({ev.q('async-kill-persist', 'recovery', 0, 'checkpoint')}), and redid "
        f"{ev.q('async-kill-persist', 'recovery', 0, 'steps_redone')} update(s) "
        f"({ev.q('async-kill-persist', 'recovery', 0, 'samples_redone')} samples): the save in flight is lost, "
        "nothing committed is (atomicity "
        f"{ev.q('async-kill-persist', 'verdicts', 'atomicity', 'valid')}, coverage "
        f"{ev.q('async-kill-persist', 'verdicts', 'coverage', 'valid')}). 'Saved' still means committed, never "
        "'handed to a thread'; the price is one more interval of redo when the failure lands mid-persist, and a "
        "host copy of the state while it is written.",
    ]


def ddp_to_fsdp(ev: Evidence) -> list[str]:
    ddp = float(ev.get("bytes-ddp", "bytes_per_param", "state"))
    gap = _loss_gap(ev.reports["wide-fsdp"]["loss"], ev.reports["wide-sync"]["loss"])
    return [
        "Move to FSDP when the state no longer fits, not before. Measured by benchmarks/fsdp.py on the same "
        f"model ({ev.q('bytes-ddp', 'numel')} parameters, {ev.q('bytes-ddp', 'world_size')} ranks, after a real "
        "backward and AdamW step), rank 0 holds under DDP "
        f"{ev.q('bytes-ddp', 'bytes_per_param', 'params')} bytes per parameter of parameters, "
        f"{ev.q('bytes-ddp', 'bytes_per_param', 'grads')} of gradients and "
        f"{ev.q('bytes-ddp', 'bytes_per_param', 'optimizer')} of AdamW moments; under FSDP "
        f"{ev.q('bytes-fsdp', 'bytes_per_param', 'params')}, {ev.q('bytes-fsdp', 'bytes_per_param', 'grads')} "
        f"and {ev.q('bytes-fsdp', 'bytes_per_param', 'optimizer')}. At "
        f"{ev.q('bytes-ddp', 'bytes_per_param', 'state')} bytes per parameter of parameters and moments, an 80 GB "
        "device holds at most "
        + ev.derive("ddp_max_params_80gb", 80e9 / ddp, "80e9 / ddp_state_bytes_per_param",
                    {"ddp_state_bytes_per_param": ddp}, " parameters")
        + " under DDP before a single gradient or activation; FSDP divides that state by the world size. The "
        f"checkpoints agree: the FSDP run's newest one holds {ev.q('wide-fsdp', 'state', 'rank_bytes')} bytes "
        f"per rank against {ev.q('wide-sync', 'state', 'state_bytes')} bytes that every DDP rank holds.",
        "The price is communication: every forward and backward all-gathers parameters and reduce-scatters "
        f"gradients. The benchmark's median step took {ev.q('bytes-ddp', 'step_s', unit=' s')} under DDP and "
        f"{ev.q('bytes-fsdp', 'step_s', unit=' s')} under FSDP; in the trainwreck runs the median update took "
        f"{ev.q('wide-sync', 'phases', 'median_step_s', unit=' s')} against "
        f"{ev.q('wide-fsdp', 'phases', 'median_step_s', unit=' s')}, and a save "
        f"{ev.q('wide-sync', 'phases', 'save_seconds', 'mean', unit=' s')} against "
        f"{ev.q('wide-fsdp', 'phases', 'save_seconds', 'mean', unit=' s')} (every rank writes its shard). The "
        f"result is the same training: final loss {ev.q('wide-sync', 'loss', 'final')} (DDP) and "
        f"{ev.q('wide-fsdp', 'loss', 'final')} (FSDP); the largest relative gap over all "
        f"{len(ev.reports['wide-fsdp']['loss']['steps'])} updates is "
        + ev.derive("fsdp_vs_ddp_max_loss_gap", gap["gap"], "|fsdp_loss - ddp_loss| / max(1, |ddp_loss|), the "
                    "largest over the updates", gap, "")
        + f" (at update {gap['step']}): {'within' if losses_match(gap['fsdp_loss'], gap['ddp_loss'], DEFAULT_LOSS_TOLERANCE) else 'OUTSIDE'} the "
        f"tolerance of {fmt(DEFAULT_LOSS_TOLERANCE)} that continuity allows across reduction orders.",
    ]


def _loss_gap(run: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """The largest relative loss difference between two runs' report.json `loss` (continuity's rule,
    invariants.continuity.losses_match), with its step and both losses there."""
    theirs = dict(zip(base["steps"], base["values"]))
    gaps = [{"gap": abs(v - theirs[s]) / max(1.0, abs(theirs[s])), "step": s, "fsdp_loss": v, "ddp_loss": theirs[s]}
            for s, v in zip(run["steps"], run["values"]) if s in theirs]
    if not gaps:
        raise KeyError("the two runs share no update with a loss")
    return max(gaps, key=lambda g: g["gap"])


def async_and_fsdp(ev: Evidence) -> list[str]:
    return async_checkpoints(ev) + ddp_to_fsdp(ev)


PageRule = tuple[str, str, str, bool]
"""(symptom, run, the numbers, whether it pages)."""


def _page_no_progress(ev: Evidence) -> PageRule:
    stalled = ev.get("hang-sigstop", "hangs", 0, "detected_after_s")
    window = ev.get("hang-sigstop", "spec", "hang_timeout_s")
    return ("no forward progress for a window", "hang-sigstop",
            f"no update for {ev.q('hang-sigstop', 'hangs', 0, 'detected_after_s', unit=' s')}, window "
            f"{ev.q('hang-sigstop', 'spec', 'hang_timeout_s', unit=' s')}", stalled >= window)


def _page_ckpt_age(ev: Evidence) -> PageRule:
    run = "hang-holding-gil"
    at_fail, found = ev.get(run, "recovery", 0, "checkpoint_age_s"), ev.get(run, "recovery", 0, "detected_after_s")
    interval, step = ev.get(run, "spec", "ckpt_interval"), ev.get(run, "phases", "median_step_s")
    age = at_fail + found
    limit = PAGE_CKPT_AGE_INTERVALS * interval * step
    return ("checkpoint age over a threshold", run,
            f"{ev.q(run, 'recovery', 0, 'checkpoint_age_s', unit=' s')} old at the hang + "
            f"{ev.q(run, 'recovery', 0, 'detected_after_s', unit=' s')} until it was found = "
            + ev.derive("checkpoint_age_s", age, "checkpoint_age_s + detected_after_s",
                        {"checkpoint_age_s": at_fail, "detected_after_s": found}, " s")
            + f"; threshold {PAGE_CKPT_AGE_INTERVALS} intervals × {ev.q(run, 'spec', 'ckpt_interval')} updates × "
            f"{ev.q(run, 'phases', 'median_step_s', unit=' s')} = "
            + ev.derive("checkpoint_age_threshold_s", limit, "intervals * ckpt_interval * median_step_s",
                        {"intervals": PAGE_CKPT_AGE_INTERVALS, "ckpt_interval": interval, "median_step_s": step},
                        " s"), age > limit)


def _page_restart_loop(ev: Evidence, run: str) -> PageRule:
    outcome, attempts = ev.get(run, "outcome"), ev.get(run, "totals", "attempts")
    return ("a restart loop", run,
            f"{ev.q(run, 'totals', 'attempts')} attempt(s), ended {ev.q(run, 'outcome')} at step "
            f"{ev.q(run, 'totals', 'final_step')} (page on no_progress or more than {PAGE_ATTEMPTS} attempts)",
            outcome == "no_progress" or attempts > PAGE_ATTEMPTS)


def _page_throughput(ev: Evidence) -> PageRule:
    phases = ev.reports["straggler"]["phases"]
    slow = next(i for i, r in enumerate(phases["ranks"]) if r["rank"] == phases["slowest_rank"])
    mean, median = (ev.get("straggler", "phases", "ranks", slow, "mean_step_s"),
                    ev.get("straggler", "phases", "median_step_s"))
    ratio = mean / median
    return ("throughput collapse", "straggler",
            f"slowest rank's mean update {ev.q('straggler', 'phases', 'ranks', slow, 'mean_step_s', unit=' s')} is "
            + ev.derive("slowdown", ratio, "mean_step_s / median_step_s",
                        {"mean_step_s": mean, "median_step_s": median}, "×")
            + f" the median update ({ev.q('straggler', 'phases', 'median_step_s', unit=' s')}), threshold "
            f"{PAGE_SLOWDOWN}×", ratio > PAGE_SLOWDOWN)


def paging(ev: Evidence) -> list[str]:
    rows = [_page_no_progress(ev), _page_ckpt_age(ev), _page_restart_loop(ev, "restart-loop"),
            _page_restart_loop(ev, "resume"), _page_throughput(ev)]
    items = "".join(f"<li><strong>{escape(what)}</strong> ({escape(run)}): {detail} → "
                    f"<span class=\"page {'yes' if fire else 'no'}\">{'PAGE' if fire else 'no page'}</span></li>"
                    for what, run, detail, fire in rows)
    return ["Page on symptoms a human must act on, each a rule over numbers every run already reports. "
            "Computed on this handbook's runs:", f"<ul>{items}</ul>",
            "The restart-loop run is the correct trainer killed before update 3 in every attempt, before any "
            "checkpoint exists: the supervisor stops restarting it, and its INVALID progress verdict is the "
            "expected one. The resumed run restarted once and finished: one restart is recovery, not a loop."]


CHAPTERS: tuple[Chapter, ...] = (
    Chapter("step", "What exactly is one training step, and where is its synchronization boundary?",
            ("resume", "straggler"), one_step, (("straggler", "progress"),)),
    Chapter("partition", "How is the data partitioned, and how do you prove that a resume neither replays nor "
            "skips samples?", ("resume", "sampler_not_saved"), partition,
            (("resume", "coverage"), ("sampler_not_saved", "coverage"))),
    Chapter("state", "What state must survive a restart?",
            ("resume", "optimizer_not_saved", "scheduler_not_saved", "rng_not_restored", "sampler_not_saved"),
            restart_state, (("optimizer_not_saved", "loss"), ("rng_not_restored", "loss"))),
    Chapter("health", "Which single metric tells you the job is unhealthy?", ("hang-sigstop", "straggler"),
            health_metric, (("hang-sigstop", "progress"), ("straggler", "progress"))),
    Chapter("resume", "How do you know a resumed run is correct?", ("resume",), resumed_correct,
            (("resume", "loss"),)),
    Chapter("world", "What breaks when the world size changes on resume?",
            ("shrink-world", "world_size_reslices", "fsdp-shrink-world"),
            world_size, (("shrink-world", "coverage"), ("world_size_reslices", "coverage"))),
    Chapter("stall", "How do you debug a job that is slow only every N minutes?", ("slow-disk",), periodic_stall,
            (("slow-disk", "progress"), ("slow-disk", "ckpt_age"))),
    Chapter("silent", "What is the most dangerous silent failure?", ("pad_uneven_shards",), silent_duplication,
            (("pad_uneven_shards", "loss"), ("pad_uneven_shards", "coverage"))),
    Chapter("interval", "How often should you checkpoint?", ("resume",), ckpt_interval, (("resume", "ckpt_age"),)),
    Chapter("hang", "Which rank hangs, and why does gloo not tell you?",
            ("hang-sigstop", "hang-holding-gil", "watchdog_disabled"), which_rank_hangs,
            (("hang-holding-gil", "progress"),)),
    Chapter("async", ASYNC_QUESTION,
            ("wide-sync", "wide-async", "async-kill-persist", "wide-fsdp", "bytes-ddp", "bytes-fsdp"), async_and_fsdp,
            (("async-kill-persist", "ckpt_age"), ("async-kill-persist", "progress"))),
    Chapter("paging", "What should page someone?",
            ("hang-sigstop", "hang-holding-gil", "restart-loop", "resume", "straggler"),
            paging, (("hang-holding-gil", "ckpt_age"), ("restart-loop", "progress"))),
)

NOT_ANSWERED: tuple[tuple[str, str], ...] = ()
"""The issue's questions that no run can answer yet, said so on the page (none since chapter 11 runs
the async checkpoints and FSDP)."""


def chapter_names() -> list[str]:
    return [c.slug for c in CHAPTERS]


def get_chapter(slug: str) -> Chapter:
    for chapter in CHAPTERS:
        if chapter.slug == slug:
            return chapter
    raise KeyError(f"unknown chapter {slug!r}; chapters: {', '.join(chapter_names())}")


# ----- running the cases -------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: Case
    run_dir: Path
    judged: JudgedRun | None
    error: str | None = None
    row: Row | None = None
    """For a planted defect: the defects table's row (caught, and whether its control was valid)."""
    measured: dict[str, Any] | None = None
    """For a measurement: what measurement.json holds."""

    @property
    def status(self) -> str:
        """CAUGHT / MISSED for a planted defect, MEASURED for a measurement, the verdict word for a run."""
        if self.case.kind == "measure":
            return "MEASURED" if self.measured is not None else "UNKNOWN"
        if self.judged is None:
            return "UNKNOWN"
        if self.case.kind == "defect":
            return "UNKNOWN" if self.row is None else ("CAUGHT" if self.row.caught else "MISSED")
        return verdict_word(self.judged.judgement.valid)

    @property
    def passed(self) -> bool:
        """The suite's view: a planted defect is CAUGHT beside a valid control; any other run gets the
        verdict it is there to show (VALID, or INVALID for a job that must be failed, a restart loop)."""
        if self.case.kind == "defect":
            return self.row is not None and self.row.caught and self.row.control_valid
        return self.status == self.case.expect


def cases_for(chapters: tuple[Chapter, ...] | list[Chapter]) -> list[Case]:
    """The runs the chapters quote, plus each planted defect's control, in CASES order."""
    keys = {k for c in chapters for k in c.runs}
    scenarios = {get_case(k).scenario().name for k in keys if get_case(k).kind == "defect"}
    return [c for c in CASES if c.key in keys
            or (c.kind not in ("defect", "measure") and c.scenario().name in scenarios)]


def run_case(case: Case, run_dir: Path, golden_cache: Path | None) -> CaseResult:
    try:
        if case.kind == "measure":
            return CaseResult(case, run_dir, None, measured=run_measurement(case.name, run_dir))
        return CaseResult(case, run_dir, case.run(run_dir, golden_cache))
    except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others
        return CaseResult(case, run_dir, None, f"the harness failed: {type(exc).__name__}: {exc}")


def judge_defects(results: dict[str, CaseResult]) -> None:
    """Give each defect its defects-table row, judged beside the control run of the same scenario."""
    controls = {r.case.scenario().name: r for r in results.values() if r.case.kind in ("control", "scenario")
                and r.judged}
    for result in results.values():
        control = controls.get(result.case.scenario().name) if result.case.kind == "defect" else None
        if result.judged is not None and control is not None:
            result.row = judge_row(get_defect(result.case.name), result.judged, control.judged,
                                   result.judged.record.wall_s)


def _usable(report: dict[str, Any] | None) -> bool:
    """A judged run's report.json without an error, or a finished measurement."""
    if report is None:
        return False
    return report.get("format") == MEASUREMENT_FORMAT or ("verdicts" in report and not report.get("error"))


def build_chapter(chapter: Chapter, reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The chapter's paragraphs and the claims they quote; a run without a report makes it unanswered."""
    missing = [k for k in chapter.runs if not _usable(reports.get(k))]
    if missing:
        return {"slug": chapter.slug, "question": chapter.question, "runs": list(chapter.runs),
                "paragraphs": [f"Not answered: run(s) {', '.join(missing)} produced no usable report."],
                "claims": [], "derived": [], "answered": False}
    evidence = Evidence(reports)
    try:
        paragraphs = chapter.answer(evidence)
    except (KeyError, IndexError, TypeError, ZeroDivisionError) as exc:  # a run that did not show what it should
        paragraphs = [f"Not answered: the runs lack a number this answer quotes ({type(exc).__name__}: "
                      f"{escape(str(exc))}); see their reports."]
        return {"slug": chapter.slug, "question": chapter.question, "runs": list(chapter.runs),
                "paragraphs": paragraphs, "claims": [], "derived": [], "answered": False}
    return {"slug": chapter.slug, "question": chapter.question, "runs": list(chapter.runs), "paragraphs": paragraphs,
            "claims": evidence.claims, "derived": evidence.derived, "answered": True}


# ----- the casebook page -------------------------------------------------------------------------

EXTRA_CSS = """
.badge.CAUGHT { background: #7c3aed; } .badge.MISSED { background: #dc2626; }
.badge.MEASURED { background: #0e7490; }
.chapter { border-top: 1px solid #e5e7eb; margin-top: 28px; padding-top: 4px; }
.claim { background: #eef2ff; padding: 0 3px; border-radius: 3px; font-weight: 600; }
figure { margin: 12px 0; } figure svg { max-width: 100%; height: auto; border: 1px solid #e5e7eb; }
figcaption { font-size: 12px; color: #6b7280; }
.runs li { margin: 4px 0; } code.repro { font-size: 11px; word-break: break-all; color: #374151; }
.page.yes { color: #fff; background: #dc2626; padding: 0 4px; border-radius: 3px; font-weight: 700; }
.page.no { color: #166534; font-weight: 600; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; } .plots figure { flex: 1 1 420px; }
"""


def render_handbook(out: Path, results: dict[str, CaseResult], chapters: list[dict[str, Any]],
                    plots: dict[tuple[str, str], str], wall_s: float) -> Path:
    """Write OUT/index.html and OUT/handbook.json (the claims, machine-readable); return index.html."""
    import json

    from trainwreck.harness.report.html import CSS  # the reports' look, so a click feels like one site

    out.mkdir(parents=True, exist_ok=True)
    links = {k: _rel(out, r.case.report_file(r.run_dir) if r.measured else RunDir(r.run_dir).report_file("report.html"))
             for k, r in results.items()}
    word = handbook_word(results, chapters)
    caught = [r for r in results.values() if r.case.kind == "defect"]
    reference = [r for r in results.values() if r.case.kind != "defect"]
    body = [f'<header><span class="badge {word}">{word}</span><h1>trainwreck handbook</h1>'
            f'<p class="headline {word}">{len(chapters)} questions answered by {len(results)} runs made on the spot in '
            f"{wall_s:.0f} s: {sum(r.passed for r in reference)}/{len(reference)} reference-trainer runs judged as "
            f"expected ({sum(r.status == 'VALID' for r in reference)} VALID, "
            f"{sum(r.status == 'INVALID' and r.passed for r in reference)} INVALID by design, "
            f"{sum(r.status == 'MEASURED' for r in reference)} benchmark measurements), "
            f"{sum(r.status == 'CAUGHT' for r in caught)}/{len(caught)} planted broken trainers caught. A broken "
            "trainer that trainwreck catches is the suite passing.</p></header>",
            "<h2>Questions</h2><ol>" + "".join(f'<li><a href="#{c["slug"]}">{escape(c["question"])}</a></li>'
                                               for c in chapters) + "</ol>"]
    # The caught broken trainers come first, in their own table: a failure shown as what it is.
    body.append(_caught_table(caught, links) + _reference_table(reference, links))
    body += [_chapter_html(c, results, links, plots) for c in chapters]
    body.append(_not_answered_html())
    html = out / "index.html"
    html.write_text(f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
                    f'content="width=device-width, initial-scale=1"><title>trainwreck handbook</title><style>{CSS}'
                    f'{EXTRA_CSS}</style></head>\n<body><main data-verdict="{word}">' + "\n".join(body)
                    + "</main></body></html>\n", encoding="utf-8")
    record = {"format": "trainwreck-handbook/1", "valid": word, "wall_s": round(wall_s, 2), "chapters": chapters,
              "runs": {k: {"kind": r.case.kind, "name": r.case.name, "status": r.status, "expect": "CAUGHT" if r.case.kind == "defect" else r.case.expect,
                           "passed": r.passed, "run_dir": str(r.run_dir),
                           "report": str(r.case.report_file(r.run_dir)), "reproduce": _reproduce(r),
                           "control_valid": r.row.control_valid if r.row else None,
                           "invariant": r.row.defect.invariant if r.row else None}
                       for k, r in results.items()},
              "plots": [{"run": k, "plot": n, "file": p} for (k, n), p in plots.items()]}
    (out / "handbook.json").write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    return html


def handbook_word(results: dict[str, CaseResult], chapters: list[dict[str, Any]]) -> str:
    """VALID when every reference run is valid, every defect caught and every chapter answered;
    UNKNOWN when something could not be judged; INVALID otherwise."""
    if all(r.passed for r in results.values()) and all(c["answered"] for c in chapters):
        return "VALID"
    unjudged = any(r.status == "UNKNOWN" for r in results.values()) or not all(c["answered"] for c in chapters)
    return "UNKNOWN" if unjudged else "INVALID"


def _rel(out: Path, path: Path) -> str:
    import os

    return os.path.relpath(path, out).replace(os.sep, "/")


def _reproduce(result: CaseResult) -> str:
    if result.measured is not None:
        return str(result.measured["command"])
    return result.judged.reproduce if result.judged else f"(the run did not finish: {result.error})"


def _run_item(result: CaseResult, link: str) -> str:
    return (f'<li><span class="badge {result.status}">{result.status}</span> <a href="{escape(link)}">'
            f"{escape(result.case.key)}</a>: {escape(result.case.summary())}<br><code class=repro>"
            f"{escape(_reproduce(result))}</code></li>")


def _chapter_html(chapter: dict[str, Any], results: dict[str, CaseResult], links: dict[str, str],
                  plots: dict[tuple[str, str], str]) -> str:
    figures = "".join(
        f'<figure>{(Path(path).read_text(encoding="utf-8"))}<figcaption>{escape(name)} of '
        f'<a href="{escape(links[key])}">{escape(key)}</a> ({results[key].status})</figcaption></figure>'
        for (key, name), path in plots.items() if (key, name) in _chapter_plots(chapter["slug"]))
    runs = "".join(_run_item(results[k], links[k]) for k in chapter["runs"] if k in results)
    return (f'<section class="chapter" id="{escape(chapter["slug"])}"><h2>{escape(chapter["question"])}</h2>'
            + "".join(p if p.startswith("<ul>") else f"<p>{p}</p>" for p in chapter["paragraphs"])
            + (f'<div class="plots">{figures}</div>' if figures else "")
            + f'<h3>Runs</h3><ul class="runs">{runs}</ul></section>')


def _chapter_plots(slug: str) -> tuple[tuple[str, str], ...]:
    return get_chapter(slug).plots


def _caught_table(caught: list[CaseResult], links: dict[str, str]) -> str:
    if not caught:
        return ""
    rows = "".join(
        f'<tr><td><a href="{escape(links[r.case.key])}">{escape(r.case.name)}</a></td>'
        f"<td>{escape(get_defect(r.case.name).bug)}</td><td>{escape(r.row.defect.invariant if r.row else '?')}</td>"
        f'<td><span class="badge {r.status}">{r.status}</span></td>'
        f'<td>{"control VALID" if r.row and r.row.control_valid else "control NOT valid"}</td>'
        f"<td><code class=repro>{escape(_reproduce(r))}</code></td></tr>" for r in caught)
    return ("<h2>Broken trainers, caught</h2><p>Planted defects from <code>trainwreck defects</code>. CAUGHT means the "
            "named invariant judged the broken run invalid, every planned fault fired, and the reference trainer "
            "passed the same scenario.</p><table><thead><tr><th>defect</th><th>bug</th><th>invariant</th>"
            f"<th>status</th><th>control</th><th>reproduce</th></tr></thead><tbody>{rows}</tbody></table>")


def _reference_table(reference: list[CaseResult], links: dict[str, str]) -> str:
    rows = "".join(f'<tr><td><a href="{escape(links[r.case.key])}">{escape(r.case.key)}</a></td>'
                   f'<td><span class="badge {r.status}">{r.status}</span></td><td>{r.case.expect}'
                   f'{"" if r.passed else " (NOT as expected)"}</td><td>{escape(r.case.summary())}</td>'
                   f"<td><code class=repro>{escape(_reproduce(r))}</code></td></tr>" for r in reference)
    return ("<h2>Reference runs</h2><p>The correct trainer under faults. A job that cannot make progress must be "
            "judged INVALID: that verdict is the expected one for it. MEASURED rows are benchmark jobs "
            "(benchmarks/fsdp.py), quoted for what a rank holds, not judged.</p><table><thead><tr><th>run</th><th>verdict"
            "</th><th>expected</th><th>what happens</th><th>reproduce</th></tr></thead><tbody>"
            f"{rows}</tbody></table>")


def _not_answered_html() -> str:
    if not NOT_ANSWERED:
        return ""
    return "<h2>Not answered yet</h2><ul>" + "".join(
        f"<li><strong>{escape(q)}</strong> {escape(why)}</li>" for q, why in NOT_ANSWERED) + "</ul>"


# ----- the whole handbook ------------------------------------------------------------------------


def run_handbook(out: Path, chapters: list[Chapter] | None = None, golden_cache: Path | None = None,
                 progress: Callable[[int, int, Any, bool], None] | None = None) -> tuple[Path, str]:
    """Run the chapters' cases under OUT/runs, write plots and the page; (index.html, the handbook's word)."""
    import time

    from trainwreck.harness.report.plots import write_plots

    chosen = list(chapters or CHAPTERS)
    cases = cases_for(chosen)
    started = time.monotonic()
    results: dict[str, CaseResult] = {}
    for i, case in enumerate(cases):
        if progress:
            progress(i, len(cases), case, False)
        results[case.key] = run_case(case, out / "runs" / f"{i + 1:02d}-{case.key}", golden_cache)
        judge_defects(results)  # controls come before their defects in CASES, so the row is ready now
        if progress:
            progress(i, len(cases), results[case.key], True)
    reports = {k: load_case(r.run_dir) for k, r in results.items() if r.judged is not None}
    reports.update({k: r.measured for k, r in results.items() if r.measured is not None})
    plots: dict[tuple[str, str], str] = {}
    for k, r in results.items():  # every run's report gets its plots; the chapters embed some of them
        if r.judged is not None:
            for name, path in write_plots(r.run_dir, r.judged.golden_dir).items():
                plots[(k, name)] = str(path)
    built = [build_chapter(c, reports) for c in chosen]
    index = render_handbook(out, results, built, plots, time.monotonic() - started)
    return index, handbook_word(results, built)
