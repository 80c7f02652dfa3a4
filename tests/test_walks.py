"""The two walks a newcomer follows, measured: a fault from `trainwreck run --plan` to its verdict,
and a `trainwreck run --cmd` job from the command line to its verdict. Every Python process of the run
records which of our modules are on its call stack at each milestone (tests/walks/sitecustomize.py);
the union must be the list docs/HARNESS.md "The walks" gives, so a new room on either walk is seen in
review and the count the docs state stays true."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import trainwreck.harness
from trainwreck.rundir.layout import iter_events

REPO = Path(__file__).resolve().parents[1]
INSTALLED = Path(trainwreck.harness.__file__).resolve().parents[1]
"""Where the package's modules are (the checkout for an editable install)."""
USERS_SCRIPTS = "trainer/frameworks/examples/"
"""The example trainers stand for the user's script: on the walk, but not a room of ours."""


def walk(argv: list[str], tmp: Path) -> set[str]:
    out = tmp / "walk"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "walks"), os.environ.get("PYTHONPATH", "")]),
           "TRAINWRECK_WALK_REPO": str(INSTALLED), "TRAINWRECK_WALK_OUT": str(out),
           "TRAINWRECK_GOLDEN_CACHE": str(tmp / "golden"), "HF_HUB_OFFLINE": "1",
           # the user's command says `python`: the interpreter running the tests
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    done = subprocess.run([sys.executable, "-m", "trainwreck.harness.cli", "run", *argv, "--out", str(tmp / "run")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    fired = [e["fault_id"] for e in iter_events(tmp / "run", batches=False) if e["kind"] == "fault"]
    assert fired == ["k1"], "the walk is the fault's: it must have fired"
    modules: set[str] = set()
    for path in out.glob("walk-*.jsonl"):
        for line in path.read_text().splitlines():
            modules.update(m for m in json.loads(line)["modules"] if not m.startswith(USERS_SCRIPTS))
    return modules


def documented(name: str) -> set[str]:
    """The modules docs/HARNESS.md lists under "The walks", item `name`."""
    text = (REPO / "docs" / "HARNESS.md").read_text()
    section = text.split("## The walks", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in section.splitlines() if line.startswith(f"- **{name}**"))
    return set(re.findall(r"`([a-z_]+/[a-z_/]+\.py)`", line))


KILL = '[{"id": "k1", "kind": "kill", "rank": 1, "step": 5}]'


@pytest.mark.slow
def test_a_faults_walk_from_its_plan_to_its_verdict_crosses_the_modules_the_docs_list(tmp_path: Path) -> None:
    assert walk(["--plan", KILL], tmp_path) == documented("A fault")


@pytest.mark.slow
def test_a_cmd_jobs_walk_from_the_command_line_to_its_verdict_crosses_the_modules_the_docs_list(tmp_path: Path) -> None:
    from trainwreck.trainer.frameworks import EXAMPLES

    assert walk(["--cmd", f"python {EXAMPLES / 'plain_ddp.py'}", "--plan", KILL], tmp_path) == documented("A --cmd job")


def test_the_tracer_records_the_modules_on_the_stack_when_a_milestone_is_called(tmp_path: Path) -> None:
    (tmp_path / "faults").mkdir()
    (tmp_path / "faults" / "plan.py").write_text("def parse_plan():\n    return 1\n")
    (tmp_path / "caller.py").write_text("import sys\nsys.path.insert(0, '.')\nfrom faults.plan import parse_plan\n"
                                        "def outer():\n    return parse_plan()\nouter()\n")
    out = tmp_path / "walk"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests" / "walks"), "TRAINWRECK_WALK_REPO": str(tmp_path),
           "TRAINWRECK_WALK_OUT": str(out)}
    env.pop("TRAINWRECK_WALK_ROOT", None)
    subprocess.run([sys.executable, "caller.py"], cwd=tmp_path, env=env, check=True, timeout=60)
    records = [json.loads(line) for path in out.glob("walk-*.jsonl") for line in path.read_text().splitlines()]
    assert records == [{"at": "parse_plan", "modules": ["caller.py", "faults/plan.py"]}]
