"""A GPT trainer shaped like nanoGPT's (trainer/frameworks/examples/gpt_accum.py): no DataLoader,
random windows drawn with replacement inside the accumulation loop, tied embeddings, resumed
only by its `--init-from resume` flag. Real `trainwreck run --cmd` jobs, judged by the unchanged
invariants; each test asserts its fault fired and reads the run's own events."""
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

GPT = f"{sys.executable} {EXAMPLES / 'gpt_accum.py'} --init-from resume"
KILL = [{"id": "k1", "kind": "kill", "rank": 0, "step": 6}]


def killed_and_resumed(command: str, out: Path, golden_cache: Path, world_sizes: tuple[int, ...]) -> tuple[Any, list]:
    spec = JobSpec(target=Command(command), world_sizes=world_sizes, plan=KILL, hang_timeout_s=60.0, run_dir=out,
                   keep=True)
    judged = run_judged(spec, golden_cache=golden_cache)
    events = list(iter_events(judged.record.run_dir))
    assert [e["fault_id"] for e in events if e["kind"] == "fault"] == ["k1"]
    assert {(e["attempt"], e["step"]) for e in events if e["kind"] == "restore"} == {(1, 4)}
    return judged, events


@pytest.mark.slow  # nightly (30 s in the clean-clone run of 6040ce6): the zoo covers the pattern too
def test_micro_batches_drawn_inside_the_update_are_judged_across_a_two_to_one_world_size_change(
        tmp_path: Path, golden_cache: Path) -> None:
    """Killed at update 6 on 2 ranks, resumed from update 4's checkpoint on 1: each update's
    batch holds all 4 micro-batches (2 per rank, then 4 on the one rank: 8 windows either way),
    so the global batch never changed and continuity compares every lineage step with the
    golden run (digests on 2 ranks, losses on 1); coverage checks what sampling with
    replacement leaves to check and says what it cannot."""
    judged, events = killed_and_resumed(GPT, tmp_path / "run", golden_cache, (2, 1))
    sizes = {(e["attempt"], e["rank"], len(e["samples"])) for e in events if e["kind"] == "batch"}
    assert sizes == {(0, 0, 4), (0, 1, 4), (1, 0, 8)}, sizes
    judgement = judged.judgement
    assert judgement.valid is True, judgement.to_json()
    continuity = judgement.verdicts["continuity"]
    assert "global_batch_changed_at_step" not in continuity.counts, continuity
    assert continuity.counts["golden_steps_checked"] == 12, continuity.counts
    assert not any("global batch changed" in note for note in judgement.notes), judgement.notes
    coverage = judgement.verdicts["coverage"]
    assert coverage.summary.endswith("sampling with replacement: exactly-once not checked (an id may be drawn again)")
    assert coverage.counts["replayed_steps"] == 0


@pytest.mark.slow
def test_a_resume_that_reseeds_the_data_rng_replays_its_draws_and_coverage_says_so(
        tmp_path: Path, golden_cache: Path) -> None:
    """The planted bug: at resume the data RNG is seeded afresh instead of restored, so updates
    5-8 draw the windows updates 1-4 drew. Coverage finds the replay in the run's own batches."""
    judged, events = killed_and_resumed(f"{GPT} --reseed-data-on-resume", tmp_path / "run", golden_cache, (2, 2))
    batches = {(e["attempt"], e["rank"], e["step"]): e["samples"] for e in events if e["kind"] == "batch"}
    assert all(batches[(1, r, k + 4)] == batches[(0, r, k)] for r in range(2) for k in range(1, 5))
    coverage = judged.judgement.verdicts["coverage"]
    assert judged.judgement.valid is False and coverage.valid is False, coverage
    assert coverage.counts["replayed_steps"] >= 4, coverage.counts
    assert any(line.startswith("attempt 1 resumed at step 5 from ckpt.pt and replayed the draws of lineage steps 1-")
               for line in coverage.evidence), coverage.evidence


def diff_counts() -> tuple[list[str], int]:
    """(the added lines of the instrumented script against its uninstrumented copy, how many of
    them are only re-indented: the same text as a removed line)."""
    import difflib

    before = (Path(__file__).parent / "upstream" / "gpt_accum" / "gpt_accum.py").read_text().splitlines()
    after = (EXAMPLES / "gpt_accum.py").read_text().splitlines()
    diff = list(difflib.unified_diff(before, after, lineterm="", n=0))
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    removed = {line[1:].strip() for line in diff if line.startswith("-") and not line.startswith("---")}
    return added, sum(line.strip() in removed for line in added)


def test_the_gpt_scripts_diff_is_as_many_lines_as_the_docs_say_and_the_docs_show_it() -> None:
    root = Path(__file__).resolve().parents[2]
    docs, readme = (root / "docs" / "FRAMEWORKS.md").read_text(), (root / "docs" / "GUIDE.md").read_text()
    added, reindented = diff_counts()
    new = len(added) - reindented
    claim = f"{len(added)} added lines: {new} new or changed, {reindented} only re-indented"
    assert claim in docs, claim
    assert f"## A script without a DataLoader: nanoGPT's shape, {new} new lines and {reindented} re-indented" in docs
    assert f"took {len(added)} added lines, {new} new or changed and {reindented} only re-indented" in " ".join(readme.split())
    assert all(f"+{line}" in docs for line in added), [line for line in added if f"+{line}" not in docs]


OLD_CALLS = Path(__file__).parent / "old_calls_tutorial.py"


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [False, True], ids=["reruns-its-epoch", "resumes-after-it"])
def test_a_script_with_the_older_calls_is_judged_by_the_bytes_it_restored(
        tmp_path: Path, golden_cache: Path, fixed: bool) -> None:
    """The DDP tutorial instrumented with the calls documented before the helpers (no `path=`),
    snapshot.pt overwritten in place each epoch, rank 1 killed at update 7 (epoch 1). Each save
    and restore carries the content the probe located, so the restore is matched to the bytes of
    update 4's save: the tutorial's own bug (resume *at* the finished epoch, calling itself step
    0) puts both runs of epoch 0 in the lineage, and coverage says so, not only continuity; the
    fixed script resumes after epoch 0 and is valid."""
    command = f"{sys.executable} {OLD_CALLS}" + (" --fixed" if fixed else "")
    spec = JobSpec(target=Command(command), world_sizes=(2, 2), plan=[{"id": "k1", "kind": "kill", "rank": 1, "step": 7}],
                   hang_timeout_s=60.0, run_dir=tmp_path / "run", keep=True)
    judged = run_judged(spec, golden_cache=golden_cache)
    events = list(iter_events(judged.record.run_dir))
    assert [e["fault_id"] for e in events if e["kind"] == "fault"] == ["k1"]
    saves = {e["content"]: e["step"] for e in events if e["kind"] == "save" and e["attempt"] == 0}
    restores = {(e["step"], saves.get(e.get("content"))) for e in events if e["kind"] == "restore"}
    assert restores == {(4 if fixed else 0, 4)}, restores  # (what the script said, the save whose bytes it loaded)
    verdicts = judged.judgement.verdicts
    if fixed:
        assert judged.judgement.valid is True, judged.judgement.to_json()
    else:
        assert verdicts["coverage"].valid is False and verdicts["continuity"].valid is False
        assert verdicts["coverage"].summary.startswith("64 (epoch, id) pair(s) used twice within an epoch (epoch 0: 64)")
