"""A DDP model with BatchNorm, as people write it (trainer/frameworks/examples/batchnorm_ddp.py),
judged under `trainwreck run --cmd`: no false alarm on running statistics that differ between
ranks by design, on evaluation between the update and the save, on every rank writing one
checkpoint path; a planted bug (no gradient sync) still caught, naming the parameters."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.judge.runner import run_judged
from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.trainer.frameworks import EXAMPLES
from trainwreck.rundir.layout import iter_events

SCRIPT = EXAMPLES / "batchnorm_ddp.py"
KILL = {"id": "k1", "kind": "kill", "rank": 1, "step": 8}
"""Rank 1 killed at update 8's start: the run resumes from the save after update 6."""


def judged(out: Path, golden_cache: Path, plan: list[dict[str, Any]], *flags: str) -> tuple[Any, list[dict[str, Any]]]:
    command = " ".join([sys.executable, str(SCRIPT), *flags])
    spec = JobSpec(target=Command(command), world_sizes=(2,), plan=plan, hang_timeout_s=30.0, run_dir=out, keep=True)
    run = run_judged(spec, golden_cache=golden_cache)
    return run, list(iter_events(run.record.run_dir))


def of(events: list[dict[str, Any]], kind: str, **fields: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in fields.items())]


def assert_resumed_from_step_6(run: Any, events: list[dict[str, Any]]) -> None:
    assert [e["fault_id"] for e in of(events, "fault")] == ["k1"]
    restores = of(events, "restore", attempt=1)
    assert sorted((e["rank"], e["step"]) for e in restores) == [(0, 6), (1, 6)]
    assert all(e["buffers"] for e in restores)  # the running statistics were restored and compared
    assert run.judgement.valid is True, run.judgement.to_json()
    assert run.judgement.verdicts["continuity"].counts["restores_checked"] == 2


@pytest.mark.slow  # nightly (30 s in the clean-clone run of 6040ce6): the zoo covers the pattern too
def test_a_ddp_batchnorm_model_is_valid_golden_and_after_a_kill_and_resume(tmp_path: Path, golden_cache: Path) -> None:
    run, events = judged(tmp_path / "run", golden_cache, [KILL])
    golden = list(iter_events(run.golden_dir))
    steps = of(golden, "step", step=6)
    # The statistics differ between the ranks (each its own batch) while the digests agree.
    assert len({e["digest"] for e in steps}) == 1 and len({e["buffers"] for e in steps}) == 2
    assert run.judgement.verdicts["replicas"].valid is True
    assert_resumed_from_step_6(run, events)


@pytest.mark.slow
def test_the_same_model_without_gradient_sync_is_invalid_on_replicas_naming_the_parameters(
        tmp_path: Path, golden_cache: Path) -> None:
    from trainwreck.invariants import load_history
    from trainwreck.invariants.replicas import check_replicas

    run, _ = judged(tmp_path / "run", golden_cache, [KILL], "--no-sync")
    verdict = check_replicas(load_history(run.golden_dir))
    assert verdict.valid is False
    assert verdict.evidence[0].startswith("attempt 0 step 1: parameters or optimizer state differ: rank(s) 0 digest "), \
        verdict.evidence
    assert run.judgement.verdicts["replicas"].valid is False


EVERY_RANK = ("--eval-every-save", "--every-rank-saves")
"""Every rank writes one path, after an evaluation: its forward broadcast rank 0's statistics, so
every rank writes the same bytes (ranks writing different bytes to one path can leave a mix of
them that no rank wrote: rightly never committed)."""


@pytest.mark.slow
def test_evaluation_between_the_update_and_the_save_then_a_resume_is_valid(tmp_path: Path, golden_cache: Path) -> None:
    run, events = judged(tmp_path / "run", golden_cache, [KILL], "--eval-every-save")
    (save,) = of(events, "save", attempt=0, step=6)
    assert save["digest"] == of(events, "step", attempt=0, step=6, rank=0)[0]["digest"]
    assert_resumed_from_step_6(run, events)


@pytest.mark.slow
def test_every_rank_saving_one_path_reports_the_state_each_wrote_and_resumes_valid(
        tmp_path: Path, golden_cache: Path) -> None:
    run, events = judged(tmp_path / "run", golden_cache, [KILL], *EVERY_RANK)
    saves = {e["rank"]: e for e in of(events, "save", attempt=0, step=6)}
    # The evaluation broadcast rank 0's statistics: rank 1 saved those, not its update's.
    step = of(events, "step", attempt=0, step=6, rank=1)[0]
    assert saves[1]["buffers"] == saves[0]["buffers"] != step["buffers"] and saves[1]["digest"] == step["digest"]
    assert saves[0]["content"] == saves[1]["content"] == of(events, "restore", attempt=1)[0]["content"]
    assert_resumed_from_step_6(run, events)


@pytest.mark.slow
def test_a_file_torn_by_a_rank_killed_inside_its_save_is_never_recorded_as_committed(
        tmp_path: Path, golden_cache: Path) -> None:
    tear = {"id": "tear", "kind": "foreign_crash", "rank": 0, "step": 6, "op_index": 0, "when": "torn"}
    run, events = judged(tmp_path / "run", golden_cache, [tear], *EVERY_RANK)
    (fault,) = of(events, "fault")
    assert fault["fault_id"] == "tear" and fault["detail"].startswith("tore op 0 torch.save(ckpt.pt)"), fault
    committed = {e["content"] for e in of(events, "save")}
    looked = of(events, "reject", attempt=1) + of(events, "restore", attempt=1)
    assert looked, events
    for e in looked:  # what attempt 1 found on disk: torn (rejected, never committed) or whole (a commit)
        assert (e["content"] in committed) == (e["kind"] == "restore"), e
    assert "never committed" not in run.judgement.verdicts["atomicity"].summary


@pytest.mark.slow
def test_a_planned_corrupt_fault_is_named_and_the_restore_is_checked(tmp_path: Path, golden_cache: Path) -> None:
    """The script loads its one file without a checksum: the flipped bytes load, and the verdict
    says whose fault they were (docs/FRAMEWORKS.md), not that nobody committed them."""
    c1 = {"id": "c1", "kind": "corrupt", "how": "flip", "attempt": 1}
    run, events = judged(tmp_path / "run", golden_cache, [KILL, c1])
    assert sorted(e["fault_id"] for e in of(events, "fault")) == ["c1", "k1"]
    atomicity = run.judgement.verdicts["atomicity"]
    assert atomicity.valid is False and "which fault 'c1' had damaged" in atomicity.summary, atomicity.to_json()
    assert run.judgement.verdicts["continuity"].counts["restores_checked"] == 2
