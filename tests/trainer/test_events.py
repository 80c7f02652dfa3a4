"""The event log's write rule: what must be on disk before the process can die."""
from __future__ import annotations

import json
from pathlib import Path

from trainwreck.rundir.events import EventLog


def _on_disk(path: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()]


def test_a_batch_is_on_disk_before_the_update_it_feeds_can_reach_another_rank(tmp_path: Path) -> None:
    # The update's first collective follows `batch`; a SIGKILL after it must not take the
    # batch while a peer commits the update (seen as half a global batch in coverage).
    log = EventLog(tmp_path / "events.jsonl", rank=1, attempt=0)
    log.emit("phase", step=3)
    log.emit("batch", step=3, epoch=0, samples=[4, 5])
    assert _on_disk(log.path) == ["phase", "batch"]
    log.emit("step", step=3, loss=0.5, digest="d")
    assert _on_disk(log.path) == ["phase", "batch"], "step events stay buffered until the step boundary"
    log.close()
    assert _on_disk(log.path) == ["phase", "batch", "step"]
