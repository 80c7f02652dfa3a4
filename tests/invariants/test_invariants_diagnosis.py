"""continuity names the state missing from the digest: when a restore was exact (restored
digest == saved digest) and the run still leaves the golden run right after it, the
model and optimizer came back; what did not is the RNG or LR schedule (same batch as golden)
or the sampler position / data order (a different batch)."""

from __future__ import annotations

from histories import HistoryBuilder

from trainwreck.invariants import check_continuity


def golden_and_resumed(builder, **train) -> tuple:
    golden = builder("golden", total_steps=8)
    golden.attempt(2).train(8)
    b: HistoryBuilder = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, restore="step-00000004").train(8, **train)
    b.end()
    return b.load(), golden.load()


def test_an_exact_restore_followed_by_drift_on_the_golden_batch_names_rng_or_lr_schedule(builder):
    history, golden = golden_and_resumed(builder, digests=lambda k: f"drift-{k}")
    verdict = check_continuity(history, golden)
    assert verdict.valid is False
    assert verdict.counts["diverged_step"] == 5 and verdict.counts["diverged_after_exact_restore_step"] == 4
    assert verdict.counts["diverged_batch_matches_golden"] == 1
    assert verdict.evidence[-1] == (
        "the restore of step-00000004 at step 4 was exact (its digest equals the save's: parameters and optimizer "
        "state), yet lineage step 5 left the golden run: step 5 used the golden run's batch, so the RNG state "
        "(dropout, augmentation) or the LR schedule was not restored (the digest does not cover it)")


def test_an_exact_restore_followed_by_another_batch_names_the_sampler_position(builder):
    b = builder("probe", total_steps=8)
    history, golden = golden_and_resumed(
        builder, digests=lambda k: f"drift-{k}", samples=lambda step, rank: b.rank_batch(step - 1, rank, 2))
    verdict = check_continuity(history, golden)
    assert verdict.counts["diverged_batch_matches_golden"] == 0
    assert "step 5's global batch differs from the golden run's, so the sampler position or the data order" \
        in verdict.evidence[-1]


def test_a_restore_that_was_not_exact_blames_no_state_outside_the_digest(builder):
    golden = builder("golden", total_steps=8)
    golden.attempt(2).train(8)
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, restore="step-00000004", restore_digest="state-3").train(8, digests=lambda k: f"drift-{k}")
    verdict = check_continuity(b.load(), golden.load())
    assert verdict.valid is False and "diverged_step" not in verdict.counts
    assert not any("was exact" in line for line in verdict.evidence)
