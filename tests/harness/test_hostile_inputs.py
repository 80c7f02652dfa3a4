"""Hostile input to the real command lines: exit 2, one line naming the field, no traceback,
and nothing started (no golden run in the cache, no run directory written)."""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from trainwreck.harness.supervise.create_rundir import RunDirError, check_out_dir, check_run_dir
from trainwreck.harness.judge.runner import MAX_INLINE_PLAN, reproduce_command
from trainwreck.harness.supervise.spec import JobSpec, SpecError
from trainwreck.trainer.config import TrainConfig
from tests.warm_cli import WarmCli

HARNESS = [sys.executable, "-m", "trainwreck.harness.cli"]
TRAINER = [sys.executable, "-m", "trainwreck.trainer"]
DEEP = "[" * 100_000 + "]" * 100_000


def fault(**fields: object) -> str:
    return json.dumps([{"id": "f1", **fields}])


# (case id, argv after the program, text the one-line message must hold). {tmp} is the test's tmp dir.
CASES: list[tuple[str, list[str], str]] = [
    ("deep-plan-file", [*HARNESS, "run", "--plan", "@{tmp}/deep.json", "--out", "{tmp}/o"], "--plan is nested too deeply"),
    ("deep-plan-inline", [*HARNESS, "run", "--plan", "[" * 5000, "--out", "{tmp}/o"], "--plan is nested too deeply"),
    ("deep-config-file", [*TRAINER, "--run-dir", "{tmp}/o", "--config", "@{tmp}/deep.json"], "--config is nested too deeply"),
    ("config-not-object", [*TRAINER, "--run-dir", "{tmp}/o", "--config", "[1]"], "--config must be a JSON object"),
    ("config-nan", [*TRAINER, "--run-dir", "{tmp}/o", "--config", '{"lr": NaN}'], "NaN"),
    ("config-wrong-type", [*TRAINER, "--run-dir", "{tmp}/o", "--config", '{"lr": "fast"}'], "lr='fast' must be a number"),
    ("plan-missing-file", [*HARNESS, "run", "--plan", "@{tmp}/absent.json", "--out", "{tmp}/o"], "cannot read the file"),
    ("id-list", [*HARNESS, "run", "--plan", fault(kind="kill", rank=0, step=1).replace('"f1"', '["f1"]'), "--out", "{tmp}/o"], "field 'id'"),
    ("id-object", [*HARNESS, "run", "--plan", fault(kind="kill", rank=0, step=1).replace('"f1"', '{"a": 1}'), "--out", "{tmp}/o"], "field 'id'"),
    ("kind-list", [*HARNESS, "run", "--plan", fault(kind=["kill"], rank=0, step=1), "--out", "{tmp}/o"], "field 'kind'"),
    ("rank-string", [*HARNESS, "run", "--plan", fault(kind="kill", rank="0", step=1), "--out", "{tmp}/o"], "field 'rank'"),
    ("at-s-infinity", [*HARNESS, "run", "--plan", '[{"id": "s", "kind": "signal", "rank": 0, "signal": "SIGKILL", "at_s": Infinity}]',
                       "--out", "{tmp}/o"], "Infinity"),
    ("straggler-infinity", [*HARNESS, "run", "--plan", '[{"id": "s", "kind": "straggler", "rank": 0, "step": 1, "seconds": Infinity}]',
                            "--out", "{tmp}/o"], "Infinity"),
    ("straggler-overflow", [*HARNESS, "run", "--plan", '[{"id": "s", "kind": "straggler", "rank": 0, "step": 1, "seconds": 1e999}]',
                            "--out", "{tmp}/o"], "field 'seconds'=inf is not a finite number"),
    ("hang-timeout-inf", [*HARNESS, "run", "--plan", "[]", "--hang-timeout", "inf", "--out", "{tmp}/o"], "hang_timeout_s=inf"),
    ("hang-timeout-nan", [*HARNESS, "run", "--plan", "[]", "--hang-timeout", "nan", "--out", "{tmp}/o"], "hang_timeout_s=nan"),
    ("world-sizes-bad", [*HARNESS, "run", "--plan", "[]", "--world-sizes", "0,-1", "--out", "{tmp}/o"], "world"),
    ("total-steps-negative", [*HARNESS, "run", "--plan", "[]", "--total-steps", "-5", "--out", "{tmp}/o"], "total_steps=-5"),
    ("trainer-total-steps-0", [*TRAINER, "--run-dir", "{tmp}/o", "--total-steps", "0"], "total_steps=0"),
    ("trainer-lr-nan", [*TRAINER, "--run-dir", "{tmp}/o", "--tiny", "--set", "lr=nan"], "lr=nan is not a finite number"),
    ("trainer-lr-inf", [*TRAINER, "--run-dir", "{tmp}/o", "--tiny", "--set", "lr=inf"], "lr=inf is not a finite number"),
    ("chaos-budget", [*HARNESS, "chaos", "--budget", "-1", "--out", "{tmp}/o"], "--budget"),
    ("chaos-seed", [*HARNESS, "chaos", "--seed", "x", "--out", "{tmp}/o"], "--seed"),
    ("chaos-world-sizes", [*HARNESS, "chaos", "--world-sizes", "0,-1", "--out", "{tmp}/o"], "--world-sizes"),
    ("trainer-usage", [*TRAINER, "--run-dir", "{tmp}/o", "--total-steps", "x"], "--total-steps"),
    *[(f"{cmd}-out-is-file", [*HARNESS, cmd, "--out", "{tmp}/file"], "is an existing file")
      for cmd in ("run", "demo", "chaos", "sweep", "defects")],
    *[(f"{cmd}-out-under-file", [*HARNESS, cmd, "--out", "{tmp}/file/sub"], "which is a file")
      for cmd in ("run", "demo", "chaos", "sweep", "defects")],
    ("run-out-holds-run", [*HARNESS, "run", "--plan", "[]", "--out", "{tmp}/old-run"], "--out {tmp}/old-run is not empty"),
    # Absurd values (issue 24, item 9): refused with the limit and the fix, nothing started.
    ("plan-dev-zero", [*HARNESS, "run", "--plan", "@/dev/zero", "--out", "{tmp}/o"], "longer than 16777216 bytes"),
    ("world-sizes-empty", [*HARNESS, "run", "--plan", "[]", "--world-sizes", "", "--out", "{tmp}/o"], "--world-sizes ''"),
    ("hang-timeout-huge", [*HARNESS, "run", "--plan", "[]", "--hang-timeout", "1e9", "--out", "{tmp}/o"],
     "exceeds the limit of 3600 s"),
    ("total-steps-huge", [*HARNESS, "run", "--plan", "[]", "--total-steps", "2000000000", "--out", "{tmp}/o"],
     "total_steps=2000000000 exceeds the limit of 1000000"),
    ("width-huge", [*HARNESS, "run", "--plan", "[]", "--set", "width=2000000000", "--out", "{tmp}/o"],
     "width=2000000000 exceeds the limit of 16384"),
    ("trainer-width-huge", [*TRAINER, "--run-dir", "{tmp}/o", "--tiny", "--set", "width=2000000000"],
     "width=2000000000 exceeds the limit"),
    ("run-out-foreign-events", [*HARNESS, "run", "--plan", "[]", "--out", "{tmp}/foreign"], "is not empty"),
]


@pytest.fixture
def hostile_tmp(tmp_path: Path) -> Path:
    (tmp_path / "deep.json").write_text(DEEP)
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "old-run").mkdir()
    (tmp_path / "old-run" / "run.json").write_text("{}")
    (tmp_path / "foreign" / "events").mkdir(parents=True)
    (tmp_path / "foreign" / "events" / "a0-r0.jsonl").write_text('{"kind": "start", "t": 0, "pid": 1}\n')
    return tmp_path


FRESH = {"deep-plan-file", "deep-config-file"}
"""Cases also run in a fresh interpreter, one per entry point: the interpreter's own start-up
(`python -m`, the deep-nesting guard before any import) beside the forked runs."""


@pytest.fixture(scope="module")
def warm_cli() -> Iterator[WarmCli]:
    # Module scope: the server is gone when the module ends, before any other module's
    # leftover-process checks look (tests/harness/conftest.py); the module runs on one worker.
    cli = WarmCli()
    try:
        yield cli
    finally:
        cli.close()


@pytest.mark.parametrize("case_id,argv,expected", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_exits_2_with_one_line_and_starts_nothing(
        hostile_tmp: Path, warm_cli: WarmCli, case_id: str, argv: list[str], expected: str) -> None:
    cache = hostile_tmp / "golden-cache"
    argv = [a.replace("{tmp}", str(hostile_tmp)) for a in argv]
    env = dict(os.environ, TRAINWRECK_GOLDEN_CACHE=str(cache))
    runs = [warm_cli.run(argv, hostile_tmp, env, hostile_tmp.parent / f"{hostile_tmp.name}.log")]
    if case_id in FRESH:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, cwd=hostile_tmp)
        assert not proc.stdout, proc.stdout[-2000:]
        runs.append((proc.returncode, proc.stderr))
    for code, output in runs:  # stdout and stderr together: the one line is all a user sees
        assert code == 2, (code, output[-2000:])
        assert "Traceback" not in output
        lines = output.strip().splitlines()
        assert len(lines) == 1, output[-2000:]
        assert expected.replace("{tmp}", str(hostile_tmp)) in lines[-1], lines
    assert not cache.exists() or not any(cache.iterdir()), "a golden run was started"
    assert not (hostile_tmp / "o").exists(), "a run directory was written"


# ----- the checks on their own ---------------------------------------------------------------


def test_check_out_dir_accepts_a_new_or_empty_directory_and_creates_nothing(tmp_path: Path) -> None:
    assert check_out_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    check_out_dir(tmp_path / "empty")
    assert list(tmp_path.iterdir()) == [tmp_path / "empty"]  # the write probe left nothing


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any permission bits")
def test_check_out_dir_refuses_a_directory_that_cannot_be_written(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(RunDirError, match="cannot be written"):
        check_out_dir(locked / "run")


def test_a_run_directory_with_foreign_events_but_no_run_json_is_refused(tmp_path: Path) -> None:
    check_run_dir(tmp_path)  # empty: fine
    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)
    with pytest.raises(RunDirError, match="checkpoints/ of some other run but no run.json"):
        check_run_dir(tmp_path)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_job_spec_refuses_a_non_finite_hang_timeout(value: float) -> None:
    with pytest.raises(SpecError, match="hang_timeout_s=.* is not a finite number"):
        JobSpec(config=TrainConfig.tiny(), world_sizes=(2,), hang_timeout_s=value)
    JobSpec(config=TrainConfig.tiny(), world_sizes=(2,), hang_timeout_s=5.0)  # a finite one is fine


def test_a_plan_too_large_for_one_command_line_is_reproduced_from_a_file(tmp_path: Path) -> None:
    plan = [{"id": f"k{i}", "kind": "kill", "rank": 1, "step": 12, "attempt": i} for i in range(10_000)]
    spec = JobSpec(config=TrainConfig.tiny(), world_sizes=(2,), plan=plan, run_dir=tmp_path)
    line = reproduce_command(spec)
    assert len(line) < MAX_INLINE_PLAN
    assert f"--plan @{tmp_path.absolute() / 'plan.json'}" in line
    assert json.loads((tmp_path / "plan.json").read_text()) == plan
    small = JobSpec(config=TrainConfig.tiny(), world_sizes=(2,), plan=plan[:1], run_dir=tmp_path / "s")
    assert '"id":"k0"' in reproduce_command(small) and not (tmp_path / "s").exists()


# ----- Ctrl-C ----------------------------------------------------------------------------------


def test_ctrl_c_of_a_run_prints_one_line_exits_130_and_leaves_no_rank_running(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # A hang with a long timeout keeps the ranks alive until the interrupt.
    plan = '[{"id": "h", "kind": "hang", "rank": 1, "step": 3, "expect": "hang"}]'
    env = dict(os.environ, TRAINWRECK_GOLDEN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([*HARNESS, "run", "--plan", plan, "--hang-timeout", "120", "--out", str(run)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while len(start_pids(run)) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "ranks never started"
            time.sleep(0.1)  # polling files another process tree writes; no event to wait on
        pids = start_pids(run)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == ("trainwreck run: interrupted (Ctrl-C); ranks stopped, "
                                            "partial results left in place"), err
    _, alive = psutil.wait_procs([p for p in map(_process, pids) if p is not None], timeout=15)
    assert alive == [], f"ranks left running: {alive}"


def start_pids(run: Path) -> list[int]:
    pids = []
    for path in sorted((run / "events").glob("a*.jsonl")) if (run / "events").is_dir() else []:
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written right now
            if event.get("kind") == "start":
                pids.append(event["pid"])
    return pids


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


# ----- the config validator ------------------------------------------------------------------


@pytest.mark.parametrize("field,value,message", [
    ("lr", float("nan"), "lr=nan is not a finite number"),
    ("dropout", float("inf"), "dropout=inf is not a finite number"),
    ("lr", "fast", "lr='fast' must be a number"),
    ("width", True, "width=True must be a positive integer"),
    ("width", 2.5, "width=2.5 must be a positive integer"),
    ("backend", ["gloo"], "backend=['gloo'] must be a string"),
])
def test_a_config_refuses_wrong_types_and_non_finite_numbers_naming_the_field(
        field: str, value: object, message: str) -> None:
    from trainwreck.trainer.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        TrainConfig.tiny(**{field: value})
    assert message in str(caught.value)
    TrainConfig.tiny(lr=1, dropout=0.0)  # an int where a float is declared is fine


@pytest.mark.parametrize("fault", [
    {"id": ["a"], "kind": "kill", "rank": 0, "step": 1},
    {"id": "a", "kind": {"k": 1}, "rank": 0, "step": 1},
    {"id": "a", "kind": "signal", "rank": 0, "signal": ["SIGKILL"], "step": 1},
])
def test_a_job_spec_refuses_unhashable_ids_kinds_and_signals_as_input_errors(fault: dict) -> None:
    # JobSpec meets the external injector's parser first; a list there once raised TypeError.
    with pytest.raises(SpecError):
        JobSpec(config=TrainConfig.tiny(), world_sizes=(2,), plan=[fault])


# ----- hostile environments (issue 24, item 8): exit 2 and one line, never 1, never a traceback ----------


def one_line_exit_2(argv: list[str], env: dict[str, str], cwd: Path, expected: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, cwd=cwd)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr[-2000:]


@pytest.mark.parametrize("cache", ["file", "file/below"])
def test_a_golden_cache_that_is_a_file_exits_2_in_one_line(tmp_path: Path, cache: str) -> None:
    (tmp_path / "file").write_text("not a folder")
    env = dict(os.environ, TRAINWRECK_GOLDEN_CACHE=str(tmp_path / cache))
    one_line_exit_2([*HARNESS, "run", "--plan", "[]", "--out", str(tmp_path / "o")], env, tmp_path,
                    "the golden cache")
    assert not (tmp_path / "o").exists()


def test_an_empty_home_never_puts_the_golden_cache_at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwreck.harness.judge.cache_dir import CACHE_ENV, default_cache_dir

    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for home in ("", "relative/home", "/"):
        monkeypatch.setenv("HOME", home)
        folder = default_cache_dir()
        assert folder.is_absolute() and folder.parts[1] != ".cache", folder
        assert not str(folder).startswith(("relative", "/.cache")), folder


def test_a_multi_rank_trainer_without_master_port_exits_2_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    one_line_exit_2([*TRAINER, "--run-dir", str(tmp_path / "o"), "--tiny"], env, tmp_path, "MASTER_PORT")


def test_a_taken_master_port_exits_2_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(taken.getsockname()[1]))
        one_line_exit_2([*TRAINER, "--run-dir", str(tmp_path / "o"), "--tiny"], env, tmp_path, "Address already in use")


def test_a_lone_trainer_with_a_stray_master_addr_listens_on_no_interface(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="0.0.0.0", MASTER_PORT=str(port))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    proc = psutil.Popen([*TRAINER, "--run-dir", str(tmp_path / "o"), "--tiny", "--total-steps", "8"], env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    listening = set()
    try:
        while proc.poll() is None:  # watching the process's own sockets for as long as it lives
            try:
                listening |= {c.laddr for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN}
            except psutil.NoSuchProcess:
                break
            # Its store's and gloo's listeners live from the process group's start to its end (seconds):
            # a look every 20 ms sees them, where looking without pause took a core from the trainer.
            with contextlib.suppress(psutil.TimeoutExpired):
                proc.wait(timeout=0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    outward = {a for a in listening if not ipaddress.ip_address(a.ip).is_loopback}
    assert not outward, f"a one-process job listened on {outward}"  # gloo's own pair sockets stay on loopback


def test_an_environment_failure_inside_a_command_exits_2_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import errno
    from types import SimpleNamespace

    from trainwreck.harness.cli import run_command

    class DiskFull:
        @staticmethod
        def main(args: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device", "/run/verdicts.json")

    import os
    import re

    assert run_command("run", DiskFull, SimpleNamespace()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # The disk is named: the mount point that holds the file, and its free space (which moves).
    mount = "/run" if os.path.ismount("/run") else "/"
    assert len(err) == 1 and re.fullmatch(
        rf"trainwreck run: error: No space left on device \(/run/verdicts\.json, on the disk mounted at {mount} "
        r"\(\d+(\.\d)? [KMGT]?B free of \d+(\.\d)? [KMGT]?B\)\): free space on that disk, or write to another one", err[0]), err


def test_a_run_directory_whose_name_is_not_utf8_gets_its_report(tmp_path: Path) -> None:
    from tests.report.rundirs import clean_run
    from trainwreck.report import render_report

    run = clean_run(tmp_path / os.fsdecode(b"run-\xff\xfe"))
    html = render_report(run)
    assert html.is_file() and (run / "report" / "report.md").is_file()
