"""The trainwreck pytest plugin (entry point `pytest11: trainwreck`).

Options, resolved in one place (`resolve`): a test's `@pytest.mark.trainwreck(name=value)`
> the command line `--trainwreck-NAME` > the environment `TRAINWRECK_NAME` > the ini
key `trainwreck_NAME` > the default. Markers: `gpu(devices=N)` (skips without N CUDA
devices), `chaos`, `slow`, `trainwreck(**options)`. Fixtures: `trainwreck_settings`,
`warm_launcher` (this worker's fork server, shut down at session end), `golden_cache`
(the CLI's cache by default, kept across sessions, shared by xdist workers), `run_scenario` (runs and judges
a scenario, returns a `JudgedRun`), `run_command` (runs and judges *your own* training
command under a plan, docs/TESTING.md) and `chaos` (the property-based chaos suite). A
failing test that ran jobs gets a `trainwreck` report section: each run's verdicts,
its run directory and report, and the exact command that reproduces it.

This module is imported by every pytest session where trainwreck is installed, so it
imports nothing heavy (torch, hypothesis) until a fixture needs it.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from trainwreck.harness.registry import DEFAULT_LAUNCHER, REFERENCE, get_launcher, launcher_names
from trainwreck.trainer.config import backend_fields

# ----- options: names as constants, resolution in one place ---------------------------------

BACKEND = "backend"
DEVICE = "device"
LAUNCHER = "launcher"
KEEP_RUNS = "keep_runs"
CHAOS_EXAMPLES = "chaos_examples"
CHAOS_BUDGET = "chaos_budget"
CHAOS_PROFILE = "chaos_profile"
COMMAND = "command"
WORLD_SIZES = "world_sizes"
HANG_TIMEOUT = "hang_timeout"
GOLDEN_CACHE = "golden_cache"

MARKER = "trainwreck"
KEEP_POLICIES = ("failed", "all", "none")


@dataclass(frozen=True)
class Option:
    name: str
    default: str
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--trainwreck-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "trainwreck_" + self.name

    @property
    def env(self) -> str:
        return "TRAINWRECK_" + self.name.upper()

    @property
    def ini(self) -> str:
        return "trainwreck_" + self.name


OPTIONS: dict[str, Option] = {o.name: o for o in (
    Option(BACKEND, "gloo", "process-group backend of scenario runs (nccl needs CUDA)", ("gloo", "nccl", "auto")),
    Option(DEVICE, "", "device of scenario runs: cpu, cuda or auto (default: the backend's, cuda for nccl and cpu "
                       "for gloo); gloo with cuda runs any number of ranks on the visible GPUs, rank r on GPU r mod n",
           ("", "cpu", "cuda", "auto")),
    Option(LAUNCHER, DEFAULT_LAUNCHER, "how ranks start: " + ", ".join(launcher_names(REFERENCE)),
           launcher_names(REFERENCE)),
    Option(KEEP_RUNS, "failed", "which run directories outlive their test: failed, all or none", KEEP_POLICIES),
    Option(CHAOS_EXAMPLES, "", "Hypothesis examples per chaos property (default: the profile's)"),
    Option(CHAOS_BUDGET, "", "wall-clock budget of one chaos property, e.g. 90s, 10m, 1h (default: none)"),
    Option(CHAOS_PROFILE, "ci", "chaos Hypothesis profile: ci (small, derandomised) or nightly (large, "
                                "with a database in .hypothesis/)", ("ci", "nightly")),
    Option(COMMAND, "", "your training command for run_command() called without one, e.g. 'python train.py'"),
    Option(WORLD_SIZES, "2", "run_command(): world size per attempt, e.g. 2,1 (the last repeats)"),
    Option(HANG_TIMEOUT, "30", "run_command(): seconds without progress before a hang is declared"),
    # Its env var is the CLI's ($TRAINWRECK_GOLDEN_CACHE): one cache, keyed alike, for both.
    Option(GOLDEN_CACHE, "", "where golden runs are cached across sessions (default: the CLI's cache, "
                             "$XDG_CACHE_HOME/trainwreck/golden or ~/.cache/trainwreck/golden)"),
)}


def resolve(config: pytest.Config, name: str, item: pytest.Item | None = None) -> tuple[str, str]:
    """(value, source) of option `name`: marker > CLI > env > ini > default."""
    option = OPTIONS[name]
    value, source = _layered(config, option, item)
    if option.choices and value not in option.choices:
        raise pytest.UsageError(f"trainwreck option {name}={value!r} (from {source}) must be one of "
                                f"{', '.join(option.choices)}")
    return value, source


def _layered(config: pytest.Config, option: Option, item: pytest.Item | None) -> tuple[str, str]:
    if item is not None:
        for marker in item.iter_markers(MARKER):  # closest first
            if option.name in marker.kwargs:  # explicit, even when empty ("no budget here")
                return str(marker.kwargs[option.name]), f"marker on {item.nodeid}"
    layers = ((config.getoption(option.dest, None), option.flag),
              (os.environ.get(option.env), f"${option.env}"),
              (config.getini(option.ini), f"ini {option.ini}"))
    for value, source in layers:
        if value not in (None, ""):  # an empty env var or ini key means "not set"
            return str(value), source
    return option.default, "default"


@dataclass(frozen=True)
class Settings:
    backend: str
    launcher: str
    keep_runs: str
    chaos_examples: int | None
    chaos_budget_s: float | None
    chaos_profile: str
    command: str = ""
    world_sizes: tuple[int, ...] = (2,)
    hang_timeout_s: float = 30.0
    device: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False)


def settings_for(config: pytest.Config, item: pytest.Item | None = None) -> Settings:
    values, sources = {}, {}
    for name in OPTIONS:
        values[name], sources[name] = resolve(config, name, item)
    examples = values[CHAOS_EXAMPLES]
    if examples and not (examples.isdigit() and int(examples) > 0):
        raise pytest.UsageError(f"trainwreck option chaos_examples={examples!r} (from {sources[CHAOS_EXAMPLES]}) "
                                "must be a positive integer")
    budget_s = None
    if values[CHAOS_BUDGET]:
        from trainwreck.harness.suites.chaos import parse_duration

        try:
            budget_s = parse_duration(values[CHAOS_BUDGET])
        except ValueError as exc:
            raise pytest.UsageError(f"trainwreck option chaos_budget (from {sources[CHAOS_BUDGET]}): {exc}") from None
    return Settings(backend=values[BACKEND], launcher=values[LAUNCHER], keep_runs=values[KEEP_RUNS],
                    chaos_examples=int(examples) if examples else None, chaos_budget_s=budget_s,
                    chaos_profile=values[CHAOS_PROFILE], command=values[COMMAND],
                    world_sizes=_world_sizes(values[WORLD_SIZES], sources[WORLD_SIZES]),
                    hang_timeout_s=_seconds(values[HANG_TIMEOUT], sources[HANG_TIMEOUT]), device=values[DEVICE],
                    sources=sources)


def _world_sizes(text: str, source: str) -> tuple[int, ...]:
    sizes = tuple(int(w) for w in text.replace(" ", "").split(",") if w.isdigit())
    if not sizes or ",".join(map(str, sizes)) != text.replace(" ", "") or min(sizes) < 1:
        raise pytest.UsageError(f"trainwreck option world_sizes={text!r} (from {source}) must be positive "
                                "integers like 2 or 2,1")
    return sizes


def _seconds(text: str, source: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise pytest.UsageError(f"trainwreck option hang_timeout={text!r} (from {source}) must be a positive "
                                "number of seconds, e.g. 30")
    return value


# ----- hooks -----------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trainwreck", "trainwreck fault-injection suite")
    for option in OPTIONS.values():
        extra = f" [env {option.env}, ini {option.ini}, default {option.default or 'none'}]"
        group.addoption(option.flag, dest=option.dest, default=None, help=option.help + extra)
        parser.addini(option.ini, option.help, default="")


MARKERS = (
    "gpu(devices=1): needs that many CUDA devices (skipped without them)",
    "chaos: property-based chaos (deselected by default; run with -m chaos)",
    "slow: heavier than the default run (deselected by default; run with -m slow)",
    "trainwreck(**options): override trainwreck options (backend, device, launcher, keep_runs, chaos_*, command, world_sizes, "
    "hang_timeout) for one test",
)


def pytest_configure(config: pytest.Config) -> None:
    from trainwreck.harness.launch.torchcache import keep_torch_cache_out_of_tmp

    keep_torch_cache_out_of_tmp()  # before a test imports torch: nothing of a run in $TMPDIR
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    settings_for(config)  # a bad CLI/env/ini value fails the session at once, not every test


def pytest_report_header(config: pytest.Config) -> str:
    shown = []
    for name in OPTIONS:
        value, source = resolve(config, name)
        shown.append(f"{name}={value or '-'} ({source})")
    return "trainwreck: " + ", ".join(shown)


def cuda_device_count() -> int:
    from trainwreck.harness.launch.gpus import cuda_device_count as count  # the CLI's own count

    return count()


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("gpu")
    if marker is None:
        return
    needed = int(marker.kwargs.get("devices", marker.args[0] if marker.args else 1))
    found = cuda_device_count()
    if found < needed:
        pytest.skip(f"needs {needed} CUDA device(s), found {found}")


RUNS_KEY = pytest.StashKey[list[Any]]()
"""Per test: the JudgedRuns it made (for the report section and the keep policy)."""
REPORTS_KEY = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    item.stash.setdefault(REPORTS_KEY, {})[report.when] = report
    runs = item.stash.get(RUNS_KEY, [])
    if report.when == "call" and report.failed and runs:
        report.sections.append(("trainwreck", "\n\n".join(describe_run(judged) for judged in runs)))


def describe_run(judged: Any) -> str:
    """A failure section: verdicts, run directory, report, and the reproducing command."""
    from trainwreck.harness.judge.runner import failure_section

    return failure_section(judged, render_report_if_available(judged.record.run_dir))


def render_report_if_available(run_dir: Path) -> Path | None:
    try:
        from trainwreck.report import render_report
    except ImportError:
        return None
    try:
        return render_report(run_dir)
    except Exception:  # noqa: BLE001 - the verdicts above still say what failed
        return None


def test_passed(item: pytest.Item) -> bool:
    reports = item.stash.get(REPORTS_KEY, {})
    return bool(reports) and all(r.passed for r in reports.values())


def pytest_sessionfinish(session: pytest.Session) -> None:
    # The fork server would die with us anyway (parent-death signal); an orderly close
    # reaps it before pytest's own exit, so nothing outlives the session.
    import sys

    launchers = sys.modules.get("trainwreck.harness.launch.launchers")
    if launchers is not None:
        launchers.shutdown_fork_server()
    command = sys.modules.get("trainwreck.harness.supervise.command.warm")
    if command is not None:
        command.shutdown_command_server()  # --cmd's, the same way


# ----- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def trainwreck_settings(request: pytest.FixtureRequest) -> Settings:
    """This test's options (its trainwreck marker applied)."""
    return settings_for(request.config, request.node)


@pytest.fixture(scope="session")
def warm_launcher() -> Iterator[Any]:
    """This process's fork server (one per xdist worker), started once, closed at the end."""
    from trainwreck.harness.launch import launchers

    server = launchers.fork_server()
    try:
        yield server
    finally:
        launchers.shutdown_fork_server()


@pytest.fixture(scope="session")
def golden_cache(request: pytest.FixtureRequest) -> Path:
    """Where golden runs are cached: `golden_cache_dir` (the CLI's cache unless an option says)."""
    return golden_cache_dir(request.config)


def golden_cache_dir(config: pytest.Config) -> Path:
    """The golden_cache option (flag, $TRAINWRECK_GOLDEN_CACHE, ini), else the CLI's own cache
    (harness/judge/cache_dir.py `default_cache_dir`). A golden run is keyed by what shapes it, so
    one built by any session or `trainwreck run` is reused, not rebuilt every session. xdist
    workers and concurrent sessions share it safely: each entry is built in a scratch
    directory and renamed into place."""
    from trainwreck.harness.judge.cache_dir import default_cache_dir

    value, _ = resolve(config, GOLDEN_CACHE)
    return Path(value) if value else default_cache_dir()


def apply_backend(config_overrides: dict[str, Any], backend: str, device: str = "") -> dict[str, Any]:
    """The backend's config fields, then the device option where one is set (gloo + cuda: shared GPUs)."""
    return {**config_overrides, **backend_fields(backend), **({"device": device} if device else {})}


def skip_without_cuda(settings: Settings) -> None:
    if settings.backend == "nccl" and cuda_device_count() == 0:
        pytest.skip("backend nccl needs CUDA; none is available")
    if settings.device == "cuda" and cuda_device_count() == 0:
        pytest.skip("device cuda needs CUDA; none is available")


def record_run(request: pytest.FixtureRequest, judged: Any) -> Any:
    """Attach a JudgedRun to the test, so its failure report shows the run and how to reproduce
    it; returns the run marked so, whose `assert_valid` then points at that section instead of
    printing it a second time."""
    judged = replace(judged, section_shown=True)
    request.node.stash.setdefault(RUNS_KEY, []).append(judged)
    return judged


def _clean_up(request: pytest.FixtureRequest, settings: Settings, run_dirs: list[Path]) -> None:
    keep = settings.keep_runs == "all" or (settings.keep_runs == "failed" and not test_passed(request.node))
    if not keep:
        for path in run_dirs:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run_scenario(request: pytest.FixtureRequest, tmp_path: Path, trainwreck_settings: Settings,
                 golden_cache: Path) -> Iterator[Callable[..., Any]]:
    """run_scenario(scenario or name, **Scenario field changes) -> JudgedRun (run and judged)."""
    from trainwreck.harness.judge.runner import run_judged, spec_for
    from trainwreck.harness.supervise.scenarios import Scenario, get_scenario

    settings = trainwreck_settings
    if get_launcher(settings.launcher).fork_server:
        request.getfixturevalue("warm_launcher")
    skip_without_cuda(settings)
    run_dirs: list[Path] = []

    def run(scenario: Scenario | str, **changes: Any) -> Any:
        base = get_scenario(scenario) if isinstance(scenario, str) else scenario
        base = replace(base, **changes)
        base = replace(base, config=apply_backend(dict(base.config), settings.backend, settings.device))
        if get_launcher(settings.launcher).fixed_world_size and len(set(base.world_sizes)) > 1:
            pytest.skip(f"{base.name}: {settings.launcher} restarts with a fixed world size, this scenario changes it")
        out = tmp_path / f"{base.name}-{len(run_dirs)}"
        run_dirs.append(out)
        judged = run_judged(spec_for(base, out, launcher=settings.launcher), base.name, golden_cache)
        if settings.backend != "auto":  # `trainwreck run` defaults to auto: name the backend that ran
            judged = replace(judged, reproduce=f"{judged.reproduce} --backend {settings.backend}")
        if settings.device:
            judged = replace(judged, reproduce=f"{judged.reproduce} --set device={settings.device}")
        return record_run(request, judged)

    yield run
    _clean_up(request, settings, run_dirs)


@pytest.fixture
def run_command(request: pytest.FixtureRequest, tmp_path: Path, trainwreck_settings: Settings,
                golden_cache: Path) -> Iterator[Callable[..., Any]]:
    """run_command(argv=None, *, plan=None, world_sizes=None, hang_timeout_s=None, ckpt_dir="checkpoints",
    fresh_golden=False) -> JudgedRun: your own training command (it calls the probe), one process per
    rank under the harness with `plan`'s faults, judged against its own cached golden run, exactly as
    `trainwreck run --cmd` does. argv: a list or a command line; None: the `command` option. world_sizes
    and hang_timeout_s default to the options (marker > CLI > env > ini > default)."""
    import shlex

    from trainwreck.faults.plan import PlanError
    from trainwreck.harness.supervise.command.target import Command
    from trainwreck.harness.judge.runner import run_judged
    from trainwreck.harness.supervise.spec import JobSpec, SpecError

    settings = trainwreck_settings
    run_dirs: list[Path] = []

    def run(argv: str | list[Any] | tuple[Any, ...] | None = None, *, plan: list[dict[str, Any]] | None = None,
            world_sizes: tuple[int, ...] | list[int] | None = None, hang_timeout_s: float | None = None,
            ckpt_dir: str = "checkpoints", fresh_golden: bool = False) -> Any:
        command = argv if isinstance(argv, str) else shlex.join(map(str, argv)) if argv else settings.command
        if not command:
            pytest.fail("run_command() needs your training command: pass it (run_command([sys.executable, "
                        "'train.py']) or set the trainwreck option command (ini trainwreck_command)", pytrace=False)
        out = tmp_path / f"cmd-{len(run_dirs)}"
        run_dirs.append(out)
        try:
            spec = JobSpec(target=Command(command, ckpt_dir), world_sizes=tuple(world_sizes or settings.world_sizes),
                           plan=[dict(f) for f in plan or []], hang_timeout_s=hang_timeout_s or settings.hang_timeout_s,
                           run_dir=out, keep=True)
        except (PlanError, SpecError, ValueError) as exc:
            pytest.fail(f"run_command(): {exc}", pytrace=False)
        judged = run_judged(spec, golden_cache=golden_cache, fresh_golden=fresh_golden)
        return record_run(request, judged)

    yield run
    _clean_up(request, settings, run_dirs)


@dataclass
class Chaos:
    """The chaos property for one test: `chaos.check()` runs Hypothesis with this test's
    profile, examples and budget, and returns the CaseRunner (its `runs` were real jobs)."""

    settings: Settings
    out: Path
    golden_cache: Path

    def check(self) -> Any:
        import time

        from trainwreck.harness.suites.chaos import CaseRunner, chaos_settings, check_property

        runner = CaseRunner(self.out, self.golden_cache, self.settings.launcher, self.settings.backend,
                            keep=self.settings.keep_runs == "all")
        deadline = time.monotonic() + self.settings.chaos_budget_s if self.settings.chaos_budget_s else None

        def run_case(case: Any) -> None:
            # Past the budget an example passes without running: Hypothesis then finishes quickly.
            if deadline is not None and time.monotonic() >= deadline and runner.runs > 0:
                return
            runner(case)

        check_property(run_case, chaos_settings(self.settings.chaos_profile, self.settings.chaos_examples))
        return runner


@pytest.fixture
def chaos(request: pytest.FixtureRequest, tmp_path: Path, trainwreck_settings: Settings,
          golden_cache: Path) -> Iterator[Chaos]:
    if get_launcher(trainwreck_settings.launcher).fork_server:
        request.getfixturevalue("warm_launcher")
    skip_without_cuda(trainwreck_settings)
    yield Chaos(trainwreck_settings, tmp_path / "chaos", golden_cache)
    _clean_up(request, trainwreck_settings, [tmp_path / "chaos"])
