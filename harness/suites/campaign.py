"""A chaos campaign on any engine: the seeded plan stream, one directory per plan, and a ledger to resume from.

The ledger is the out directory itself: OUT/campaign.json holds what decides which
plans the stream draws (seed, launcher, backend), and each finished plan's
OUT/plan-NNNN/outcome.json is written last, atomically, once its run directory is
complete on this machine. So a plan is finished exactly when its outcome.json exists:
a driver killed at any moment leaves finished plans (kept by --resume, never rerun)
and at most some unfinished directories (removed and run again). Plan N is the N-th
case of the seeded stream whichever engine runs it, so a resumed or distributed
campaign judges the same plans as a local one, and a ledger whose stream no longer
draws the same plans (trainwreck changed in between) is refused, not mixed.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from trainwreck.harness.suites.chaos import ChaosCase, stream_cases
from trainwreck.harness.suites.engines import Engine, Outcome, PlanJob
from trainwreck.harness.registry import DEFAULT_LAUNCHER
from trainwreck.rundir.errors import InputError
from trainwreck.rundir.layout import write_json_atomic

LEDGER = "campaign.json"
OUTCOME = "outcome.json"


class LedgerError(InputError):
    """--resume was given something that is not a campaign this version can continue."""


@dataclass(frozen=True)
class CampaignSpec:
    """What decides the plans: the same spec draws the same plan N on every engine."""

    seed: int
    launcher: str = DEFAULT_LAUNCHER
    backend: str = "auto"


def plan_dir(out: Path, index: int) -> Path:
    return out / f"plan-{index:04d}"


def case_json(case: ChaosCase) -> dict[str, Any]:
    # A JSON round trip normalises tuples to lists, so a stored case compares equal to a redrawn one.
    return json.loads(json.dumps({"world_sizes": list(case.world_sizes), "plan": case.plan,
                                  "parallelism": case.parallelism}))


def case_from_json(data: dict[str, Any]) -> ChaosCase:
    return ChaosCase(tuple(data["world_sizes"]), list(data["plan"]), data["parallelism"])


def write_ledger(out: Path, spec: CampaignSpec) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / LEDGER, {"format": "trainwreck-campaign/1", **asdict(spec)})


def read_ledger(out: Path) -> CampaignSpec:
    try:
        data = json.loads((out / LEDGER).read_text())
        return CampaignSpec(int(data["seed"]), str(data["launcher"]), str(data["backend"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"--resume {out}: no readable {LEDGER} ({type(exc).__name__}); give the --out "
                          "directory of an earlier `trainwreck chaos` run") from None


def record(outcome: Outcome) -> None:
    """Mark the plan finished: its outcome.json, written last."""
    write_json_atomic(outcome.run_dir / OUTCOME, {
        "index": outcome.index, "valid": outcome.valid, "seconds": round(outcome.seconds, 3),
        "node": outcome.node, "reproduce": outcome.reproduce, "case": case_json(outcome.case)})


def finished_outcomes(out: Path) -> dict[int, Outcome]:
    """The plans an earlier session finished, by index (a directory without outcome.json is not one)."""
    found = {}
    for path in sorted(out.glob(f"plan-*/{OUTCOME}")):
        if path.parent.is_symlink():
            continue  # not a plan this campaign wrote; swept before the run
        try:
            data = json.loads(path.read_text())
            found[int(data["index"])] = Outcome(int(data["index"]), case_from_json(data["case"]), path.parent,
                                                data["valid"], data["reproduce"], float(data["seconds"]),
                                                data.get("node") or {})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"--resume {out}: {path.relative_to(out)} is unreadable ({type(exc).__name__}); "
                              f"delete {path.parent.name} to run that plan again") from None
    return found


@dataclass
class Campaign:
    """Feeds the seeded stream to an engine until the budget or the plan count is spent."""

    engine: Engine
    out: Path
    spec: CampaignSpec
    on_outcome: Callable[[Outcome], None] = lambda outcome: None

    def run(self, budget_s: float, plans: int | None = None, finished: dict[int, Outcome] | None = None) -> list[Outcome]:
        """Every plan of the stream up to the budget, in index order; `finished` ones are reused, not rerun."""
        done: dict[int, Outcome] = dict(finished or {})
        drawn = 0
        deadline = time.monotonic() + budget_s
        failed: list[BaseException] = []
        self._sweep_unfinished()

        def keep_going() -> bool:
            return not failed and time.monotonic() < deadline and (plans is None or drawn < plans)

        def consume(case: ChaosCase) -> None:
            # Hypothesis replays an example that raised, which would submit its plan twice:
            # an error stops the stream instead and is raised once Hypothesis has let go.
            try:
                submit(case)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the stream
                failed.append(exc)

        def submit(case: ChaosCase) -> None:
            nonlocal drawn
            drawn += 1
            if drawn in done:
                self._check_same(done[drawn], case)
                return
            job = PlanJob(drawn, case, plan_dir(self.out, drawn), self.spec.launcher, self.spec.backend)
            self._land(done, self.engine.submit(job))

        stream_cases(self.spec.seed, keep_going, consume)
        if failed:
            raise failed[0]
        self._land(done, self.engine.drain())
        return [done[i] for i in sorted(done)]

    def _land(self, done: dict[int, Outcome], outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if outcome.index in done:  # an engine must never hand a plan back twice
                raise RuntimeError(f"plan {outcome.index} came back twice from the engine")
            record(outcome)
            done[outcome.index] = outcome
            self.on_outcome(outcome)

    def _sweep_unfinished(self) -> None:
        """Remove what a killed session left unfinished: plan directories without outcome.json, half-received ones."""
        for path in [*self.out.glob("plan-*"), *self.out.glob(".incoming-*")]:
            if path.is_symlink() or not path.is_dir():
                path.unlink()  # never followed: a plan directory is a real directory under OUT
            elif not (path / OUTCOME).exists():
                shutil.rmtree(path)

    def _check_same(self, earlier: Outcome, case: ChaosCase) -> None:
        if case_json(earlier.case) != case_json(case):
            raise LedgerError(f"--resume {self.out}: seed {self.spec.seed} now draws a different plan "
                              f"{earlier.index} than the one judged in {earlier.run_dir.name} (trainwreck "
                              "changed in between); start a new campaign with --out")
