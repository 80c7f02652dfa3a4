"""A world-size change with a per-device batch: the global batch changes with it (8 -> 4), so
after the change a step is another update than the golden run's step of that number.
Coverage is judged exactly-once across the change; comparisons with the golden run stop at it,
and the verdicts say where and from what to what."""

from __future__ import annotations

from histories import HistoryBuilder, digest

from trainwreck.invariants import check_continuity, check_coverage

SIZE = 16


def order(epoch: int) -> list[int]:
    return [(i * 5 + epoch * 3) % SIZE for i in range(SIZE)]


def on_two_ranks(step: int, rank: int) -> list[int]:
    """Per-device batch 4 on 2 ranks: a global batch of 8, 2 updates an epoch."""
    epoch, index = divmod(step - 1, 2)
    return order(epoch)[index * 8:(index + 1) * 8][rank::2]


def on_one_rank(step: int, rank: int) -> list[int]:
    """The same per-device batch on 1 rank after resuming at update 2 (end of epoch 0):
    a global batch of 4, 4 updates an epoch."""
    epoch, index = divmod(step - 3, 4)
    return order(epoch + 1)[index * 4:(index + 1) * 4]


def sampler_position_from_the_old_batch(step: int, rank: int) -> list[int]:
    """A resume that finds its place in the epoch as if the batch were still 8: half of epoch 1 is lost."""
    epoch, index = divmod(step - 1, 2)
    return order(epoch)[index * 4:(index + 1) * 4]


def epoch_two_ranks(step: int) -> int:
    return (step - 1) // 2


def epoch_one_rank(step: int) -> int:
    return 1 + (step - 3) // 4


def run(builder, samples, epoch) -> tuple:
    golden = builder("golden", dataset_size=SIZE, global_batch=8, total_steps=6)
    golden.attempt(2).train(6, samples=on_two_ranks, epoch=epoch_two_ranks)
    golden.end()
    b: HistoryBuilder = builder(dataset_size=SIZE, global_batch=8, total_steps=10)
    b.attempt(2).train(3, save_every=2, samples=on_two_ranks, epoch=epoch_two_ranks).crash(1)
    b.attempt(1, restore="step-00000002").train(10, samples=samples, epoch=epoch,
                                                 digests=lambda k: f"one-rank-{k}", losses=lambda k: 9.0)
    b.end()
    return b.load(), golden.load()


def test_a_per_device_batch_resumed_on_fewer_ranks_is_judged_exactly_once_and_up_to_the_change(builder):
    history, golden = run(builder, on_one_rank, epoch_one_rank)
    coverage = check_coverage(history, golden)
    assert coverage.valid is True, coverage
    assert ("each step's batch equals the golden run's (from step 3 (attempt 1) on, batches are not compared with "
            "the golden run's: the global batch changed (8 -> 4))") in coverage.summary, coverage.summary
    continuity = check_continuity(history, golden)
    assert continuity.valid is True, continuity
    assert continuity.counts["golden_steps_checked"] == 2
    assert continuity.counts["global_batch_changed_at_step"] == 3
    assert (continuity.counts["global_batch_golden"], continuity.counts["global_batch_after_change"]) == (8, 4)
    assert continuity.summary.endswith(
        "2 lineage steps match the golden run up to step 3; from lineage step 3 on (attempt 1) steps are not compared "
        "with the golden run: the global batch changed (8 -> 4 samples per update, world size 2 -> 1), so step 3 is "
        "another update than the golden run's step 3"), continuity.summary
    assert history.logs[(1, 0)].digests[0] == "one-rank-3" and digest(2) == "state-2"


def test_a_resume_that_places_itself_with_the_old_batch_loses_samples_across_the_change(builder):
    history, golden = run(builder, sampler_position_from_the_old_batch, epoch_two_ranks)
    coverage = check_coverage(history, golden)
    assert coverage.valid is False, coverage
    assert "never used in a completed epoch" in coverage.summary


def test_an_attempt_that_resumes_on_an_epochs_partial_batch_is_still_compared_with_golden(builder):
    # 10 samples in batches of 4 (drop_last false): 4, 4, 2. Resuming at the partial update is no batch change.
    golden = builder("golden", dataset_size=10, global_batch=4, total_steps=6)
    golden.attempt(2).train(6)
    b = builder(dataset_size=10, global_batch=4, total_steps=6)
    b.attempt(2).train(2, save_every=2).crash(1)
    b.attempt(2, restore="step-00000002").train(6, digests=lambda k: f"drift-{k}")
    b.end()
    continuity = check_continuity(b.load(), golden.load())
    assert continuity.valid is False and "global_batch_changed_at_step" not in continuity.counts
    assert continuity.evidence[0].startswith("lineage step 3 (attempt 1): digest drift-3 != golden state-3")


def test_a_comparison_that_stops_at_a_batch_change_says_so_in_an_invalid_verdict_too(builder):
    """The golden comparison ends where the global batch changed; a violation elsewhere (a restore
    whose digest is not its save's) must not hide that the later steps went unchecked."""
    golden = builder("golden", dataset_size=SIZE, global_batch=8, total_steps=6)
    golden.attempt(2).train(6, samples=on_two_ranks, epoch=epoch_two_ranks)
    golden.end()
    b: HistoryBuilder = builder(dataset_size=SIZE, global_batch=8, total_steps=10)
    b.attempt(2).train(3, save_every=2, samples=on_two_ranks, epoch=epoch_two_ranks).crash(1)
    b.attempt(1, restore="step-00000002", restore_digest="torn").train(10, samples=on_one_rank, epoch=epoch_one_rank)
    b.end()
    continuity = check_continuity(b.load(), golden.load())
    assert continuity.valid is False, continuity
    assert continuity.evidence[-1] == (
        "from lineage step 3 on (attempt 1) steps are not compared with the golden run: the global batch changed "
        "(8 -> 4 samples per update, world size 2 -> 1), so step 3 is another update than the golden run's step 3")
