"""The executable handbook: interview questions on distributed training, answered by runs made on the spot.

A suite beside demo, chaos and defects. This module is its runs: CASES (built-in scenarios,
the handbook's own plans, planted defects from harness/suites/defects.py, the reference trainer on a
defect's scenario as its control, and benchmark jobs of benchmarks/ run through their command,
each leaving a measurement directory: rundir/layout.py `write_measurement`) and the
orchestration that runs them. Its plans and benchmark jobs are declared in the one scenario
registry (harness/supervise/scenarios.py, families "handbook" and "measurements"). The questions and their answers, claims over
the runs' report.json, are report/chapters.py; the page is report/handbook.py.
No answer holds a literal result.

A planted defect that trainwreck catches is the suite passing and is shown as CAUGHT, in its
own table, never among the VALID runs.
"""
from __future__ import annotations

import importlib.util
import json
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from trainwreck.harness.suites.defects import RESUME_MID_EPOCH, Row, get_defect, judge_row, run_defect
from trainwreck.harness.launch.procs import child_env, signal_group
from trainwreck.harness.supervise.command.warm import BENCHMARK_MODULES, fork_command
from trainwreck.report.angles import MTBF_ASSUMED_S
from trainwreck.report.casebook import load_case
from trainwreck.report.chapters import ASYNC_QUESTION, CHAPTERS
from trainwreck.report.handbook import Chapter, RunRow, build_chapter, fmt, page_word, render_handbook
from trainwreck.report.chapters_ops import PERIOD_QUESTION
from trainwreck.harness.judge.runner import JudgedRun, run_judged, spec_for
from trainwreck.harness.supervise.scenarios import Scenario, declare, get_scenario
from trainwreck.report.chapters_precision import POISON_QUESTION, PRECISION_QUESTION
from trainwreck.invariants.verdict import verdict_word
from trainwreck.harness.registry import by_name
from trainwreck.rundir.layout import RunDir, read_measurement, write_measurement

__all__ = ["CASES", "CHAPTERS", "MTBF_ASSUMED_S", "Case", "CaseResult", "default_chapters", "fmt", "get_case", "get_chapter",
           "handbook_word", "run_handbook"]


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


def _wide(name: str, summary: str, **config: Any) -> Scenario:
    return Scenario(name=name, summary=summary, question=ASYNC_QUESTION, threatens=("continuity", "progress"),
                    config={**WIDE, **config})


CKPT_SYNC = _wide("wide-sync", "the 2.1 M-parameter MLP on 2 ranks, DDP, a synchronous checkpoint every 4 updates")
CKPT_ASYNC = _wide("wide-async", "the same job with asynchronous checkpoints (ckpt_mode=async)", ckpt_mode="async")
FSDP_WIDE = _wide("wide-fsdp", "the same job with FSDP2 (parallelism=fsdp): each rank holds half the state",
                  parallelism="fsdp")
BF16_RESUME = replace(RESUME_MID_EPOCH, name="bf16-resume", config={**RESUME_MID_EPOCH.config, "amp_dtype": "bf16"},
                      summary="bf16 autocast on CPU; rank 1 is SIGKILLed before update 10; the job resumes from step 8",
                      question=PRECISION_QUESTION)


def _poison(name: str, summary: str, fault: dict[str, Any], threatens: tuple[str, ...]) -> Scenario:
    return Scenario(name=name, summary=summary, question=POISON_QUESTION, threatens=threatens,
                    plan=({"id": name, "rank": 1, "step": 5, **fault},))


NAN_REDUCED = _poison("nan-reduced", "rank 1's already reduced gradient gets a NaN at update 5 (after the all-reduce)",
                      {"kind": "nan_grad", "at": "reduced"}, ("replicas", "continuity"))
NAN_LOCAL = _poison("nan-local", "rank 1's own gradient gets a NaN at update 5, before the all-reduce",
                    {"kind": "nan_grad", "at": "local"}, ("replicas", "continuity"))
SKIP_COLLECTIVE = _poison("skip-collective", "rank 1 skips its gradient all-reduce of update 5 and waits for a result",
                          {"kind": "skip_collective", "then": "wait", "expect": "hang"}, ("hang", "progress"))
PERIOD_STEPS = 24
"""Four or five episodes in each run, so a period is the commonest of several gaps."""
NOISY_NEIGHBOUR = Scenario(
    name="noisy-neighbour", question=PERIOD_QUESTION, threatens=("hang", "progress"),
    # Saves off the bursts' updates; width 256 makes an update enough work that a burst stands out of
    # the scheduling noise of a loaded 2-core box (a 32-wide update is mostly that noise).
    config={"total_steps": PERIOD_STEPS, "ckpt_interval": 12, "width": 256},
    summary="a busy process takes 0.95 of rank 1's core for one update every 6 from update 3 (a noisy neighbour)",
    plan=({"id": "neighbour-r1", "kind": "noisy_neighbour", "rank": 1, "step": 3, "every": 6, "steps": 1,
           "share": 0.95},))
SLOW_STORAGE = Scenario(
    name="slow-storage", question=PERIOD_QUESTION, threatens=("hang", "progress"),
    config={"total_steps": PERIOD_STEPS, "ckpt_interval": 4},
    summary="every checkpoint write stalls 0.1 s (storage that is slow on every save, every 4 updates)",
    plan=({"id": "stall-every-write", "kind": "storage_stall", "step": 1, "seconds": 0.1, "count": 1000},))
DISK_CONTENTION = Scenario(
    name="disk-contention", question=PERIOD_QUESTION, threatens=("hang", "progress"),
    # A save after every update, so the writer meets a save whichever update it lands in; 16 MB blocks
    # queue each of a save's fsyncs behind tens of milliseconds of the writer's (faults/contention.py).
    config={"total_steps": PERIOD_STEPS, "ckpt_interval": 1},
    summary="a background process rewrites 16 MB blocks uncached on the run directory's disk for one update "
            "every 6 from update 3 (an upload or another job sharing the checkpoint disk)",
    plan=({"id": "writer-r0", "kind": "disk_contention", "rank": 0, "step": 3, "every": 6, "steps": 1,
           "block_mb": 16},))
# ----- the scale chapters' runs (report/chapters_scale.py; all behind --full) -----------------
PER_DEVICE = {"rank_batch": 4, "global_batch": 16, "lr": 0.01, "total_steps": 24, "dataset_size": 256,
              "ckpt_interval": 4}
"""4 samples per rank per update, so 16 on 4 ranks and 8 on 2; the LR (0.01) was tuned for 16."""


REWARMUP = 4
"""Updates over which lr-linear-rewarm moves the LR multiplier from the 4-rank one to the 2-rank one."""


def _lr_rule(rule: str, rewarmup: int = 0) -> Scenario:
    return Scenario(
        name=f"lr-{rule}" + ("-rewarm" if rewarmup else ""),
        question="What breaks when the world size changes with a fixed per-device batch?",
        summary=f"4 ranks of 4 samples lose a node of 2 before update 9; the job resumes on 2 ranks, its global "
                f"batch 16 → 8, the LR scaled by the {rule} rule"
                + (f", re-warmed over {rewarmup} updates" if rewarmup else ""),
        threatens=("coverage", "continuity", "progress"),
        plan=({"id": "node-loss", "kind": "node_loss", "ranks": [2, 3], "signal": "SIGKILL", "step": 9},),
        world_sizes=(4, 2), config={**PER_DEVICE, "lr_scaling": rule, **({"lr_rewarmup": rewarmup} if rewarmup else {})})


def _scale(world: int) -> Scenario:
    return Scenario(name=f"scale-w{world}", question="What breaks first at 10x scale?",
                    summary=f"{world} rank(s) of 4 samples each, no fault: the step's phases and the loss curve",
                    threatens=("progress",), world_sizes=(world,), config=PER_DEVICE)


SLOW_STEPS = (3, 4, 5, 6)
SLOW_NETWORK = Scenario(
    name="slow-network", question="A 30 % throughput drop: network, straggler or regression?",
    summary="every rank's gradient all-reduce starts 0.3 s late in updates 3-6 (a slow network)",
    threatens=("hang", "progress"),
    plan=tuple({"id": f"net-r{r}-u{k}", "kind": "comm_delay", "rank": r, "step": k, "seconds": 0.3}
               for k in SLOW_STEPS for r in (0, 1)))
SLOW_MODEL = Scenario(
    name="slow-model", question="A 30 % throughput drop: network, straggler or regression?",
    summary="every rank's forward pass is 0.3 s slower in updates 3-6 (a regression in the model code)",
    threatens=("hang", "progress"),
    plan=tuple({"id": f"model-r{r}", "kind": "straggler", "rank": r, "step": SLOW_STEPS[0], "until": SLOW_STEPS[-1],
                "seconds": 0.3, "point": "after_data"} for r in (0, 1)))
PLANS: dict[str, Scenario] = declare("handbook", ((s.name, s) for s in (
    RESTART_LOOP, CKPT_SYNC, CKPT_ASYNC, FSDP_WIDE, BF16_RESUME, NAN_REDUCED, NAN_LOCAL, SKIP_COLLECTIVE,
    NOISY_NEIGHBOUR, SLOW_STORAGE, DISK_CONTENTION, *(_lr_rule(r) for r in ("none", "linear", "sqrt")),
    _lr_rule("linear", REWARMUP), *(_scale(w) for w in (1, 2, 4)), SLOW_NETWORK, SLOW_MODEL)))
"""The handbook's own scenarios (the FSDP resharding case is the built-in fsdp-shrink-world: the registry
refused the handbook's twin of it)."""

MEASURE_WORLD, MEASURE_STEPS = 2, 6
BARRIER_WORLD = 3
"""Three ranks, so the rank monitored_barrier names is not merely "the other one"."""
MEASURE_TIMEOUT_S = 300.0
"""The benchmark job normally takes about 10 s here."""


@dataclass(frozen=True)
class Measure:
    """A benchmark job the handbook runs: its command and what it measures. The handbook runs the command
    rather than importing it: the harness may not import benchmarks/ (docs/DESIGN.md, Layout), and the
    command is its reproduce line."""

    argv: tuple[str, ...]
    summary: str


def _bytes(p: str) -> Measure:
    return Measure(("python", "-m", "trainwreck.benchmarks.fsdp", "--parallelism", p, "--world", str(MEASURE_WORLD),
                    "--steps", str(MEASURE_STEPS)),
                   f"benchmarks/fsdp.py: rank 0's bytes and step time for {p.upper()} on {MEASURE_WORLD} ranks, the "
                   f"same 2.1 M-parameter model, {MEASURE_STEPS} steps")


MEASURES: dict[str, Measure] = declare("measurements", (
    ("ddp", _bytes("ddp")), ("fsdp", _bytes("fsdp")),
    ("comm", Measure(("python", "-m", "trainwreck.benchmarks.comm", "--world", str(MEASURE_WORLD)),
                     f"benchmarks/comm.py: gloo all-reduce time on {MEASURE_WORLD} ranks from 4 KiB to 8 MiB, and "
                     "the 2.1 M-parameter model's gradients reduced one parameter at a time against one bucket")),
    ("barrier", Measure(("python", "-m", "trainwreck.benchmarks.barrier", "--world", str(BARRIER_WORLD)),
                        f"benchmarks/barrier.py: torch.distributed.monitored_barrier on {BARRIER_WORLD} gloo ranks with "
                        f"rank {BARRIER_WORLD - 1} held back; what each caller's error says and which ranks it names")),
    ("activations", Measure(("python", "-m", "trainwreck.benchmarks.activations"),
                            "benchmarks/activations.py: bytes held for backward by a 16-layer reference MLP, plain, "
                            "with every layer checkpointed and with √depth checkpointed segments (glibc malloc "
                            "counters)")),
    ("pipeline", Measure(("python", "-m", "trainwreck.benchmarks.pipeline", "--stages", "2", "--micro", "1,2,4,8"),
                         "benchmarks/pipeline.py: 2 processes as pipeline stages on loopback gloo (activations "
                         "forward, gradients back), GPipe and 1F1B at 1, 2, 4 and 8 micro-batches: each stage's time "
                         "blocked against computing, and the activations it holds")),
    ("loader", Measure(("python", "-m", "trainwreck.benchmarks.loader"),
                       "benchmarks/loader.py: a DataLoader with 2 worker processes prefetching 2 batches each, "
                       "SIGKILLed mid-epoch, resumed from the consumed count, from the sampler's own position and "
                       "(with torchdata) from StatefulDataLoader's state")),
    ("staleness", Measure(("python", "-m", "trainwreck.benchmarks.staleness"),
                          "benchmarks/staleness.py: the tiny reference MLP trained in one process synchronously and "
                          "with every gradient 1, 2 and 4 updates stale, the same samples in the same order")),
    ("tensor-parallel", Measure(("python", "-m", "trainwreck.benchmarks.tensor_parallel", "--world", "2"),
                                "benchmarks/tensor_parallel.py: a Megatron column-then-row MLP on 2 gloo ranks against "
                                "the one-device MLP, its collectives counted")),
    ("ring-tree", Measure(("python", "-m", "trainwreck.benchmarks.ring_tree", "--world", "4"),
                          "benchmarks/ring_tree.py: ring and binomial-tree all-reduce written from isend/irecv on 4 "
                          "gloo ranks, bytes and rounds counted, times beside an α-β model fitted by ping-pong")),
    ("param-server", Measure(("python", "-m", "trainwreck.benchmarks.param_server"),
                             "benchmarks/param_server.py: a parameter server over send/recv with 1 to 4 workers, its "
                             "inbound bytes and rate, beside a ring all-reduce of the same workers")),
    ("ckpt-size", Measure(("python", "-m", "trainwreck.benchmarks.ckpt_size"),
                          "benchmarks/ckpt_size.py: the reference trainer's checkpoint of the 2.1 M-parameter model "
                          "after one AdamW update, its bytes on disk and save time")),
    ("restart", Measure(("python", "-m", "trainwreck.harness.suites.restart_compare", "--json", "--out", "{run_dir}"),
                        "harness/suites/restart_compare.py: the same torchft job and kill, group 1 restarted alone "
                        "(heals from group 0) against the whole job restarted from its checkpoint"))))
MEASURE_NEEDS = {"restart": "torchft"}
"""A benchmark job that needs an optional extra: without it the measurement says so instead of failing."""


def measure_command(name: str, run_dir: Path | None = None) -> list[str]:
    """The job's command line; "{run_dir}" (a job that keeps its own runs) becomes RUN_DIR/runs."""
    where = str(run_dir / "runs") if run_dir is not None else "DIR"
    return [part.replace("{run_dir}", where) for part in MEASURES[name].argv]


def run_benchmark_job(command: list[str]) -> tuple[int | None, str, str]:
    """Run a benchmark job (`python -m MODULE ...`): its exit code (None: killed past
    MEASURE_TIMEOUT_S), stdout and stderr. Forked from the command server, which has imported
    BENCHMARK_MODULES, rather than a fresh interpreter paying for them again; cold when the server
    cannot serve it, saying why. A timeout or Ctrl-C kills the job's process group, and its ranks
    with it (their parent-death signals)."""
    with tempfile.TemporaryDirectory(prefix="trainwreck-measure-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        job = fork_command([sys.executable, *command[1:]], Path.cwd(), child_env(), out, BENCHMARK_MODULES, err)
        if isinstance(job, str):
            print(f"trainwreck handbook: {shlex.join(command)} starts cold (a fresh interpreter): {job}",
                  file=sys.stderr, flush=True)
            return _run_cold(command)
        code = job.finish(MEASURE_TIMEOUT_S)
        return code, out.read_text(errors="replace"), err.read_text(errors="replace")


def _run_cold(command: list[str]) -> tuple[int | None, str, str]:
    # Its own session: on a timeout or Ctrl-C the whole group (the benchmark and its ranks) is killed.
    proc = subprocess.Popen([sys.executable, *command[1:]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=child_env())
    try:
        out, err = proc.communicate(timeout=MEASURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, "", f"killed after {MEASURE_TIMEOUT_S:g} s"
    finally:
        if proc.poll() is None:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def run_measurement(name: str, run_dir: Path) -> dict[str, Any]:
    """Run the benchmark job into the measurement directory RUN_DIR (its measurement.json: the job's JSON,
    with bytes per parameter where it counts bytes, rank 0's parameters, gradients and AdamW state after a
    real step); returns what the directory holds, read back as every reader reads it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    command = measure_command(name, run_dir)
    missing = MEASURE_NEEDS.get(name)
    if missing and importlib.util.find_spec(missing) is not None:
        missing = None
    if missing:  # an optional extra: the chapter says it was not measured, and why
        write_measurement(run_dir, {"command": shlex.join(command), "measure": name,
                                    "skipped": f"{missing} is not installed (pip install 'trainwreck[{missing}]')"})
        return read_measurement(run_dir)
    code, out, err = run_benchmark_job(command)
    if code != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{shlex.join(command)} exited {code}: {last}")
    result = json.loads(out)
    if isinstance(result, list):  # one row per compared variant (restart_compare: one per restart scope)
        result = {"rows": {str(row["scope"]): row for row in result}}
    measured = {"command": shlex.join(command), "measure": name,
                "world_size": MEASURE_WORLD, **result}
    if "params" in result:  # a byte-counting job of benchmarks/fsdp.py
        numel = result["numel"]
        measured.update(parallelism=name, steps=MEASURE_STEPS,
                        bytes_per_param={k: round(result[k] / numel, 3) for k in ("params", "grads", "optimizer")})
        measured["bytes_per_param"]["state"] = round((result["params"] + result["optimizer"]) / numel, 3)
    write_measurement(run_dir, measured)
    return read_measurement(run_dir)


@dataclass(frozen=True)
class Case:
    """One run of the handbook. kind: scenario (a built-in scenario), plan (a handbook plan from
    PLANS), defect (a planted defect on its scenario), control (the reference trainer on the
    scenario of defect `name`) or measure (the benchmark job MEASURES[`name`]).
    `expect` is the verdict a correct suite gives it (MEASURED for a measurement)."""

    key: str
    kind: str
    name: str
    expect: str = "VALID"

    def report_file(self, run_dir: Path) -> Path:
        """What the chapters quote: the run's report.json, or a measurement's measurement.json."""
        paths = RunDir(run_dir)
        return paths.measurement_json if self.kind == "measure" else paths.report_file("report.json")

    def scenario(self) -> Scenario:
        if self.kind == "plan":
            return PLANS[self.name]
        return get_scenario(self.name) if self.kind == "scenario" else get_defect(self.name).scenario

    def summary(self) -> str:
        if self.kind == "measure":
            return MEASURES[self.name].summary
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
    Case("monitored-barrier", "measure", "barrier", expect="MEASURED"),
    Case("straggler", "scenario", "straggler"),
    Case("slow-disk", "scenario", "slow-disk"),
    Case("restart-loop", "plan", "restart-loop", expect="INVALID"),
    Case("wide-sync", "plan", "wide-sync"),
    Case("wide-async", "plan", "wide-async"),
    Case("async-kill-persist", "scenario", "async-kill-persist"),
    Case("wide-fsdp", "plan", "wide-fsdp"),
    Case("fsdp-shrink-world", "scenario", "fsdp-shrink-world"),
    Case("bytes-ddp", "measure", "ddp", expect="MEASURED"),
    Case("bytes-fsdp", "measure", "fsdp", expect="MEASURED"),
    Case("allreduce-cost", "measure", "comm", expect="MEASURED"),
    Case("truncate_uneven_shards", "defect", "truncate_uneven_shards"),
    Case("nan-reduced", "plan", "nan-reduced", expect="INVALID"),
    Case("nan-local", "plan", "nan-local", expect="INVALID"),
    Case("skip-collective", "plan", "skip-collective"),
    Case("bf16-resume", "plan", "bf16-resume"),
    Case("fp16-resume", "control", "scaler_not_saved"),
    Case("scaler_not_saved", "defect", "scaler_not_saved"),
    Case("fp16_unscaled", "defect", "fp16_unscaled"),
    Case("activations", "measure", "activations", expect="MEASURED"),
    Case("pipeline", "measure", "pipeline", expect="MEASURED"),
    Case("noisy-neighbour", "plan", "noisy-neighbour"),
    Case("slow-storage", "plan", "slow-storage"),
    Case("disk-contention", "plan", "disk-contention"),
    Case("loader-kill", "measure", "loader", expect="MEASURED"),
    Case("stale-gradients", "measure", "staleness", expect="MEASURED"),
    # the scale chapters (report/chapters_scale.py), all behind --full
    Case("lr-none", "plan", "lr-none"),
    Case("lr-linear", "plan", "lr-linear"),
    Case("lr-sqrt", "plan", "lr-sqrt"),
    Case("lr-linear-rewarm", "plan", "lr-linear-rewarm"),
    Case("accum", "control", "ckpt_mid_window"),
    Case("ckpt_mid_window", "defect", "ckpt_mid_window"),
    Case("restart-scope", "measure", "restart", expect="MEASURED"),
    Case("scale-w1", "plan", "scale-w1"),
    Case("scale-w2", "plan", "scale-w2"),
    Case("scale-w4", "plan", "scale-w4"),
    Case("slow-network", "plan", "slow-network"),
    Case("slow-model", "plan", "slow-model"),
    # the parallelism and economics chapters (report/chapters_parallel.py), all behind --full
    Case("tp-mlp", "measure", "tensor-parallel", expect="MEASURED"),
    Case("ring-tree", "measure", "ring-tree", expect="MEASURED"),
    Case("param-server", "measure", "param-server", expect="MEASURED"),
    Case("ckpt-size", "measure", "ckpt-size", expect="MEASURED"),
)


def get_case(key: str) -> Case:
    return by_name(CASES, key, "handbook run", key=lambda case: case.key)


NOT_ANSWERED: tuple[tuple[str, str], ...] = ()
"""The issue's questions that no run can answer yet, said so on the page (none since chapter 11 runs
the async checkpoints and FSDP)."""


def default_chapters() -> list[Chapter]:
    """What `trainwreck handbook` runs without --full: every chapter not marked full."""
    return [c for c in CHAPTERS if not c.full]


def chapter_names() -> list[str]:
    return [c.slug for c in CHAPTERS]


def get_chapter(slug: str) -> Chapter:
    return by_name(CHAPTERS, slug, "chapter", key=lambda chapter: chapter.slug)


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
            if self.measured is not None and "skipped" in self.measured:
                return "SKIPPED"  # an optional extra is missing; the chapter says which
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
        return self.status in (self.case.expect, "SKIPPED")


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


def run_rows(results: dict[str, CaseResult]) -> list[RunRow]:
    """What the page shows of each run (report/handbook.py draws it)."""
    rows = []
    for key, r in results.items():
        link = r.case.report_file(r.run_dir) if r.measured else RunDir(r.run_dir).report_file("report.html")
        defect = r.case.kind == "defect"
        rows.append(RunRow(key=key, kind=r.case.kind, name=r.case.name, status=r.status,
                           expect="CAUGHT" if defect else r.case.expect, passed=r.passed, summary=r.case.summary(),
                           reproduce=_reproduce(r), run_dir=r.run_dir, link=link,
                           report=r.case.report_file(r.run_dir), bug=get_defect(r.case.name).bug if defect else None,
                           invariant=r.row.defect.invariant if r.row else None,
                           control_valid=r.row.control_valid if r.row else None))
    return rows


def handbook_word(results: dict[str, CaseResult], chapters: list[dict[str, Any]]) -> str:
    """VALID when every reference run is valid, every defect caught and every chapter answered;
    UNKNOWN when something could not be judged; INVALID otherwise."""
    return page_word(list(results.values()), chapters)  # type: ignore[arg-type] - status and passed are all it reads


def _reproduce(result: CaseResult) -> str:
    if result.measured is not None:
        return str(result.measured["command"])
    return result.judged.reproduce if result.judged else f"(the run did not finish: {result.error})"


# ----- the whole handbook ------------------------------------------------------------------------


def run_handbook(out: Path, chapters: list[Chapter] | None = None, golden_cache: Path | None = None,
                 progress: Callable[[int, int, Any, bool], None] | None = None) -> tuple[Path, str]:
    """Run the chapters' cases under OUT/runs, write plots and the page; (index.html, the handbook's word)."""
    import time

    from trainwreck.report.plots import write_plots

    chosen = list(chapters or default_chapters())
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
    index = render_handbook(out, run_rows(results), built, plots, time.monotonic() - started,
                            {c.slug: c.plots for c in chosen}, NOT_ANSWERED)
    return index, handbook_word(results, built)
