"""A user's own pytest suite: docs/TESTING.md's example test file, copied as it is into an
empty directory outside this repository beside a training script, run with `pytest -n 2`.

It must pass on a correct script and fail, with the trainwreck section, on a broken one.
The JudgedRun surface the example relies on (`.valid`, `.verdicts`, `.fired`,
`.assert_valid()`) is checked on hand-made judgements, quickly."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainwreck.harness.supervise.supervisor import RunRecord
from trainwreck.harness.judge.runner import JudgedRun
from trainwreck.invariants import Judgement
from trainwreck.invariants.verdict import Verdict
from trainwreck.trainer.frameworks import EXAMPLES

DOC = Path(__file__).parents[2] / "docs" / "TESTING.md"
SCRIPT = EXAMPLES / "plain_ddp.py"
RESTORES_OPTIMIZER = 'model.load_state_dict(state["model"]), opt.load_state_dict(state["opt"])'


def documented_example() -> str:
    """The first python block of docs/TESTING.md: the complete example file."""
    match = re.search(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert match is not None, "docs/TESTING.md lost its example test file"
    return match.group(1)


def documented_copy_command() -> str:
    """The docs' one command that puts a working train.py beside the example test file."""
    match = re.search(r"```sh\n(python -c .*?train\.py.*?)\n```", DOC.read_text(), re.DOTALL)
    assert match is not None, "docs/TESTING.md names no command that gives the user a train.py"
    return match.group(1)


def test_the_documented_command_copies_the_installed_example_as_train_py(tmp_path: Path) -> None:
    # The docs' `python` is the user's environment's: this interpreter's, whatever PATH says.
    command = documented_copy_command().replace("python", shlex.quote(sys.executable), 1)
    subprocess.run(command, shell=True, cwd=tmp_path, check=True, timeout=120)
    assert (tmp_path / "train.py").read_bytes() == SCRIPT.read_bytes()


def user_repository(root: Path, script: str) -> Path:
    root.mkdir()
    (root / "train.py").write_text(script)
    (root / "test_training.py").write_text(documented_example())
    return root


def run_users_pytest(root: Path, golden_cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINWRECK_GOLDEN_CACHE": str(golden_cache)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "-rN"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_documented_example_file_passes_on_a_correct_script_and_fails_with_the_section_on_a_broken_one(
        tmp_path: Path) -> None:
    assert not tmp_path.resolve().is_relative_to(Path(__file__).parents[2].resolve())
    good = run_users_pytest(user_repository(tmp_path / "good", SCRIPT.read_text()), tmp_path / "golden")
    assert good.returncode == 0, good.stdout[-4000:] + good.stderr[-2000:]
    assert "3 passed" in good.stdout
    source = SCRIPT.read_text()
    assert RESTORES_OPTIMIZER in source
    broken = source.replace(RESTORES_OPTIMIZER, 'model.load_state_dict(state["model"])')  # forgets AdamW's moments
    bad = run_users_pytest(user_repository(tmp_path / "bad", broken), tmp_path / "golden")
    assert bad.returncode == 1, bad.stdout[-4000:] + bad.stderr[-2000:]
    assert "1 passed" in bad.stdout and "2 failed" in bad.stdout, bad.stdout[-4000:]
    assert re.search(r"-+ trainwreck -+", bad.stdout), bad.stdout[-4000:]
    assert "overall: INVALID" in bad.stdout and "INVALID  continuity" in bad.stdout
    assert "reproduce: trainwreck run --cmd" in bad.stdout and "run directory: " in bad.stdout
    kept = re.findall(r"run directory: (\S+)", bad.stdout)
    assert kept and all(Path(p).is_dir() for p in kept)  # failed tests keep their runs
    shutil.rmtree(tmp_path / "golden", ignore_errors=True)


def judged_run(tmp_path: Path, valid: object) -> JudgedRun:
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "events" / "harness.jsonl").write_text(
        '{"kind": "fault", "t": 1.0, "fault_id": "k1", "rank": 1}\n{"kind": "fault", "t": 2.0, "fault_id": "k1"}\n')
    verdict = Verdict("continuity", valid, "1 discontinuity: lineage step 7 left the golden run", {},
                      ["lineage step 7 (attempt 1): digest a != golden b"])
    record = RunRecord(run_dir=run_dir, status="completed", outcome="completed", attempts=2, final_step=12,
                       hangs=0, wall_s=1.0)
    return JudgedRun(record, Judgement(valid, {"continuity": verdict}, [], []), tmp_path / "golden",
                     "trainwreck run --cmd 'python train.py'")


def test_a_judged_run_answers_valid_verdicts_and_fired_directly(tmp_path: Path) -> None:
    judged = judged_run(tmp_path, True)
    assert judged.valid is True and judged.verdicts["continuity"].valid is True
    assert judged.fired == ["k1"]  # from the run's own fault events, once each
    judged.assert_valid()


def test_assert_valid_on_an_invalid_run_raises_with_the_failure_section(tmp_path: Path) -> None:
    judged = judged_run(tmp_path, False)
    with pytest.raises(AssertionError) as raised:
        judged.assert_valid()
    text = str(raised.value)
    assert text.startswith("trainwreck judged the run INVALID\noverall: INVALID (completed after 2 attempt(s))")
    assert "lineage step 7 (attempt 1): digest a != golden b" in text
    assert f"run directory: {tmp_path / 'run'}" in text
    assert text.endswith("reproduce: trainwreck run --cmd 'python train.py'")
