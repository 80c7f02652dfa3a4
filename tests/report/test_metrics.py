"""report.json `metrics` (report/metrics.py): progress per attempt, checkpoint age and restarts,
computed from a hand-made report so each formula is checked on numbers one can do in one's head."""
from __future__ import annotations

from trainwreck.report.metrics import baselines

REPORT = {
    "spec": {"global_batch": 16}, "wall_s": 10.0, "totals": {"final_step": 12},
    "saves": [{"step": 4, "t_s": 2.0}, {"step": 8, "t_s": 7.0}],
    "attempts": [
        {"attempt": 0, "world_size": 4, "lanes": [{"rank": 1, "ranges": [[1, 5]], "first_s": 0.5, "last_s": 9.0},
                                                  {"rank": 0, "ranges": [[1, 5]], "first_s": 1.0, "last_s": 3.0}]},
        {"attempt": 1, "world_size": 2, "lanes": [{"rank": 0, "ranges": [[5, 12]], "first_s": 5.0, "last_s": 8.5}]},
    ],
}


def test_progress_is_samples_per_second_from_rank_0s_first_to_last_update_of_each_attempt() -> None:
    first, second = baselines(REPORT)["attempts"]
    assert (first["updates"], first["samples_per_s"], first["samples_per_s_per_rank"], first["step_s"]) == (
        5, 32.0, 8.0, 0.5)  # 4 intervals x 16 samples in 2 s
    assert (second["updates"], second["samples_per_s"], second["samples_per_s_per_rank"]) == (8, 32.0, 16.0)


def test_the_checkpoint_age_is_the_longest_gap_between_commits_and_restarts_count_attempts_after_the_first() -> None:
    metrics = baselines(REPORT)
    assert (metrics["checkpoint_age_max_s"], metrics["checkpoint_age_end_s"], metrics["restarts"]) == (5.0, 3.0, 1)


def test_a_run_without_saves_is_as_old_as_it_is_long() -> None:
    metrics = baselines({**REPORT, "saves": []})
    assert metrics["checkpoint_age_max_s"] == metrics["checkpoint_age_end_s"] == 10.0


def test_the_checkpoint_age_counts_from_when_the_saved_state_was_taken_not_from_its_commit() -> None:
    """An asynchronous save of step 8 started at 5.5 s and committed at 7.0 s: a failure at 9.9 s
    loses the work since 5.5 s, so the age at the end (10 s) is 4.5 s, not 3.0 s."""
    saves = [{"step": 4, "t_s": 2.0, "seconds": 0.5}, {"step": 8, "t_s": 7.0, "seconds": 1.5}]
    metrics = baselines({**REPORT, "saves": saves})
    # before the first commit: 0 -> 2.0; then from 1.5 (the state of step 4) to 7.0; then from 5.5 to 10.0
    assert (metrics["checkpoint_age_max_s"], metrics["checkpoint_age_end_s"]) == (5.5, 4.5)
