"""The resharding defects break only resharding: on an unchanged world size they are harmless,
so the row that catches them (tests/defects, scenario fsdp-shrink-world) tests resharding."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainwreck.harness.judge.runner import run_judged, spec_for
from trainwreck.harness.supervise.scenarios import get_scenario


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fsdp_optimizer_not_resharded", "fsdp_other_sharding_accepted"])
def test_a_resharding_defect_resumes_exactly_when_the_world_size_does_not_change(
        tmp_path: Path, golden_cache: Path, variant: str) -> None:
    judged = run_judged(spec_for(get_scenario("fsdp-kill-resume"), tmp_path / variant, "warm", variant=variant),
                        golden_cache=golden_cache)
    assert judged.judgement.unfired_faults == [], "the kill never fired: nothing was resumed"
    continuity = judged.judgement.verdicts["continuity"]
    assert continuity.valid is True and "restore digest(s) equal their saves" in continuity.summary, continuity.summary
