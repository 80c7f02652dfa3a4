"""Issue 33's trials: two public scripts the project had never seen, made to run on CPU and
instrumented from the docs alone (tests/frameworks/trials/, docs/TRIALS.md): karpathy/nanoGPT's
train.py and pytorch/examples' imagenet/main.py training a ResNet-18. Each runs through the six
cases of docs/TRIALS.md as a real `--cmd` job; every test asserts that its planned faults fired
(the run's own `fault` events), what the run's own events show, and the verdict established
independently of trainwreck from those events, the checkpoints and the script's code."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from trainwreck.harness.judge.runner import run_judged
from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.rundir.layout import iter_events

pytestmark = pytest.mark.slow  # twelve --cmd jobs of 20-90 s each (docs/TRIALS.md)

TRIALS = Path(__file__).parent / "trials"
NANOGPT = (f"{sys.executable} {TRIALS / 'nanogpt' / 'train.py'} {TRIALS / 'nanogpt' / 'trial_config.py'}"
           " --init_from=resume")
RESNET = (f"{sys.executable} {TRIALS / 'imagenet_resnet18' / 'main.py'} --dummy --dist-url env:// --dist-backend gloo"
          " -j 0 -b 8 --epochs 3 --lr 0.05 --seed 0 --resume checkpoint.pth.tar")
KILL_NANOGPT = {"id": "k1", "kind": "kill", "rank": 0, "step": 6}     # after the save of update 4
KILL_RESNET = {"id": "k1", "kind": "kill", "rank": 1, "step": 6}      # after the save of epoch 1 (update 4)
TORN_SAVE = {"id": "s1", "kind": "foreign_crash", "rank": 0, "step": 8, "op_index": 0, "when": "torn"}
CORRUPT = [{"id": "k1", "kind": "kill", "rank": 1, "step": 10}, {"id": "c1", "kind": "corrupt", "how": "flip"}]
HANG = {"id": "h1", "kind": "hang", "rank": 1, "step": 6, "expect": "hang"}


def run(command: str, out: Path, golden_cache: Path, plan: list[dict[str, Any]],
        world_sizes: tuple[int, ...] = (2, 2)) -> tuple[Any, list[dict[str, Any]]]:
    spec = JobSpec(target=Command(command), world_sizes=world_sizes, plan=plan, hang_timeout_s=20.0, run_dir=out,
                   keep=True)
    judged = run_judged(spec, golden_cache=golden_cache)
    events = list(iter_events(judged.record.run_dir))
    assert sorted(e["fault_id"] for e in events if e["kind"] == "fault") == sorted(f["id"] for f in plan)
    return judged, events


def of(events: list[dict[str, Any]], kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def batches(events: list[dict[str, Any]]) -> dict[tuple[int, int, int], list[int]]:
    return {(e["attempt"], e["rank"], e["step"]): e["samples"] for e in of(events, "batch")}


def exact_restores(events: list[dict[str, Any]], step: int) -> None:
    """Every rank of attempt 1 restored the bytes saved at `step`, and its state equals the saved one."""
    (save,) = {(e["content"], e["digest"]) for e in of(events, "save", attempt=0, step=step)}
    restores = of(events, "restore", attempt=1)
    assert restores and {(e["step"], e["content"], e["digest"]) for e in restores} == {(step, *save)}, restores


# nanoGPT: it reseeds torch's global RNG (1337 + rank) at every start and never saves it, so a
# resumed attempt draws the windows its first updates drew.

def test_nanogpt_uninterrupted_is_valid_with_equal_digests_on_both_ranks(tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(NANOGPT, tmp_path / "run", golden_cache, [], (2,))
    steps = {(e["rank"], e["step"]): e["digest"] for e in of(events, "step")}
    assert sorted(steps) == [(r, s) for r in range(2) for s in range(1, 13)]
    assert all(steps[(0, s)] == steps[(1, s)] for s in range(1, 13))
    assert judged.judgement.valid is True, judged.judgement.to_json()


def test_nanogpt_killed_after_a_save_restores_it_exactly_then_replays_its_first_draws_and_is_invalid(
        tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(NANOGPT, tmp_path / "run", golden_cache, [KILL_NANOGPT])
    exact_restores(events, 4)
    b = batches(events)
    assert all(b[(1, r, k + 4)] == b[(0, r, k)] for r in range(2) for k in range(1, 5))  # updates 5-8 = 1-4
    coverage = judged.judgement.verdicts["coverage"]
    assert judged.judgement.valid is False and coverage.valid is False and coverage.counts["replayed_steps"] == 4
    assert any("replayed the draws of lineage steps 1-4" in line for line in coverage.evidence), coverage.evidence


def test_nanogpt_torn_inside_its_in_place_save_leaves_no_checkpoint_to_resume_and_is_invalid(
        tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(NANOGPT, tmp_path / "run", golden_cache, [TORN_SAVE], (2, 2, 2))
    assert "torch.save(ckpt.pt)" in of(events, "fault")[0]["detail"]
    assert not of(events, "restore") and not of(events, "step", attempt=1)  # ckpt.pt was its only checkpoint
    assert judged.judgement.valid is False and judged.judgement.verdicts["progress"].valid is False


def test_nanogpt_loads_a_flipped_checkpoint_unchecked_and_the_fault_is_named(tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(NANOGPT, tmp_path / "run", golden_cache, CORRUPT, (2, 2, 2))
    (saved,) = {e["digest"] for e in of(events, "save", attempt=0, step=8)}
    assert {e["step"] for e in of(events, "restore", attempt=1)} == {8} and not of(events, "reject")
    assert {e["digest"] for e in of(events, "restore", attempt=1)} != {saved}  # the flip reached the state
    continuity = judged.judgement.verdicts["continuity"]
    assert judged.judgement.valid is False and continuity.valid is False
    assert any("fault 'c1'" in line for line in continuity.evidence), continuity.evidence


def test_nanogpt_hung_rank_is_named_alone_with_the_other_rank_waiting(tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(NANOGPT, tmp_path / "run", golden_cache, [HANG])
    (hang,) = of(events, "hang")
    assert 1 in hang["ranks"] and judged.judgement.verdicts["hang"].valid is True
    assert judged.judgement.valid is False  # the restart from update 4 replays the draws, as when killed
    assert (hang["ranks"], hang["waiting"]) == ([1], [0]), hang


def test_nanogpt_resumed_on_one_rank_keeps_its_global_batch_but_redraws_rank_0s_windows_and_is_invalid(
        tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(NANOGPT, tmp_path / "run", golden_cache, [KILL_NANOGPT], (2, 1))
    exact_restores(events, 4)
    b = batches(events)
    assert all(len(b[(1, 0, s)]) == 8 for s in range(5, 13))  # 4 micro-batches of 2 windows on one rank
    assert set(b[(1, 0, 5)]) == set(b[(0, 0, 1)] + b[(0, 0, 2)])  # rank 0's seed, drawn again from the start
    assert judged.judgement.valid is False and judged.judgement.verdicts["coverage"].valid is False


# imagenet/main.py: every rank saves checkpoint.pth.tar (torchrun mode) with model, optimizer,
# scheduler and the next epoch, and resumes at that epoch: an exact resume at an epoch boundary.

def test_resnet18_uninterrupted_is_valid_with_a_save_after_each_epoch(tmp_path: Path, golden_cache: Path) -> None:
    """Both ranks write the one file; which rank reports whole bytes is a race (docs/TRIALS.md)."""
    judged, events = run(RESNET, tmp_path / "run", golden_cache, [], (2,))
    assert {e["step"] for e in of(events, "save")} == {4, 8, 12}
    assert judged.judgement.valid is True, judged.judgement.to_json()


def test_resnet18_killed_mid_epoch_resumes_at_its_saved_epoch_bit_identical_and_is_valid(
        tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(RESNET, tmp_path / "run", golden_cache, [KILL_RESNET])
    exact_restores(events, 4)
    assert judged.judgement.valid is True, judged.judgement.to_json()


def test_resnet18_torn_inside_the_save_both_ranks_write_leaves_no_checkpoint_to_resume_and_is_invalid(
        tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(RESNET, tmp_path / "run", golden_cache, [TORN_SAVE], (2, 2, 2))
    assert "torch.save(checkpoint.pth.tar)" in of(events, "fault")[0]["detail"]
    assert not of(events, "restore") and not of(events, "step", attempt=1)  # the file was overwritten in place
    assert judged.root_cause is not None and "PytorchStreamReader" in judged.root_cause.to_json()["line"]
    assert judged.judgement.valid is False and judged.judgement.verdicts["progress"].valid is False


def test_resnet18_loads_a_flipped_checkpoint_unchecked_and_the_fault_is_named(tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(RESNET, tmp_path / "run", golden_cache, CORRUPT, (2, 2, 2))
    saved = {e["digest"] for e in of(events, "save", attempt=0, step=8)}
    restored = {e["digest"] for e in of(events, "restore", attempt=1)}
    assert len(saved) == 1 and len(restored) == 1 and restored != saved and not of(events, "reject")
    continuity = judged.judgement.verdicts["continuity"]
    assert judged.judgement.valid is False and continuity.valid is False and judged.judgement.verdicts["atomicity"].valid is False
    assert any("fault 'c1'" in line for line in continuity.evidence), continuity.evidence


def test_resnet18_hung_rank_is_named_alone_and_the_restart_resumes_bit_identical(
        tmp_path: Path, golden_cache: Path) -> None:
    judged, events = run(RESNET, tmp_path / "run", golden_cache, [HANG])
    (hang,) = of(events, "hang")
    assert (hang["ranks"], hang["waiting"], hang["last_step"]) == ([1], [0], 6), hang
    exact_restores(events, 4)
    assert judged.judgement.valid is True, judged.judgement.to_json()


def test_resnet18_cannot_load_its_ddp_checkpoint_on_one_rank_and_is_invalid(tmp_path: Path, golden_cache: Path) -> None:
    """On one rank main.py is not distributed: the model is not wrapped, and the saved keys carry
    DDP's `module.` prefix."""
    judged, events = run(RESNET, tmp_path / "run", golden_cache, [KILL_RESNET], (2, 1))
    assert not of(events, "restore") and {e["code"] for e in of(events, "exit", attempt=1)} == {1}
    assert judged.root_cause is not None and "loading state_dict" in judged.root_cause.to_json()["line"]
    assert judged.judgement.valid is False and judged.judgement.verdicts["progress"].valid is False
