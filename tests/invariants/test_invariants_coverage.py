"""coverage: along the lineage, every sample exactly once per epoch."""

from __future__ import annotations

import pytest
from histories import HistoryBuilder

from trainwreck.invariants import check_coverage, walk_lineage


def crash_and_redo(b: HistoryBuilder) -> HistoryBuilder:
    """Attempt 0 saves at 4, trains on to 6 and dies; attempt 1 redoes 5-6."""
    b.attempt(2).train(6, save_every=4).crash(1)
    b.attempt(2, restore="step-00000004").train(b.spec["total_steps"])
    b.end()
    return b


def test_uninterrupted_run_covers_every_epoch_and_its_summary_counts_them(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(8)
    verdict = check_coverage(b.load())
    assert verdict.valid is True, verdict
    assert verdict.counts["epochs"] == 2
    # The epochs are judged one at a time and let go; the summary said "over 0 epoch(s)" once.
    assert verdict.summary.startswith("8 lineage steps over 2 epoch(s): no id twice"), verdict.summary


def test_redo_work_after_a_crash_is_not_a_duplicate(builder):
    history = crash_and_redo(builder(total_steps=8)).load()
    verdict = check_coverage(history)
    assert verdict.valid is True, verdict
    assert verdict.counts["redo_steps"] == 2
    assert [(s.attempt, s.first, s.last) for s in walk_lineage(history).segments] == [(0, 1, 4), (1, 5, 8)]


def test_world_size_change_mid_epoch_is_valid(builder):
    b = builder(dataset_size=24, global_batch=4, total_steps=12)
    b.attempt(4).train(4, save_every=2).crash(3)
    b.attempt(2, restore="step-00000004").train(9, save_every=3).crash(0)
    b.attempt(3, restore="step-00000009").train(12)
    assert check_coverage(b.load()).valid is True


def test_partial_last_batch_is_a_step_of_its_own_without_drop_last(builder):
    b = builder(dataset_size=10, global_batch=4, drop_last=False, total_steps=6)
    b.attempt(2).train(6)
    history = b.load()
    assert sorted(history.global_batch(0, 3)) == sorted(b.global_batch(3)) and len(b.global_batch(3)) == 2
    assert check_coverage(history).valid is True


def test_drop_last_tails_may_stay_uncovered(builder):
    b = builder(dataset_size=10, global_batch=4, drop_last=True, total_steps=6)
    b.attempt(2).train(6)
    verdict = check_coverage(b.load())
    assert verdict.valid is True, verdict


def test_drop_last_does_not_excuse_a_whole_global_batch(builder):
    b = builder(dataset_size=12, global_batch=4, drop_last=True, total_steps=6)
    b.attempt(2).train(6, samples=lambda k, r: [] if k == 2 else b.rank_batch(k, r, 2))
    verdict = check_coverage(b.load())
    assert verdict.valid is False
    assert "epoch 0 completed without 4 id(s)" in verdict.evidence[0]


def test_sample_duplicated_across_two_attempts_is_invalid(builder):
    b = builder(dataset_size=32, total_steps=8)
    b.attempt(2).train(6, save_every=4).crash(1)
    att = b.attempt(2, restore="step-00000004")
    # The resumed sampler replays step 4's batch as step 5 (an off-by-one).
    att.train(8, samples=lambda k, r: b.rank_batch(4 if k == 5 else k, r, 2))
    verdict = check_coverage(b.load())
    assert verdict.valid is False
    first = sorted(b.global_batch(4))
    assert "ids used twice" in verdict.evidence[0]
    assert f"id {first[0]} at attempt 0 rank" in verdict.evidence[0] and "attempt 1 rank" in verdict.evidence[0]
    assert verdict.counts["duplicated_ids"] == 4


def test_batch_skipped_after_resume_is_invalid(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    att = b.attempt(2, restore="step-00000004")
    # The resumed sampler skips step 5's batch: every later step is shifted by one.
    att.train(8, samples=lambda k, r: b.rank_batch(k + 1, r, 2) if k < 8 else b.rank_batch(k, r, 2))
    verdict = check_coverage(b.load())
    assert verdict.valid is False
    assert "completed without 4 id(s)" in verdict.summary or "used twice" in verdict.summary


def test_batch_skipped_after_resume_shows_against_the_golden_run(builder):
    golden = builder("golden", total_steps=6)
    golden.attempt(2).train(6)
    b = builder(total_steps=6)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, restore="step-00000004").train(6, samples=lambda k, r: b.rank_batch(k + 1, r, 2))
    verdict = check_coverage(b.load(), golden.load())
    assert verdict.valid is False
    assert verdict.counts["golden_mismatched_steps"] == 2
    assert verdict.evidence[0].startswith("step 5 (attempt 1): global batch differs from the golden run")


def test_golden_batches_match_across_world_sizes(builder):
    golden = builder("golden", total_steps=8)
    golden.attempt(4).train(8)
    history = crash_and_redo(builder(total_steps=8)).load()
    verdict = check_coverage(history, golden.load())
    assert verdict.valid is True, verdict


def test_id_outside_the_dataset_is_invalid(builder):
    b = builder(total_steps=2)
    b.attempt(2).train(2, samples=lambda k, r: [99] if (k, r) == (2, 1) else b.rank_batch(k, r, 2))
    verdict = check_coverage(b.load())
    assert verdict.valid is False
    assert "outside the dataset 0..15: 99" in verdict.evidence[0]


def test_last_epoch_may_be_partial(builder):
    b = builder(total_steps=6)
    b.attempt(2).train(6)
    assert check_coverage(b.load()).valid is True


def test_duplicate_within_the_partial_last_epoch_is_still_invalid(builder):
    b = builder(total_steps=6)
    b.attempt(2).train(6, samples=lambda k, r: b.rank_batch(5 if k == 6 else k, r, 2))
    assert check_coverage(b.load()).valid is False


def test_no_batch_events_is_unknown(builder):
    b = builder(total_steps=2)
    att = b.attempt(1)
    att.emit(0, "step", step=1, loss=1.0, digest="d1")
    verdict = check_coverage(b.load())
    assert verdict.valid == "unknown"
    assert "no batch events" in verdict.summary


def test_a_rank_missing_its_batch_events_is_unknown(builder):
    b = builder(total_steps=4)
    b.attempt(2).train(4, ranks=(0,))
    verdict = check_coverage(b.load())
    assert verdict.valid == "unknown"
    assert "rank(s) [1]" in verdict.summary


def test_restore_of_an_uncommitted_checkpoint_is_judged_on_an_assumed_lineage(builder):
    b = builder(total_steps=6)
    b.attempt(2).train(4).crash(1)
    b.attempt(2, restore="step-00000004", restore_step=4).train(6)
    history = b.load()
    lineage = walk_lineage(history)
    assert lineage.complete and "assumed attempt 0" in lineage.problems[0]
    assert check_coverage(history).valid is True


def random_windows(step: int, rank: int) -> list[int]:
    """Two ids a rank draws at update `step` from a data RNG that goes on from draw to draw."""
    import random

    return random.Random(1000 * step + rank).choices(range(16), k=2)


def killed_and_resumed(builder, resumed_draws, **spec):
    b = builder(dataset_size=16, global_batch=4, total_steps=8, **spec)
    b.attempt(2).train(5, save_every=4, samples=random_windows, epoch=lambda step: 0).crash(1)
    b.attempt(2, restore="step-00000004").train(8, samples=resumed_draws, epoch=lambda step: 0)
    b.end()
    return b.load()


def test_draws_with_replacement_resumed_where_the_rng_left_off_are_valid_and_say_what_is_not_checked(builder):
    history = killed_and_resumed(builder, random_windows, sampling="with_replacement")
    assert sum(len(set(random_windows(k, r))) < 2 for k in range(1, 9) for r in range(2)) > 0  # ids do repeat
    verdict = check_coverage(history)
    assert verdict.valid is True, verdict
    assert verdict.summary == ("8 lineage steps drawn with replacement: every id inside the dataset, no resumed attempt "
                               "replayed draws already in the lineage; 1 redo step(s) outside it ignored; sampling with "
                               "replacement: exactly-once not checked (an id may be drawn again)")
    assert verdict.counts["replayed_steps"] == 0
    # Judged as a permutation (no `sampling` field: old run directories), the same draws repeat ids.
    assert check_coverage(killed_and_resumed(builder, random_windows, name="old")).valid is False


def test_a_restart_that_reseeds_the_data_rng_replays_its_draws_and_is_invalid(builder):
    history = killed_and_resumed(builder, lambda step, rank: random_windows(step - 4, rank), sampling="with_replacement")
    verdict = check_coverage(history)
    assert verdict.valid is False, verdict
    assert verdict.counts["replayed_steps"] == 4
    assert verdict.summary == "4 resumed step(s) replayed draws already in the lineage (sampling with replacement)"
    assert verdict.evidence[0] == ("attempt 1 resumed at step 5 from step-00000004 and replayed the draws of lineage "
                                   "steps 1-4: steps 5-8 used the same global batches (its data RNG restarted instead "
                                   "of resuming where the checkpoint left it)")


def test_an_unknown_sampling_is_refused_naming_the_field_and_its_values(builder):
    from trainwreck.invariants import InputError

    with pytest.raises(InputError, match="field 'sampling' must be 'without_replacement' or 'with_replacement', got 'random'"):
        killed_and_resumed(builder, random_windows, sampling="random")
