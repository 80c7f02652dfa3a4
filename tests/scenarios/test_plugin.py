"""The pytest plugin's option resolution, markers and failure report (no jobs run here)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainwreck.harness import pytest_plugin as plugin
from trainwreck.invariants import Verdict
from trainwreck.invariants.judge import Judgement


class FakeConfig:
    def __init__(self, cli: dict[str, Any] | None = None, ini: dict[str, str] | None = None) -> None:
        self.cli, self.ini = cli or {}, ini or {}

    def getoption(self, dest: str, default: Any = None) -> Any:
        return self.cli.get(dest, default)

    def getini(self, name: str) -> str:
        return self.ini.get(name, "")


class FakeItem:
    nodeid = "tests/x.py::test_x"

    def __init__(self, **marker_kwargs: Any) -> None:
        self.markers = [pytest.mark.trainwreck(**marker_kwargs).mark] if marker_kwargs else []

    def iter_markers(self, name: str) -> Any:
        return iter(m for m in self.markers if m.name == name)


LAUNCHER = plugin.OPTIONS[plugin.LAUNCHER]


@pytest.mark.parametrize("layers, expected", [
    ({}, ("warm", "default")),
    ({"ini": "spawn"}, ("spawn", "ini trainwreck_launcher")),
    ({"ini": "spawn", "env": "torchrun"}, ("torchrun", "$TRAINWRECK_LAUNCHER")),
    ({"ini": "spawn", "env": "torchrun", "cli": "warm"}, ("warm", "--trainwreck-launcher")),
    ({"ini": "spawn", "env": "torchrun", "cli": "warm", "marker": "spawn"}, ("spawn", "marker on tests/x.py::test_x")),
])
def test_an_option_resolves_marker_over_cli_over_env_over_ini_over_default(
        monkeypatch: pytest.MonkeyPatch, layers: dict[str, str], expected: tuple[str, str]) -> None:
    monkeypatch.delenv(LAUNCHER.env, raising=False)
    if "env" in layers:
        monkeypatch.setenv(LAUNCHER.env, layers["env"])
    config = FakeConfig(cli={LAUNCHER.dest: layers["cli"]} if "cli" in layers else {},
                        ini={LAUNCHER.ini: layers["ini"]} if "ini" in layers else {})
    item = FakeItem(launcher=layers["marker"]) if "marker" in layers else FakeItem()
    assert plugin.resolve(config, plugin.LAUNCHER, item) == expected  # type: ignore[arg-type]


def test_an_empty_marker_value_is_explicit_while_an_empty_env_var_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = plugin.OPTIONS[plugin.CHAOS_BUDGET]
    monkeypatch.setenv(budget.env, "")
    config = FakeConfig(ini={budget.ini: "5m"})
    assert plugin.resolve(config, plugin.CHAOS_BUDGET, FakeItem()) == ("5m", "ini trainwreck_chaos_budget")  # type: ignore[arg-type]
    config = FakeConfig(cli={budget.dest: "1s"})
    assert plugin.resolve(config, plugin.CHAOS_BUDGET, FakeItem(chaos_budget=""))[0] == ""  # type: ignore[arg-type]


def test_every_option_has_a_flag_an_env_var_and_an_ini_key_named_alike() -> None:
    for name, option in plugin.OPTIONS.items():
        assert option.flag == "--trainwreck-" + name.replace("_", "-")
        assert option.env == "TRAINWRECK_" + name.upper()
        assert option.ini == option.dest == "trainwreck_" + name


def test_a_bad_option_value_is_a_usage_error_naming_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LAUNCHER.env, "slurm")
    with pytest.raises(pytest.UsageError, match=r"launcher='slurm' \(from \$TRAINWRECK_LAUNCHER\)"):
        plugin.settings_for(FakeConfig())  # type: ignore[arg-type]
    monkeypatch.delenv(LAUNCHER.env)
    with pytest.raises(pytest.UsageError, match="chaos_budget.*90s, 10m, 1h"):
        plugin.settings_for(FakeConfig(cli={"trainwreck_chaos_budget": "soon"}))  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match="positive integer"):
        plugin.settings_for(FakeConfig(ini={"trainwreck_chaos_examples": "lots"}))  # type: ignore[arg-type]


def test_settings_parse_examples_and_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in plugin.OPTIONS.values():
        monkeypatch.delenv(option.env, raising=False)
    settings = plugin.settings_for(FakeConfig(cli={"trainwreck_chaos_budget": "2m"}),  # type: ignore[arg-type]
                                   FakeItem(chaos_examples=5))  # type: ignore[arg-type]
    assert (settings.chaos_examples, settings.chaos_budget_s, settings.chaos_profile) == (5, 120.0, "ci")
    assert (settings.backend, settings.launcher, settings.keep_runs) == ("gloo", "warm", "failed")


@pytest.mark.gpu(devices=64)
def test_a_gpu_test_without_enough_devices_is_skipped_not_failed() -> None:
    pytest.fail("the gpu marker should have skipped this test: no machine here has 64 CUDA devices")


def test_the_failure_section_shows_verdicts_run_directory_and_the_reproducing_command(tmp_path: Path) -> None:
    verdicts = {"coverage": Verdict("coverage", False, "3 id(s) used twice within an epoch", {}, ["ids 3-5"]),
                "progress": Verdict("progress", True, "completed at step 16")}
    judged = SimpleNamespace(
        judgement=Judgement(False, verdicts, ["k9"], []),
        record=SimpleNamespace(run_dir=tmp_path / "run", outcome="completed", attempts=2),
        reproduce="trainwreck run --plan '[]' --world-sizes 2")
    text = plugin.describe_run(judged)
    assert "overall: INVALID (completed after 2 attempt(s))" in text
    assert "INVALID  coverage    3 id(s) used twice" in text and "ids 3-5" in text
    assert "planned faults that never fired: k9" in text
    assert f"run directory: {tmp_path / 'run'}" in text
    assert text.splitlines()[-1] == "reproduce: trainwreck run --plan '[]' --world-sizes 2"


@pytest.mark.slow
def test_a_failing_scenario_test_reports_its_verdicts_run_directory_and_reproducing_command(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "test_expects_invalid.py").write_text(
        "def test_kill_resume_is_invalid(run_scenario):\n"
        "    assert run_scenario('kill-resume').judgement.valid is False\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    section = done.stdout.split(" trainwreck ", 1)[1]
    assert "VALID    coverage" in section
    assert "run directory: " in section and "report: " in section
    assert "reproduce: trainwreck run kill-resume --plan '[{\"id\":\"kill-r1\"" in section
    assert "--backend gloo" in section


def test_golden_runs_persist_in_the_clis_user_cache_unless_an_option_names_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwreck.harness.judge.cache_dir import CACHE_ENV, default_cache_dir

    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert plugin.golden_cache_dir(FakeConfig()) == default_cache_dir() == tmp_path / "xdg" / "trainwreck" / "golden"
    assert plugin.golden_cache_dir(FakeConfig(ini={"trainwreck_golden_cache": str(tmp_path / "i")})) == tmp_path / "i"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "e"))  # the CLI's variable is the option's
    assert plugin.golden_cache_dir(FakeConfig()) == tmp_path / "e" == default_cache_dir()
    assert plugin.golden_cache_dir(FakeConfig(cli={"trainwreck_golden_cache": str(tmp_path / "c")})) == tmp_path / "c"


def test_a_run_the_plugin_describes_fails_assert_valid_in_one_line_pointing_at_its_section(tmp_path: Path) -> None:
    from trainwreck.harness.judge.runner import JudgedRun, RunNotValid

    verdicts = {"continuity": Verdict("continuity", False, "1 discontinuity", {}, ["step 7"]),
                "progress": Verdict("progress", True, "completed")}
    record = SimpleNamespace(run_dir=tmp_path / "run", outcome="completed", attempts=2)
    alone = JudgedRun(record, Judgement(False, verdicts, [], []), tmp_path, "trainwreck run x")  # type: ignore[arg-type]
    request = SimpleNamespace(node=SimpleNamespace(stash=pytest.Stash()))
    recorded = plugin.record_run(request, alone)  # type: ignore[arg-type]
    with pytest.raises(RunNotValid) as caught:
        alone.assert_valid()  # outside the plugin: the whole section
    assert "reproduce: trainwreck run x" in str(caught.value)
    with pytest.raises(RunNotValid) as caught:
        recorded.assert_valid()  # the plugin prints the section: the assertion says where
    message = str(caught.value)
    assert message.count("\n") == 0 and "reproduce:" not in message, message
    assert "judged the run INVALID (continuity)" in message and "trainwreck section below" in message
    assert request.node.stash[plugin.RUNS_KEY] == [recorded]


@pytest.mark.slow
def test_a_second_session_reuses_the_golden_run_and_a_failure_prints_its_section_once(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    # A corruption of a checkpoint no attempt writes never fires: the run is UNKNOWN, assert_valid fails.
    (tmp_path / "test_unknown.py").write_text(
        "def test_unfired(run_scenario):\n"
        "    run_scenario('kill-resume', plan=({'id': 'c', 'kind': 'corrupt', 'how': 'flip', 'attempt': 1},)"
        ").assert_valid()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINWRECK_GOLDEN_CACHE", "XDG_CACHE_HOME")}
    env["HOME"] = str(tmp_path / "home")
    cache = tmp_path / "home" / ".cache" / "trainwreck" / "golden"
    built = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                               "--rootdir", str(tmp_path), str(tmp_path / "test_unknown.py")],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.count("reproduce: trainwreck run kill-resume") == 1, done.stdout
        built.append({p.name: p.stat().st_ino for p in cache.iterdir() if not p.name.startswith(".")})
    assert len(built[0]) == 1 and built[1] == built[0], "the second session rebuilt the golden run"
