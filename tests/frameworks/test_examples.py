"""Two public torchrun training scripts nobody here wrote (pytorch/examples), instrumented with
the probe's helpers in at most ten added lines each, judged under `trainwreck run --cmd`.

tests/frameworks/upstream/ holds each script as made to run on CPU/gloo (the "before"); the
package ships the instrumented one (trainer/frameworks/examples/, the "after"); docs/FRAMEWORKS.md
shows the diff between them."""
from __future__ import annotations

import difflib
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.judge.runner import run_judged
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.invariants.judge import judge
from trainwreck.invariants.loader import load_history
from trainwreck.invariants.verdict import UNKNOWN
from trainwreck.trainer.frameworks import EXAMPLES
from trainwreck.rundir.layout import iter_events

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


def cmd_spec(name: str, out: Path, plan: list[dict[str, Any]], script: Path | None = None) -> JobSpec:
    """`--cmd` of the example (or of `script`, a copy of it), 2 ranks in each of two attempts."""
    command = f"{sys.executable} {script}" if script else f"{sys.executable} {EXAMPLES / RUN[name]}"
    if script and name.startswith("ddp_tutorial"):
        command += " 4 1"
    return JobSpec(target=Command(command), world_sizes=(2, 2), plan=plan, hang_timeout_s=30.0, run_dir=out, keep=True)


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


@pytest.mark.slow  # nightly: moved out of the default run to keep it near 8 minutes (README, Tests)
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


@pytest.mark.slow
def test_the_mingpt_trainer_resumed_on_one_rank_restores_the_step_its_bytes_were_saved_at_and_is_valid(
        tmp_path: Path, golden_cache: Path) -> None:
    """docs/TRIALS.md, wrong 1: minGPT counts epochs, and one rank has twice the updates an epoch, so
    no step the script computes is right; the probe takes the step of the save that wrote the bytes."""
    spec = JobSpec(target=Command(f"{sys.executable} {EXAMPLES / RUN['mingpt/trainer.py']}"), world_sizes=(2, 1),
                   plan=[{"id": "k1", "kind": "kill", "rank": 0, "step": 9}], hang_timeout_s=30.0,
                   run_dir=tmp_path / "run", keep=True)
    judged = run_judged(spec, golden_cache=golden_cache)
    events = list(iter_events(judged.record.run_dir))
    assert [e["fault_id"] for e in events if e["kind"] == "fault"] == ["k1"]
    (save,) = [e for e in events if e["kind"] == "save" and e["attempt"] == 0]
    (restore,) = [e for e in events if e["kind"] == "restore"]
    assert (restore["step"], restore["content"], restore["world_size"]) == (save["step"], save["content"], 1)
    assert judged.judgement.verdicts["continuity"].valid is not False, judged.judgement.to_json()
    assert judged.judgement.verdicts["coverage"].valid is True


TUTORIAL = "ddp_tutorial/multigpu_torchrun.py"


@pytest.mark.slow  # the hang is declared after 30 s without progress: 101 s with its golden run (load 8-10)
@pytest.mark.parametrize("name", sorted(RUN))
def test_a_hang_in_each_public_script_names_the_hung_rank_alone_with_its_stack(
        tmp_path: Path, golden_cache: Path, name: str) -> None:
    plan = [{"id": "h1", "kind": "hang", "rank": 1, "step": 5, "expect": "hang"}]
    judged = run_judged(cmd_spec(name, tmp_path / "run", plan), golden_cache=golden_cache)
    run_dir = judged.record.run_dir
    events = list(iter_events(run_dir))
    assert [e["fault_id"] for e in events if e["kind"] == "fault"] == ["h1"]
    (hang,) = [e for e in events if e["kind"] == "hang"]
    assert hang["ranks"] == [1] and hang["waiting"] == [0], hang  # one suspect, the other rank waiting on it
    (stack,) = [path for path in hang["stacks"] if "-r001-" in path]
    dump = (run_dir / stack).read_text()
    assert Path(name).name in dump and "_run_epoch" in dump, dump[-2000:]  # the script's own frames
    assert judged.judgement.verdicts["hang"].valid is True, judged.judgement.to_json()


@pytest.mark.slow  # a two-attempt run after the golden run: 22 s with the golden run cached (load 8-10)
def test_a_corrupted_newest_snapshot_of_the_ddp_tutorial_is_reported_as_its_failure_with_the_fault_event(
        tmp_path: Path, golden_cache: Path) -> None:
    """The script loads snapshot.pt without any check: flipped bytes that still unpickle are trained
    on. The run is INVALID, and atomicity names the fault that damaged the file it never rejected."""
    plan = [{"id": "k1", "kind": "signal", "signal": "SIGKILL", "rank": 1, "step": 10},
            {"id": "c1", "kind": "corrupt", "how": "flip", "attempt": 1}]
    judged = run_judged(cmd_spec(TUTORIAL, tmp_path / "run", plan), golden_cache=golden_cache)
    events = list(iter_events(judged.record.run_dir))
    faults = {e["fault_id"]: e for e in events if e["kind"] == "fault"}
    assert set(faults) == {"k1", "c1"} and "snapshot.pt" in faults["c1"]["detail"], faults
    restores = [e for e in events if e["kind"] == "restore" and e["attempt"] == 1]
    rejected = [e for e in events if e["kind"] == "reject" and e.get("attempt") == 1]
    if rejected:  # a script that checked its file would have rejected it and started afresh: VALID
        assert judged.judgement.valid is True and not restores, judged.judgement.to_json()
        return
    assert restores and judged.judgement.valid is False, judged.judgement.to_json()
    atomicity = judged.judgement.verdicts["atomicity"]
    assert atomicity.valid is False
    assert any("damaged by fault 'c1'" in line and "never rejected" in line for line in atomicity.evidence), atomicity.evidence


@pytest.mark.slow  # its own golden run, the repeat of its first steps (the point) and the run: 30 s (load 8-10)
def test_an_unseeded_copy_of_the_ddp_tutorial_is_judged_unknown_not_deterministic(tmp_path: Path, golden_cache: Path) -> None:
    copy = tmp_path / "ddp_tutorial"
    shutil.copytree(EXAMPLES / "ddp_tutorial", copy, ignore=shutil.ignore_patterns("__pycache__"))
    script = copy / "multigpu_torchrun.py"
    text = script.read_text()
    assert "Probe.from_env(seed=0)" in text
    script.write_text(text.replace("Probe.from_env(seed=0)", "Probe.from_env()"))  # its dataset is torch.rand
    judged = run_judged(cmd_spec(TUTORIAL, tmp_path / "run", [], script=script), golden_cache=golden_cache)
    judgement = judged.judgement
    assert judgement.valid == UNKNOWN and judged.exit_code == 2, judgement.to_json()
    summary = judgement.verdicts["continuity"].summary
    assert summary.startswith("the script is not deterministic (step 1 digest "), summary
    assert "seed it: call probe.seed(...)" in summary
    steps = {e["step"] for e in iter_events(judged.record.run_dir) if e["kind"] == "step"}
    assert steps == set(range(1, 17))  # it did run to the end: unknown is about the script, not the run
