"""`--cmd`'s warm launcher (harness/supervise/command/warm.py, harness/launch/cmdserver.py): a
user's `python SCRIPT.py` rank forked from a server that imported torch once is the process a
fresh interpreter would be (environment, argv, `__main__`, sys.path, exit codes, real deaths),
and a command it cannot serve starts cold and says so."""
from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.launch.procs import child_env
from trainwreck.harness.registry import CMD, CMD_WARM, COMMAND, default_launcher
from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.supervise.command.warm import unservable, warm_modules
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.supervisor import run_job
from trainwreck.report.markdown import render_markdown
from trainwreck.report.model import build_report
from trainwreck.rundir.layout import iter_events

# What a rank sees of its own process, written where argv[1] says.
WHOAMI = textwrap.dedent("""
    import json, os, sys
    facts = {"name": __name__, "argv": sys.argv, "file": __file__, "path0": sys.path[0], "cwd": os.getcwd(),
             "env": dict(os.environ), "main": sys.modules["__main__"].__dict__.get("WHOAMI"),
             "pid": os.getpid(), "pgid": os.getpgrp()}
    WHOAMI = 1
    with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + "-" + sys.argv[2] + ".json"), "w") as f:
        json.dump(facts, f)
""")
# Ends as argv[1] says: an exit code, its own SIGKILL, an exception, a ^C.
ENDS = textwrap.dedent("""
    import os, signal, sys
    how = sys.argv[1]
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "raise":
        raise ValueError("the script's own error")
    if how == "interrupt":
        raise KeyboardInterrupt
    sys.exit(int(how))
""")


def run(command: str, out: Path, launcher: str | None = None, world_sizes: tuple[int, ...] = (2,)) -> list[dict[str, Any]]:
    record = run_job(JobSpec(target=Command(command), world_sizes=world_sizes, plan=[], hang_timeout_s=30.0,
                             max_restarts=0, run_dir=out, keep=True, launcher=launcher))
    return list(iter_events(record.run_dir, batches=False))


def attempt_event(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in events if e["kind"] == "attempt")


def exit_codes(events: list[dict[str, Any]]) -> dict[int, int]:
    return {e["rank"]: e["code"] for e in events if e["kind"] == "exit"}


def test_commands_default_to_the_warm_launcher_and_cmd_still_names_the_cold_one() -> None:
    assert default_launcher(COMMAND) == CMD_WARM
    assert JobSpec(target=Command("python x.py")).launcher == CMD_WARM
    assert JobSpec(target=Command("python x.py"), launcher=CMD).launcher == CMD


@pytest.mark.parametrize("argv, why", [
    (["/bin/sh", "-c", "true"], "not the harness's own interpreter"),
    (["no-such-program-here", "x.py"], "not found on PATH"),
    ([sys.executable, "-c", "pass"], "interpreter option '-c'"),
    ([sys.executable, "-u", "x.py"], "interpreter option '-u'"),
    ([sys.executable], "is not `python SCRIPT.py ...`"),
    ([sys.executable, "-m"], "names no module"),
])
def test_a_command_the_server_cannot_run_as_the_interpreter_would_gets_the_reason(argv: list[str], why: str) -> None:
    assert why in (unservable(argv, Path.cwd(), child_env()) or "")


def test_the_harness_own_python_on_a_script_or_a_module_is_served() -> None:
    env = child_env()
    assert unservable([sys.executable, "train.py", "--steps", "3"], Path.cwd(), env) is None
    assert unservable([sys.executable, "-m", "pkg.train"], Path.cwd(), env) is None


def test_the_server_imports_torch_and_the_frameworks_the_script_imports_but_not_its_own_modules(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("import transformers\n")
    (tmp_path / "train.py").write_text("import mine\nfrom lightning import Trainer\nimport torch.distributed as dist\n")
    modules = warm_modules(f"python {tmp_path / 'train.py'}", tmp_path, child_env())
    assert {"torch", "torch.distributed", "transformers", "lightning", "lightning:Trainer"} <= set(modules)
    assert "mine" not in modules


def test_a_forked_rank_sees_the_environment_argv_and_main_a_fresh_interpreter_sees(tmp_path: Path) -> None:
    script = tmp_path / "whoami.py"
    script.write_text(WHOAMI)
    facts = {}
    for launcher in (CMD_WARM, CMD):
        events = run(f"{sys.executable} {script} {tmp_path} {launcher}", tmp_path / launcher, launcher)
        assert exit_codes(events) == {0: 0, 1: 0}
        facts[launcher] = [json.loads((tmp_path / f"rank{r}-{launcher}.json").read_text()) for r in range(2)]
    assert attempt_event(run(f"{sys.executable} {script} {tmp_path} again", tmp_path / "again"))["ranks"] == "forked"
    for ranks in facts.values():  # one process group per attempt, led by rank 0, as the supervisor kills it
        assert ranks[0]["pgid"] == ranks[1]["pgid"] == ranks[0]["pid"] != ranks[1]["pid"]
    for rank, (warm, cold) in enumerate(zip(facts[CMD_WARM], facts[CMD])):
        assert warm["name"] == "__main__" and warm["main"] is None  # a fresh __main__, not the server's
        assert warm["argv"] == [str(script), str(tmp_path), CMD_WARM] and cold["argv"][0] == str(script)
        assert (warm["file"], warm["path0"], warm["cwd"]) == (cold["file"], cold["path0"], cold["cwd"])
        assert sorted(warm["env"]) == sorted(cold["env"])  # nothing of the server's own leaks in
        torchrun = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                    "GROUP_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
                    "MASTER_ADDR": cold["env"]["MASTER_ADDR"], "TRAINWRECK_ATTEMPT": "0"}
        assert torchrun.items() <= warm["env"].items() and torchrun.items() <= cold["env"].items()
        assert warm["env"]["TRAINWRECK_RUN_DIR"] == str((tmp_path / CMD_WARM).absolute())
        same = {k for k in cold["env"] if not k.startswith(("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TRAINWRECK_RUN_DIR"))}
        assert {k: warm["env"][k] for k in same} == {k: cold["env"][k] for k in same}


# `python -m pkg.whoami OUT LABEL`: what a module run as __main__ sees of itself.
MODULE = textwrap.dedent("""
    import json, os, sys
    facts = {"name": __name__, "argv": sys.argv, "path0": sys.path[0], "package": __package__,
             "spec": __spec__.name, "file": __file__}
    with open(os.path.join(sys.argv[1], "module" + os.environ["RANK"] + "-" + sys.argv[2] + ".json"), "w") as f:
        json.dump(facts, f)
""")


def test_a_forked_python_m_rank_sees_the_module_argv_and_path_a_fresh_interpreter_sees(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "whoami.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)  # `-m` finds the package in the working directory, as the interpreter does
    starts = {launcher: attempt_event(run(f"{sys.executable} -m pkg.whoami {tmp_path} {launcher}",
                                          tmp_path / launcher, launcher, world_sizes=(1,)))
              for launcher in (CMD_WARM, CMD)}
    assert starts[CMD_WARM]["ranks"] == "forked", starts
    warm, cold = (json.loads((tmp_path / f"module0-{launcher}.json").read_text()) for launcher in (CMD_WARM, CMD))
    assert warm["name"] == "__main__" and warm["spec"] == "pkg.whoami" and warm["package"] == "pkg"
    assert warm["argv"][0] == str(tmp_path / "pkg" / "whoami.py") == warm["file"]
    assert {**warm, "argv": warm["argv"][:2]} == {**cold, "argv": cold["argv"][:2]}


# Draws from every global generator, unseeded, and writes what it drew.
DRAWS = textwrap.dedent("""
    import json, os, random, sys
    import numpy, torch
    draws = [torch.initial_seed(), torch.rand(1).item(), float(numpy.random.rand()), random.random()]
    with open(os.path.join(sys.argv[1], sys.argv[2] + "-" + os.environ["RANK"] + ".json"), "w") as f:
        json.dump(draws, f)
""")


def test_an_unseeded_forked_rank_draws_other_numbers_than_every_other_rank_and_attempt(tmp_path: Path) -> None:
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    for job in ("a", "b"):
        assert attempt_event(run(f"{sys.executable} {script} {tmp_path} {job}", tmp_path / job))["ranks"] == "forked"
    draws = [json.loads((tmp_path / f"{job}-{rank}.json").read_text()) for job in "ab" for rank in range(2)]
    for generator in range(4):  # torch's seed, torch, numpy, random: each as a fresh interpreter seeds it
        assert len({d[generator] for d in draws}) == 4, draws


@pytest.mark.parametrize("how, code", [("3", 3), ("kill", -9), ("raise", 1), ("interrupt", -2)])
def test_a_forked_rank_ends_with_the_code_or_signal_of_its_own_death(tmp_path: Path, how: str, code: int) -> None:
    script = tmp_path / "ends.py"
    script.write_text(ENDS)
    events = run(f"{sys.executable} {script} {how}", tmp_path / "run", world_sizes=(1,))
    assert attempt_event(events)["ranks"] == "forked"
    assert exit_codes(events) == {0: code}
    if how == "raise":  # the traceback starts at the script, as the interpreter prints it
        log = (tmp_path / "run" / "logs" / "a000-r000.log").read_text()
        assert log.startswith("Traceback (most recent call last):\n  File \"" + str(script)), log
        assert log.rstrip().endswith("ValueError: the script's own error") and "cmdserver" not in log


def test_a_command_that_is_not_python_starts_cold_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "ends.py"
    script.write_text(ENDS)
    events = run(f"/bin/sh -c {shlex.quote(f'exec {sys.executable} {script} 0')}", tmp_path / "run")
    attempt = attempt_event(events)
    assert attempt["ranks"] == "cold" and "not the harness's own interpreter" in attempt["cold_reason"]
    assert exit_codes(events) == {0: 0, 1: 0}
    assert f"--cmd ranks start cold (fresh interpreters), not forked warm: {attempt['cold_reason']}" in capsys.readouterr().err
    # The report's timeline cites it from the attempt event (the dataset fields are what a probe would add).
    spec = json.loads((tmp_path / "run" / "run.json").read_text())
    spec.update(dataset_size=8, global_batch=2, drop_last=True, total_steps=1)
    (tmp_path / "run" / "run.json").write_text(json.dumps(spec))
    timeline = render_markdown(build_report(tmp_path / "run"))
    assert f"attempt 0 started (ranks started cold, not forked warm: {attempt['cold_reason']})" in timeline


def test_a_script_that_cannot_be_prepared_in_the_fork_starts_cold_where_the_interpreter_reports_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.py"
    events = run(f"{sys.executable} {missing}", tmp_path / "run", world_sizes=(1,))
    attempt = attempt_event(events)
    assert attempt["ranks"] == "cold" and "FileNotFoundError" in attempt["cold_reason"], attempt
    assert exit_codes(events) == {0: 2}  # the fresh interpreter's "can't open file"
    assert "can't open file" in (tmp_path / "run" / "logs" / "a000-r000.log").read_text()
    assert "not forked warm: a rank could not prepare in the fork" in capsys.readouterr().err
