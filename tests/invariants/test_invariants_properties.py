"""Properties over random crash/restore stories: correct recoveries are always
valid, and one replayed sample is always caught."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from histories import HistoryBuilder

from trainwreck.invariants import check_coverage, judge

# A story: per attempt (world size, last update before the crash); the last
# attempt runs to the end. Saves every 2 updates; a restart restores the newest.
stories = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 11)), min_size=0, max_size=3)


def tell(directory: Path, story: list[tuple[int, int]], total: int = 12) -> HistoryBuilder:
    b = HistoryBuilder(directory, dataset_size=20, global_batch=4, total_steps=total)
    newest = 0
    for world_size, crash_at in story:
        restore = f"step-{newest:08d}" if newest else None
        att = b.attempt(world_size, restore=restore).train(max(crash_at, newest), save_every=2)
        newest = max(newest, (att.position // 2) * 2)
        att.crash(0)
    b.attempt(2, restore=f"step-{newest:08d}" if newest else None).train(total, save_every=2)
    b.end()
    return b


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(story=stories)
def test_any_correct_recovery_story_is_valid(story):
    with tempfile.TemporaryDirectory() as tmp:
        judgement = judge(tell(Path(tmp), story).load())
        assert judgement.valid is True, {n: v.summary for n, v in judgement.verdicts.items()}


@settings(max_examples=25, deadline=None)
@given(story=stories, data=st.data())
def test_one_replayed_sample_is_always_caught(story, data):
    with tempfile.TemporaryDirectory() as tmp:
        b = tell(Path(tmp), story)
        history = b.load()
        # Replace one id of a lineage step by an id used earlier in the same epoch.
        last = history.logs[(len(b.attempts) - 1, 0)]
        step = data.draw(st.sampled_from([k for k in last.batch_steps if (k - 1) % 5 != 0]), label="step")
        i = last.batch_steps.index(step)
        earlier = b.global_batch(step - 1)[0]
        last.ids[last.offsets[i]] = earlier
        assert check_coverage(history).valid is False
