"""What every supervisor shares, whatever starts its ranks: the run record, the harness's
event log, the `fault`/`hang`/`exit`/`end` events, and one `run` that always ends the job
cleanly. `harness/supervise/supervisor.py` (warm, spawn), `harness/supervise/torchrun.py` (the elastic
agent) and `harness/supervise/replicas.py` (replica groups) each add only how an attempt's processes
are started, watched and killed."""
from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainwreck.faults.external import ExternalFault, ExternalFaults
from trainwreck.harness.supervise.interrupts import Terminated, interrupt_of
from trainwreck.harness.supervise.spec import JobSpec
from trainwreck.harness.supervise.watchdog import Hang, WatchdogConfig, record_hang
from trainwreck.rundir.events import EventLog
from trainwreck.rundir.layout import RunDir, iter_events, next_attempt

OUTCOMES = ("completed", "budget_exhausted", "no_progress", "error", "interrupted")
"""interrupted: SIGINT or SIGTERM reached the harness, which stopped the job (`end` status
"interrupted", with the signal): nothing about the trainer, so no verdict (docs/DESIGN.md)."""
REAP_TIMEOUT_S = 30.0
"""How long a SIGKILLed attempt may take to disappear (a rank in uninterruptible I/O)."""


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    """The run directory (already removed if it was temporary and not kept)."""
    status: str
    """completed, failed or interrupted, as in the `end` event."""
    outcome: str
    """completed, budget_exhausted, no_progress or error (see OUTCOMES)."""
    attempts: int
    """Attempts started."""
    final_step: int
    """The last update the final attempt applied."""
    hangs: int
    """Hangs the watchdog declared."""
    wall_s: float
    """Seconds from run_job's call to its return."""
    launch_s: tuple[float | None, ...] = ()
    """Per attempt: seconds from its launch until every rank reached its first update."""
    error: str | None = None
    """The harness's own traceback when outcome is error."""


@dataclass
class AttemptResult:
    ok: bool
    codes: dict[int, int | None] = field(default_factory=dict)
    hang: Hang | None = None
    launch_s: float | None = None


def newest_committed_step(run_dir: Path) -> int:
    """Step of the newest `save` (a durably committed checkpoint); -1 when none."""
    return max((e["step"] for e in iter_events(run_dir, batches=False) if e.get("kind") == "save"), default=-1)


def final_step(run_dir: Path, attempt: int) -> int:
    """The last update applied by `attempt` (its restore point when it applied none)."""
    steps = [e["step"] for e in iter_events(run_dir, batches=False)
             if e.get("attempt") == attempt and e.get("kind") in ("step", "restore") and "rank" in e]
    return max(steps, default=0)


def remove_empty_stacks(run_dir: Path, attempt: int) -> None:
    """Every rank opens its stack file at start; keep only the ones that hold a dump."""
    for path in RunDir(run_dir).attempt_stacks(attempt):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except FileNotFoundError:
            pass


class JobSupervisor:
    """One job from its first attempt to its `end` event. Subclasses implement `supervise`
    (run attempts until an outcome) and `kill_all` (leave no process behind)."""

    def __init__(self, spec: JobSpec, run_dir: Path) -> None:
        self.spec, self.run_dir = spec, run_dir
        # No base fields: harness events name their attempt explicitly.
        self.events = EventLog(RunDir(run_dir).harness_events)
        self.faults = ExternalFaults(spec.plan)
        self.watch_config = WatchdogConfig(spec.hang_timeout_s, spec.checkpoint_budget_s, spec.startup_budget_s)
        self.attempt = next_attempt(run_dir)  # a run resumed from what an earlier job left continues after it
        self.hangs = 0
        self.launch_s: list[float | None] = []

    def supervise(self) -> str:
        """Run attempts until the job has an outcome (one of OUTCOMES)."""
        raise NotImplementedError

    def kill_all(self) -> None:
        """SIGKILL and reap every process of every attempt still alive."""
        raise NotImplementedError

    def end_fields(self) -> dict[str, Any]:
        """What this supervisor adds to the `end` event (replica groups: how often each group started)."""
        return {}

    def run(self, started: float) -> RunRecord:
        outcome, error, stop = "error", None, {}
        try:
            outcome = self.supervise()
        except (KeyboardInterrupt, Terminated) as exc:  # the harness was stopped, not the trainer: re-raised
            outcome, received = "interrupted", interrupt_of(exc)
            stop = {"signal": received.name, "signal_t": round(received.t, 6)}
            raise
        except Exception:  # noqa: BLE001 - the record says what broke; the ranks are reaped below
            error = traceback.format_exc()
            print(error, file=sys.stderr)
        finally:
            self.kill_all()
            status = outcome if outcome in ("completed", "interrupted") else "failed"
            last = final_step(self.run_dir, self.attempt)
            self.events.emit("end", status=status, final_step=last, outcome=outcome,
                             attempts=self.attempt + 1, **self.end_fields(), **stop)
            self.events.close()
        return RunRecord(run_dir=self.run_dir, status=status, outcome=outcome, attempts=self.attempt + 1,
                         final_step=last, hangs=self.hangs, wall_s=time.monotonic() - started,
                         launch_s=tuple(self.launch_s), error=error)

    def fire(self, attempt: int, fault: ExternalFault, steps: dict[int, int], pids: dict[int, int],
             send: Callable[[int, int], None]) -> None:
        """Apply an external fault: its `fault` event first (the judge must see it even if the
        signal takes the harness's view of the attempt down), then `send(rank, signum)`."""
        at = {r: steps.get(r) for r in fault.ranks}
        self.events.emit("fault", attempt=attempt, fault_id=fault.id,
                         rank=fault.rank, ranks=list(fault.ranks),
                         detail=f"{fault.describe()} (ranks were at steps {at})", signal=fault.signal,
                         pids=[pids[r] for r in fault.ranks])
        for rank in fault.ranks:
            send(rank, fault.signum)

    def on_hang(self, attempt: int, hang: Hang, live_pids: dict[int, int]) -> None:
        """Dump the live ranks' stacks and write the `hang` event."""
        self.hangs += 1
        record_hang(self.events, self.run_dir, attempt, hang, live_pids, self.watch_config.stack_wait_s)

    def report_exit(self, attempt: int, rank: int, code: int | None, **extra: Any) -> None:
        self.events.emit("exit", attempt=attempt, rank=rank, code=code, **extra)
