"""Property-based chaos: random fault plans, and the property that the reference trainer
keeps every invariant under each of them.

Hypothesis draws a `ChaosCase` (a world-size schedule and a plan from
`faults.strategies.plans`, or the external-fault fallback below while that module is
missing); a case whose run is not VALID fails with the verdicts and the exact
`trainwreck run --plan '<json>' ...` that reproduces it, and Hypothesis shrinks it
to a minimal plan first. Two profiles: `ci` (few examples, derandomised, no
database) and `nightly` (many examples, failures remembered in `.hypothesis/`).
`trainwreck chaos` (harness/commands/chaos.py) draws from the same strategy until
a time budget is spent.
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from trainwreck.harness.registry import DEFAULT_LAUNCHER
from trainwreck.harness.supervise.scenarios import Scenario, declare_scenarios
from trainwreck.invariants.verdict import verdict_word
from trainwreck.trainer.config import TrainConfig, backend_fields

# The chaos job: the CLI's default config (TrainConfig.tiny, checkpoints every 4 updates)
# with 24 updates, so 1.5 epochs; every field here is one `trainwreck run` can set, so a
# failing case's reproduce command rebuilds exactly this job.
(CHAOS_BASE,) = declare_scenarios("chaos", Scenario(
    name="chaos", summary="a random fault plan", question="", threatens=(), config={"total_steps": 24},
    hang_timeout_s=2.0))
WORLD_SCHEDULES: tuple[tuple[int, ...], ...] = ((2,), (2,), (4, 2), (2, 4))
"""World-size schedules a case draws from (the plain 2-rank job twice as often)."""
PARALLELISMS: tuple[str, str] = ("ddp", "fsdp")
"""How a case parallelises the model, by a coin flip (a failure shrinks towards DDP, the
first); under FSDP a world-size change reshards the checkpoint."""

PROFILES = {"ci": "trainwreck-ci", "nightly": "trainwreck-nightly"}
"""Our profile names -> the names registered with Hypothesis (its own 'ci' exists already)."""
DATABASE_DIR = Path(".hypothesis") / "examples"

settings.register_profile(
    PROFILES["ci"], max_examples=3, derandomize=True, database=None, deadline=None,
    suppress_health_check=list(HealthCheck), print_blob=False)
settings.register_profile(
    PROFILES["nightly"], max_examples=200, database=DirectoryBasedExampleDatabase(str(DATABASE_DIR)),
    deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


def chaos_settings(profile: str = "ci", max_examples: int | None = None) -> settings:
    """The Hypothesis settings of a profile ('ci' or 'nightly'), optionally resized."""
    if profile not in PROFILES:
        raise ValueError(f"chaos profile {profile!r} is unknown; use one of {', '.join(PROFILES)}")
    base = settings.get_profile(PROFILES[profile])
    return settings(base, max_examples=max_examples) if max_examples else base


# ----- durations ---------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in '90s', '10m', '1.5h'; ValueError naming the accepted forms otherwise."""
    match = _DURATION.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"budget {text!r} is not a duration: use a positive number followed by "
                         "s, m or h, e.g. 90s, 10m, 1h")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


# ----- cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChaosCase:
    world_sizes: tuple[int, ...]
    plan: list[dict[str, Any]] = field(default_factory=list)
    parallelism: str = "ddp"

    def config(self, backend: str = "auto") -> TrainConfig:
        overrides = {**CHAOS_BASE.config, "parallelism": self.parallelism, **backend_fields(backend)}
        return TrainConfig.tiny(**{"total_steps": 16, "ckpt_interval": 4, **overrides})

    def spec(self, out: Path, launcher: str = DEFAULT_LAUNCHER, backend: str = "auto") -> Any:
        from trainwreck.harness.supervise.spec import JobSpec

        return JobSpec(config=self.config(backend), world_sizes=self.world_sizes, plan=[dict(f) for f in self.plan],
                       hang_timeout_s=CHAOS_BASE.hang_timeout_s, launcher=launcher, run_dir=out, keep=True)

    def reproduce(self, launcher: str = DEFAULT_LAUNCHER, backend: str = "auto") -> str:
        from trainwreck.harness.judge.runner import reproduce_command

        command = reproduce_command(self.spec(Path("unused"), launcher, backend))
        return command + (f" --backend {backend}" if backend != "auto" else "")

    def describe(self) -> str:
        plan = json.dumps(self.plan, separators=(",", ":"))
        return f"{self.parallelism}, world sizes {'->'.join(map(str, self.world_sizes))}, plan {plan}"


def _external_plans(world_sizes: Sequence[int], cfg: TrainConfig) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Fallback while faults.strategies is missing: one harness-side kill, or nothing."""
    rank = st.integers(0, min(world_sizes) - 1)
    step = st.integers(1, cfg.total_steps)
    signal = st.fixed_dictionaries({"id": st.just("sig-1"), "kind": st.just("signal"), "rank": rank,
                                    "signal": st.sampled_from(("SIGKILL", "SIGTERM")), "step": step})
    return st.one_of(st.just([]), signal.map(lambda f: [f]))


def plans_for(world_sizes: Sequence[int], cfg: TrainConfig) -> st.SearchStrategy[list[dict[str, Any]]]:
    try:
        from trainwreck.faults.strategies import plans
    except ImportError:
        return _external_plans(world_sizes, cfg)
    return plans(cfg, tuple(world_sizes)).map(lambda plan: plan.to_list())


@st.composite
def chaos_cases(draw: st.DrawFn) -> ChaosCase:
    world_sizes = draw(st.sampled_from(WORLD_SCHEDULES))
    parallelism = PARALLELISMS[draw(st.booleans())]  # a coin flip; a failure shrinks to False, DDP
    plan = draw(plans_for(world_sizes, ChaosCase(world_sizes, parallelism=parallelism).config()))
    return ChaosCase(world_sizes, plan, parallelism)


# ----- running a case and the property -------------------------------------------------------


class ChaosFailure(AssertionError):
    """The reference trainer broke an invariant (or a planned fault never fired) under a plan."""


def failure_message(case: ChaosCase, judged: Any, reproduce: str) -> str:
    from trainwreck.harness.judge.runner import verdict_lines  # the runner imports torch; parsing options must not

    return "\n".join([
        f"the reference trainer is {verdict_word(judged.judgement.valid)} under {case.describe()}",
        *verdict_lines(judged.judgement),
        f"run directory: {judged.record.run_dir}",
        f"reproduce: {reproduce}",
    ])


@dataclass
class CaseRunner:
    """Runs one case per call in its own directory under `out` and raises ChaosFailure
    unless the run is VALID; valid runs are removed unless `keep`."""

    out: Path
    golden_cache: Path | None = None
    launcher: str = DEFAULT_LAUNCHER
    backend: str = "auto"
    keep: bool = False
    runs: int = 0
    failures: list[Path] = field(default_factory=list)

    def __call__(self, case: ChaosCase) -> Any:
        from trainwreck.harness.judge.runner import run_judged

        self.runs += 1
        run_dir = self.out / f"case-{self.runs:04d}"
        judged = run_judged(case.spec(run_dir, self.launcher, self.backend), golden_cache=self.golden_cache)
        if judged.judgement.valid is not True:
            self.failures.append(run_dir)
            raise ChaosFailure(failure_message(case, judged, case.reproduce(self.launcher, self.backend)))
        if not self.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        return judged


def check_property(run_case: Callable[[ChaosCase], Any], hypothesis_settings: settings) -> None:
    """Hypothesis over chaos_cases(): every case must satisfy run_case (shrinks on failure)."""

    @settings(hypothesis_settings)
    @given(chaos_cases())
    def the_reference_trainer_keeps_every_invariant(case: ChaosCase) -> None:
        run_case(case)

    the_reference_trainer_keeps_every_invariant()


# ----- a budgeted stream of cases (trainwreck chaos) ----------------------------------------


class BudgetSpent(Exception):
    """Raised inside the generator to stop it; never a failure."""


def stream_cases(seed: int, keep_going: Callable[[], bool], consume: Callable[[ChaosCase], None]) -> None:
    """Feed seeded random cases to `consume` while keep_going() says so.

    Hypothesis draws the cases (so the CLI explores exactly what the property tests
    do), in generate-only mode: no shrinking, no database. Raising BudgetSpent is the
    way out of its loop; Hypothesis re-raises it once it has replayed that example."""
    from hypothesis import seed as hypothesis_seed

    @hypothesis_seed(seed)
    @settings(max_examples=10**9, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, derandomize=False)
    @given(chaos_cases())
    def draw(case: ChaosCase) -> None:
        if not keep_going():
            raise BudgetSpent
        consume(case)

    try:
        draw()
    except BudgetSpent:
        pass
