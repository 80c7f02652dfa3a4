"""The watchdog's budgets, read from real progress boards: which silence is a hang."""
from __future__ import annotations

import time
from pathlib import Path

from trainwreck.harness.supervise.watchdog import Watchdog, WatchdogConfig
from trainwreck.trainer.progress import ProgressBoard

CONFIG = WatchdogConfig(hang_timeout_s=1.0, checkpoint_timeout_s=3.0, startup_timeout_s=60.0)


def silent_for(watchdog: Watchdog, seconds: float) -> None:
    """As if no board had changed for `seconds` (the clock is the watchdog's own monotonic one)."""
    watchdog.observe()
    watchdog.last_change = time.monotonic() - seconds


def test_a_rank_that_published_its_start_but_not_its_first_update_is_held_to_the_startup_budget(
        tmp_path: Path) -> None:
    # Restarted CUDA ranks sat in torch.cuda.set_device and model setup past a 2 s hang timeout: the
    # probe's start (update 0) came before it, so the hang timeout, not the startup budget, applied.
    boards = [ProgressBoard(tmp_path, 1, r) for r in range(2)]
    boards[0].publish(0, "start")
    boards[1].publish(5, "forward")
    watchdog = Watchdog(CONFIG, tmp_path, attempt=1, world_size=2)
    silent_for(watchdog, 5.0)
    assert watchdog.budget([0, 1]) == 60.0 and watchdog.check([0, 1]) is None
    boards[0].publish(5, "start")  # entered its first update: from now on a hang is a hang
    silent_for(watchdog, 5.0)
    hang = watchdog.check([0, 1])
    assert watchdog.budget([0, 1]) == 1.0 and hang is not None
    assert (hang.suspects, hang.waiting, hang.last_step) == ([0], [1], 5)
    for board in boards:
        board.close()


def test_a_rank_that_never_published_is_a_startup_suspect_once_the_startup_budget_is_spent(tmp_path: Path) -> None:
    board = ProgressBoard(tmp_path, 0, 1)
    board.publish(3, "sync")
    board.close()
    watchdog = Watchdog(CONFIG, tmp_path, attempt=0, world_size=2)
    silent_for(watchdog, 59.0)
    assert watchdog.check([0, 1]) is None
    silent_for(watchdog, 61.0)
    hang = watchdog.check([0, 1])
    assert hang is not None and (hang.suspects, hang.last_step) == ([0], -1)
