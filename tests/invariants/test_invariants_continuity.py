"""continuity: restored state equals saved state; the lineage follows the golden run."""

from __future__ import annotations

from histories import HistoryBuilder, digest, loss

from trainwreck.invariants import check_continuity


def crash_and_resume(b: HistoryBuilder, *, world_sizes=(2, 2), **train) -> HistoryBuilder:
    b.attempt(world_sizes[0]).train(5, save_every=2).crash(1)
    b.attempt(world_sizes[1], restore="step-00000004").train(b.spec["total_steps"], **train)
    b.end()
    return b


def test_restore_digest_equal_to_the_save_is_valid(builder):
    verdict = check_continuity(crash_and_resume(builder(total_steps=8)).load())
    assert verdict.valid is True, verdict
    assert verdict.counts["restores_checked"] == 2  # one per rank


def test_restore_digest_different_from_the_save_is_invalid(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, restore="step-00000004", restore_digest="state-3").train(8)
    verdict = check_continuity(b.load())
    assert verdict.valid is False
    assert "restored step-00000004" in verdict.evidence[0] and "state-3 != state-4" in verdict.evidence[0]


def test_restore_naming_another_step_than_its_save_is_invalid(builder):
    b = builder(total_steps=8)
    b.attempt(2).train(5, save_every=2).crash(1)
    b.attempt(2, restore="step-00000004", restore_step=5, restore_digest="state-4").train(8)
    verdict = check_continuity(b.load())
    assert verdict.valid is False
    assert "as step 5, but it was saved at step 4" in verdict.evidence[0]


def test_save_of_a_stale_state_is_invalid(builder):
    b = builder(total_steps=4)
    att = b.attempt(2).train(4)
    att.save(2, state="state-1")  # saved the state before update 2
    verdict = check_continuity(b.load())
    assert verdict.valid is False
    assert "saved step-00000002 at step 2 with digest state-1" in verdict.evidence[0]


def test_run_without_restores_is_valid_and_says_so(builder):
    b = builder(total_steps=4)
    b.attempt(2).train(4, save_every=2)
    verdict = check_continuity(b.load())
    assert verdict.valid is True
    assert "no restore to check" in verdict.summary


def test_no_digests_at_all_is_unknown(builder):
    b = builder(total_steps=5)  # steps are numbered 1..total_steps (DESIGN.md)
    b.attempt(2).train(5, digests=lambda k: None).crash(1)
    verdict = check_continuity(b.load())
    assert verdict.valid == "unknown"


def test_trajectory_matching_the_golden_run_is_valid(builder):
    golden = builder("golden", total_steps=8)
    golden.attempt(2).train(8)
    verdict = check_continuity(crash_and_resume(builder(total_steps=8)).load(), golden.load())
    assert verdict.valid is True, verdict
    assert verdict.counts["golden_steps_checked"] == 8


def test_trajectory_that_leaves_the_golden_run_after_a_correct_restore_is_invalid(builder):
    golden = builder("golden", total_steps=8)
    golden.attempt(2).train(8)
    # The restore is right, but (say) the LR schedule restarted: from step 5 on the states differ.
    b = crash_and_resume(builder(total_steps=8), digests=lambda k: f"drift-{k}")
    verdict = check_continuity(b.load(), golden.load())
    assert verdict.valid is False
    assert verdict.evidence[0] == "lineage step 5 (attempt 1): digest drift-5 != golden state-5 (same world size 2)"


def test_losses_within_tolerance_pass_when_world_sizes_differ(builder):
    golden = builder("golden", total_steps=8)
    golden.attempt(4).train(8)
    b = crash_and_resume(builder(total_steps=8), world_sizes=(4, 2), digests=lambda k: f"ws2-{k}", losses=lambda k: loss(k) * (1 + 5e-4))
    verdict = check_continuity(b.load(), golden.load())
    assert verdict.valid is True, verdict


def test_losses_beyond_tolerance_fail_when_world_sizes_differ(builder):
    golden = builder("golden", total_steps=8)
    golden.attempt(4).train(8)
    b = crash_and_resume(builder(total_steps=8), world_sizes=(4, 2), digests=lambda k: f"ws2-{k}", losses=lambda k: loss(k) + 0.01)
    verdict = check_continuity(b.load(), golden.load())
    assert verdict.valid is False
    assert "lineage step 5 (attempt 1): loss" in verdict.evidence[0] and "world size 2 vs golden 4" in verdict.evidence[0]


def test_loss_tolerance_comes_from_run_json(builder):
    golden = builder("golden", total_steps=8)
    golden.attempt(4).train(8)
    b = crash_and_resume(builder(total_steps=8, loss_tolerance=0.1), world_sizes=(4, 2), digests=lambda k: f"x{k}", losses=lambda k: loss(k) + 0.01)
    assert check_continuity(b.load(), golden.load()).valid is True


def test_golden_run_shorter_than_the_lineage_is_unknown(builder):
    golden = builder("golden", total_steps=8)
    golden.attempt(2).train(6)
    verdict = check_continuity(crash_and_resume(builder(total_steps=8)).load(), golden.load())
    assert verdict.valid == "unknown"
    assert "golden run has no step 7" in verdict.summary


def test_restore_of_a_never_saved_checkpoint_cannot_be_shown_continuous(builder):
    b = builder(total_steps=6)
    b.attempt(2).train(4).crash(1)
    b.attempt(2, restore="step-00000004", restore_step=4).train(6)
    assert check_continuity(b.load()).valid == "unknown"


def test_digest_helper_is_what_the_builder_writes():
    assert digest(3) == "state-3"
