"""Judging a user's command right, without running one: the corruption target taken from the
run's own `save` events, and a corruption that finds nothing to damage judged "unknown"
with the reason (never invalid). Hand-built run directories, so these are quick."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.invariants.histories import HistoryBuilder

from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.supervise.command.facts import judge_across_batch_change
from trainwreck.faults.between_attempts import UNAPPLIED, corrupt_before
from trainwreck.invariants import load_history
from trainwreck.invariants.verdict import UNKNOWN
from trainwreck.rundir.layout import iter_events
from trainwreck.trainer.frameworks import EXAMPLES

CORRUPT = {"id": "c1", "kind": "corrupt", "how": "flip", "attempt": 1}


def killed_after_two_snapshots(run_dir: Path, name: str = "snapshot.pt") -> HistoryBuilder:
    """Attempt 0 overwrites one checkpoint file after updates 4 and 8, then rank 1 is killed."""
    b = HistoryBuilder(run_dir, total_steps=12, faults=[CORRUPT], world_sizes=[2])
    att = b.attempt(2)
    for step in (4, 8):
        att.train(step)
        att.save(step, name=name, content=f"sha-{step}")
    att.train(9).crash(1)
    b.spec["world_sizes"] = [2, 2]
    b.write()
    return b


def test_a_corrupt_fault_damages_the_newest_committed_checkpoint_whatever_its_name(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    killed_after_two_snapshots(run_dir)
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir()
    (ckpt / "snapshot.pt").write_bytes(b"x" * 64)
    (ckpt / "old-000099.pt").write_bytes(b"y" * 64)  # a step number in its name, but no save announced it
    corrupt_before(run_dir, "checkpoints", [CORRUPT], 1)
    faults = [e for e in iter_events(run_dir) if e["kind"] == "fault"]
    assert [(f["fault_id"], f["checkpoint"], f["attempt"]) for f in faults] == [("c1", "snapshot.pt", 1)]
    assert (ckpt / "snapshot.pt").read_bytes() != b"x" * 64
    assert (ckpt / "old-000099.pt").read_bytes() == b"y" * 64
    assert not (run_dir / UNAPPLIED).exists()


def test_a_corrupt_fault_that_finds_no_checkpoint_makes_the_run_unknown_with_the_reason(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    b = killed_after_two_snapshots(run_dir)
    # The snapshot lives outside the run directory: nothing the harness may damage.
    corrupt_before(run_dir, "checkpoints", [CORRUPT], 1)
    assert not [e for e in iter_events(run_dir) if e["kind"] == "fault"]
    # The next attempt even replays data (an invalid run): the fault never fired, so the run
    # tested nothing the plan meant, and it is "unknown" (exit 2), not invalid.
    att = b.attempt(2, restore="snapshot.pt", restore_step=4, restore_content="sha-8")
    att.train(12)
    b.end()
    b.write()
    judgement = Command('python train.py').judge(run_dir, None)
    assert judgement.valid == UNKNOWN, judgement.to_json()
    assert judgement.verdicts["coverage"].valid is False
    reason = judgement.notes[0]
    assert reason.startswith("fault c1 found no checkpoint to damage before attempt 1: the newest committed "
                             "checkpoint 'snapshot.pt' (step 8, attempt 0) is not under"), reason
    line = json.loads((run_dir / UNAPPLIED).read_text())
    assert line["fault_id"] == "c1" and line["attempt"] == 1


def test_a_command_that_dies_before_its_probe_names_its_own_exception_and_log(tmp_path: Path,
                                                                               golden_cache: Path) -> None:
    import sys

    from trainwreck.harness.judge.runner import run_judged
    from trainwreck.harness.supervise.spec import JobSpec

    script = tmp_path / "train.py"
    script.write_text("raise ValueError('config error: --lr must be positive, got -3')\n")
    spec = JobSpec(target=Command(f"{sys.executable} {script}"), world_sizes=(2,), hang_timeout_s=30.0,
                   run_dir=tmp_path / "run", keep=True)
    judged = run_judged(spec, golden_cache=golden_cache)
    assert judged.valid == UNKNOWN and judged.exit_code == 2
    mine = judged.judgement.notes[-1]  # the golden run's failure first, then this run's own
    assert "ValueError: config error: --lr must be positive, got -3 (logs/a000-r000.log)" in mine, mine
    assert "Probe.from_env" not in mine
    assert judged.root_cause is not None
    assert judged.root_cause.to_json()["line"] == "ValueError: config error: --lr must be positive, got -3"
    # Both ranks raise it; whose traceback lands first is a race, and the harness stops the other.
    assert judged.root_cause.to_json()["log"] in ("logs/a000-r000.log", "logs/a000-r001.log")


SEEDED = "torch.manual_seed(0)\n"


@pytest.mark.slow
def test_an_unseeded_script_is_judged_unknown_not_deterministic_and_a_seeded_one_valid(
        tmp_path: Path) -> None:
    import sys

    from trainwreck.harness.judge.runner import run_judged
    from trainwreck.harness.supervise.command.repeat import REPEAT_FILE
    from trainwreck.harness.supervise.spec import JobSpec

    source = (EXAMPLES / "plain_ddp.py").read_text()
    assert SEEDED in source
    verdicts = {}
    for name, text in (("seeded", source), ("unseeded", source.replace(SEEDED, ""))):
        script = tmp_path / f"{name}.py"
        script.write_text(text)
        spec = JobSpec(target=Command(f"{sys.executable} {script} --total-steps 6"), world_sizes=(2,),
                       hang_timeout_s=30.0, run_dir=tmp_path / name, keep=True)
        judged = run_judged(spec, golden_cache=tmp_path / "cache")
        repeat = json.loads((judged.golden_dir / REPEAT_FILE).read_text())
        assert repeat["steps_compared"] >= 2, repeat
        verdicts[name] = (judged, repeat)
    seeded, repeat = verdicts["seeded"]
    assert seeded.valid is True and repeat["first_difference"] is None, seeded.judgement.to_json()
    unseeded, repeat = verdicts["unseeded"]
    assert unseeded.valid == UNKNOWN and unseeded.exit_code == 2
    diff = repeat["first_difference"]
    assert diff["step"] == 1
    summary = unseeded.verdicts["continuity"].summary
    assert summary.startswith(f"the script is not deterministic (step 1 digest {diff['golden']} vs {diff['again']}")
    assert "seed it: call probe.seed(...)" in summary


def golden_with_repeat(root: Path, first_difference: dict[str, object] | None) -> Path:
    golden = HistoryBuilder(root / "golden", total_steps=12)
    golden.attempt(2).train(12)
    golden.end()
    golden.write()
    (root / "golden" / "repeat.json").write_text(json.dumps({"steps_compared": 2, "first_difference": first_difference}))
    return root / "golden"


def test_a_golden_run_that_did_not_repeat_makes_continuity_unknown_and_names_probe_seed(tmp_path: Path) -> None:
    golden = golden_with_repeat(tmp_path, {"step": 1, "golden": "aa11", "again": "bb22"})
    run_dir = tmp_path / "run"
    b = HistoryBuilder(run_dir, total_steps=12, world_sizes=[2])
    b.attempt(2).train(12, digests=lambda k: f"other-{k}")  # differs from golden everywhere: no fault did that
    b.spec["world_sizes"] = [2]
    b.end()
    b.write()
    judgement = Command('python train.py').judge(run_dir, golden)
    assert judgement.valid == UNKNOWN, judgement.to_json()
    assert judgement.verdicts["continuity"].summary == (
        "the script is not deterministic (step 1 digest aa11 vs bb22 in two uninterrupted runs): seed it: call "
        "probe.seed(...) at the top of the script, before the model and the data are built (docs/FRAMEWORKS.md)")
    assert judgement.notes[0] == judgement.verdicts["continuity"].summary
    # The same run against a golden run that did repeat: the difference is the run's own.
    golden_with_repeat(tmp_path / "repeatable", None)
    assert Command('python train.py').judge(run_dir, tmp_path / "repeatable" / "golden").valid is False


def test_an_unrepeatable_golden_run_still_reports_a_restore_that_differs_from_its_save(tmp_path: Path) -> None:
    golden = golden_with_repeat(tmp_path, {"step": 1, "golden": "aa11", "again": "bb22"})
    run_dir = tmp_path / "run"
    b = HistoryBuilder(run_dir, total_steps=12)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, restore="step-00000004", restore_digest="state-3").train(12)
    b.end()
    b.write()
    judgement = Command('python train.py').judge(run_dir, golden)
    assert judgement.valid is False and judgement.verdicts["continuity"].valid is False
    assert "state-3 != state-4" in judgement.verdicts["continuity"].evidence[0]


def per_device_batch_run(run_dir: Path, samples) -> HistoryBuilder:
    b = HistoryBuilder(run_dir, dataset_size=16, global_batch=4, total_steps=8)
    b.attempt(2).train(4, save_every=4).crash(1)  # 2 ranks x 2 samples: 4 an update, 4 updates an epoch
    # One rank, still 2 samples an update: twice the updates, numbered past total_steps=8.
    b.attempt(1, restore="step-00000004").train(12, samples=samples, epoch=lambda step: 1 + (step - 5) // 8)
    b.end(final_step=12)  # the harness's record: the last update the job applied
    b.write()
    return b


def test_a_per_device_batch_run_past_total_steps_is_judged_across_the_change_and_says_so(tmp_path: Path) -> None:
    golden = HistoryBuilder(tmp_path / "golden", dataset_size=16, global_batch=4, total_steps=8)
    golden.attempt(2).train(8)
    golden.end()
    order = [(i * 5 + 3) % 16 for i in range(16)]  # epoch 1's order, as the builder's sampler makes it
    per_device_batch_run(tmp_path / "run", lambda step, rank: order[2 * (step - 5):2 * (step - 4)])
    judgement = Command('python train.py').judge(tmp_path / "run", None)
    assert judgement.notes[0].startswith("the effective global batch changed at attempt 1: 4 -> 2 samples per "
                                         "update, with the world size (2 -> 1)"), judgement.notes
    assert "judged with the 12 updates the run took instead of the total_steps=8" in judgement.notes[0]
    assert judgement.valid is True, judgement.to_json()  # every id once across the change, the job complete
    against = judge_across_batch_change(tmp_path / "run", load_history(golden.write()))
    assert against is not None and against.valid is True, against.to_json()
    assert against.verdicts["continuity"].counts["global_batch_changed_at_step"] == 5


def test_a_per_device_batch_run_that_repeats_samples_across_the_change_is_invalid(tmp_path: Path) -> None:
    per_device_batch_run(tmp_path / "run", lambda step, rank: [step % 4, (step + 1) % 4])
    judgement = Command('python train.py').judge(tmp_path / "run", None)
    assert judgement.valid is False and judgement.verdicts["coverage"].valid is False


def test_a_batch_change_within_total_steps_is_still_the_judgements_first_note(tmp_path: Path) -> None:
    """Attempt 1 reports half the ids per update (2 instead of 4, one micro-batch of two) and stays
    within total_steps: the run loads without the across-the-change view, continuity stops
    comparing with the golden run at the change, and the judgement's first note says why.
    Judged without a golden run nothing stopped, and no note is added."""
    golden = HistoryBuilder(tmp_path / "golden", dataset_size=16, global_batch=4, total_steps=8)
    golden.attempt(2).train(8)
    golden.end()
    golden.write()
    b = HistoryBuilder(tmp_path / "run", dataset_size=16, global_batch=4, total_steps=8)
    b.attempt(2).train(4, save_every=4).crash(1)
    b.attempt(1, restore="step-00000004").train(8, samples=lambda step, rank: b.global_batch(step)[:2])
    b.end()
    b.write()
    judgement = Command('python train.py').judge(tmp_path / "run", tmp_path / "golden")
    assert judgement.verdicts["continuity"].counts["global_batch_changed_at_step"] == 5
    assert judgement.notes[0].startswith("the effective global batch changed at attempt 1: 4 -> 2 samples per "
                                         "update, with the world size (2 -> 1)"), judgement.notes
    alone = Command('python train.py').judge(tmp_path / "run", None)
    assert not any("global batch changed" in note for note in alone.notes), alone.notes
