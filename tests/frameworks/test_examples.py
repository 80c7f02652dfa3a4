"""Two public torchrun training scripts nobody here wrote (pytorch/examples), instrumented with
the probe's helpers in at most ten added lines each, judged under `trainwreck run --cmd`.

tests/frameworks/upstream/ holds each script as made to run on CPU/gloo (the "before"); the
package ships the instrumented one (trainer/frameworks/examples/, the "after"); docs/FRAMEWORKS.md
shows the diff between them."""
from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.supervise.cmd import Command
from trainwreck.harness.judge.runner import run_judged
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.invariants.judge import judge
from trainwreck.invariants.loader import load_history
from trainwreck.trainer.frameworks import EXAMPLES
from trainwreck.trainer.rundir import iter_events

UPSTREAM = Path(__file__).parent / "upstream"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "FRAMEWORKS.md"
# the instrumented file of each example -> what `--cmd` runs
RUN = {"ddp_tutorial/multigpu_torchrun.py": "ddp_tutorial/multigpu_torchrun.py 4 1", "mingpt/trainer.py": "mingpt/main.py"}


def added_lines(name: str) -> list[str]:
    before = (UPSTREAM / name).read_text().splitlines()
    after = (EXAMPLES / name).read_text().splitlines()
    return [line[1:] for line in difflib.unified_diff(before, after, lineterm="", n=0)
            if line.startswith("+") and not line.startswith("+++")]


@pytest.mark.parametrize("name", sorted(RUN))
def test_each_public_script_takes_at_most_ten_added_lines_and_the_docs_show_every_one(name: str) -> None:
    added = added_lines(name)
    assert 0 < len(added) <= 10, added
    docs = DOCS.read_text()
    assert all(f"+{line}" in docs for line in added), [line for line in added if f"+{line}" not in docs]


def cmd_spec(name: str, out: Path, plan: list[dict[str, Any]]) -> JobSpec:
    return JobSpec(target=Command(f"{sys.executable} {EXAMPLES / RUN[name]}"), world_sizes=(2, 2), plan=plan,
                   hang_timeout_s=30.0, run_dir=out, keep=True)


def crash_after_first_save(name: str, out: Path, golden_cache: Path, step: int) -> tuple[Any, list[dict[str, Any]]]:
    """Rank 0 (the saver) killed at the start of update `step`, right after the save of update step-1."""
    plan = [{"id": "k1", "kind": "kill", "rank": 0, "step": step}]
    judged = run_judged(cmd_spec(name, out, plan), golden_cache=golden_cache)
    assert judged.golden_dir.name, judged.judgement.notes  # the golden run itself completed
    golden = judge(load_history(judged.golden_dir), None)
    assert golden.valid is True, golden.to_json()  # the uninterrupted run is itself valid
    events = list(iter_events(judged.record.run_dir))
    assert [e["fault_id"] for e in events if e["kind"] == "fault"] == ["k1"]
    (save,) = [e for e in events if e["kind"] == "save" and e["attempt"] == 0]
    assert save["step"] == step - 1 and save["checkpoint"].endswith("snapshot.pt") and len(save["content"]) == 64
    return judged, events


def test_the_ddp_tutorial_script_replays_its_saved_epoch_after_a_crash_right_after_the_save_and_is_invalid(
        tmp_path: Path, golden_cache: Path) -> None:
    """multigpu_torchrun.py saves EPOCHS_RUN=epoch after finishing that epoch and resumes at it: it
    trains epoch 0 again on the weights that already learned it."""
    judged, events = crash_after_first_save("ddp_tutorial/multigpu_torchrun.py", tmp_path / "run", golden_cache, 5)
    restores = [e for e in events if e["kind"] == "restore"]
    assert {(e["step"], e["content"]) for e in restores} == {(0, next(e["content"] for e in events if e["kind"] == "save"))}
    assert judged.judgement.valid is False and judged.judgement.verdicts["continuity"].valid is False


@pytest.mark.slow
def test_the_mingpt_trainer_resumes_right_after_its_save_and_is_judged_valid(tmp_path: Path, golden_cache: Path) -> None:
    judged, events = crash_after_first_save("mingpt/trainer.py", tmp_path / "run", golden_cache, 9)
    restores = [e for e in events if e["kind"] == "restore"]
    assert sorted((e["rank"], e["step"]) for e in restores) == [(0, 8), (1, 8)]
    assert judged.judgement.valid is True, judged.judgement.to_json()
