"""Facts a `--cmd` judgement carries about the command itself, read from its run directory:
the global batch each attempt actually used (from its own `batch` events), and the rank's own
error when the command died before its probe wrote anything.

A script that sizes its batch per device (`DataLoader(batch_size=32)` under a
DistributedSampler) changes its global batch with the world size: 2 ranks x 8 is 16, 1 rank
is 8. After such a change the job takes more, smaller updates, numbered past the
`total_steps` its first attempt announced, and the update at step k is no longer the golden
run's update k. The checkers compare with the golden run only up to the change (their counts
say where: `global_batch_changed_at_step`); this module states the change itself as the
judgement's first note and, where the run's steps went past the total_steps its first attempt
announced, judges it with the updates it really took.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwreck.report.crash_cause import last_exception
from trainwreck.rundir.layout import RunDir, iter_events


def global_batches(run_dir: Path) -> dict[int, dict[str, int]]:
    """attempt -> {"global_batch": samples of its first update over all ranks, "world_size": ...}."""
    first: dict[int, int] = {}
    sizes: dict[tuple[int, int], int] = {}
    worlds: dict[int, int] = {}
    for ev in iter_events(run_dir):
        if ev.get("kind") != "batch" or not isinstance(ev.get("attempt"), int) or not isinstance(ev.get("step"), int):
            continue
        attempt, step = ev["attempt"], ev["step"]
        samples = ev.get("samples") if isinstance(ev.get("samples"), list) else []
        sizes[(attempt, step)] = sizes.get((attempt, step), 0) + len(samples)
        first[attempt] = min(first.get(attempt, step), step)
        if isinstance(ev.get("world_size"), int):
            worlds[attempt] = ev["world_size"]
    return {a: {"global_batch": sizes[(a, k)], "world_size": worlds.get(a, 0)} for a, k in sorted(first.items())}


def batch_change(run_dir: Path) -> dict[str, Any] | None:
    """The first change of global batch between attempts, as facts; None when it never changed."""
    per_attempt = list(global_batches(run_dir).items())
    for (a, before), (b, after) in zip(per_attempt, per_attempt[1:]):
        if before["global_batch"] != after["global_batch"]:
            return {"attempt": b, "global_batch_before": before["global_batch"],
                    "global_batch_after": after["global_batch"], "world_size_before": before["world_size"],
                    "world_size_after": after["world_size"]}
    return None


def batch_change_note(change: dict[str, Any]) -> str:
    before, after = change["global_batch_before"], change["global_batch_after"]
    return (f"the effective global batch changed at attempt {change['attempt']}: {before} -> {after} samples per "
            f"update, with the world size ({change['world_size_before']} -> {change['world_size_after']}): the "
            f"script sizes its batch per device, so the resumed attempt takes other, {'smaller' if after < before else 'larger'} "
            f"updates (numbered past the total_steps its first attempt announced) and its learning rate now acts on "
            f"{after}/{before} of the batch it was tuned for (the linear rule would scale it by {after}/{before}); "
            "to judge across the change, keep the global batch fixed (per-device batch = global batch / WORLD_SIZE, "
            "or accumulate gradients)")


def with_batch_change_note(run_dir: Path, judgement: Any) -> Any:
    """The judgement with the change of global batch as its first note, when a checker stopped
    comparing with the golden run at a changed global batch (its counts say
    `global_batch_changed_at_step`) within total_steps too: the judgement says why, not only
    the counts. Nothing is added when no checker stopped (an epoch's partial batch is no change)."""
    from trainwreck.invariants import Judgement

    stopped = any("global_batch_changed_at_step" in v.counts for v in judgement.verdicts.values())
    change = batch_change(run_dir) if stopped else None
    if change is None:
        return judgement
    return Judgement(judgement.valid, judgement.verdicts, judgement.unfired_faults,
                     [batch_change_note(change), *judgement.notes])


def rank_error(run_dir: Path, ranks: list[tuple[int, int]]) -> tuple[int, int, str, str] | None:
    """(attempt, rank, its last exception line, its log relative to the run directory) of the first
    rank whose log ends in a traceback: the rank's own error, where the command really failed."""
    for attempt, rank in ranks:
        path = RunDir(run_dir).rank_log(attempt, rank)
        line, _ = last_exception(path)
        if line is not None:
            return attempt, rank, line, path.relative_to(run_dir).as_posix()
    return None


def judge_across_batch_change(run_dir: Path, golden: Any) -> Any | None:
    """The judgement of a run whose global batch changed and whose steps therefore ran past
    run.json's total_steps (its first attempt announced them for its own batch): judged on a copy
    whose total_steps is the run's own last update, so coverage is judged exactly-once across the
    change and continuity up to it (their counts say where), with the change as the first note.
    None when the batch never changed: the run is inconsistent for another reason."""
    import json
    import shutil
    import tempfile

    from trainwreck.invariants import Judgement, judge, load_history

    change = batch_change(run_dir)
    if change is None:
        return None
    last = max((ev["step"] for ev in iter_events(run_dir) if isinstance(ev.get("step"), int)), default=0)
    paths = RunDir(run_dir)
    with tempfile.TemporaryDirectory(prefix="trainwreck-batch-") as tmp:
        view = Path(tmp)
        spec = json.loads(paths.run_json.read_text())
        announced = spec.get("total_steps", 0)
        (view / "run.json").write_text(json.dumps({**spec, "total_steps": max(last, announced)}))
        shutil.copytree(paths.events, view / "events", symlinks=True)
        judgement = judge(load_history(view), golden)
    note = (f"{batch_change_note(change)}; judged with the {last} updates the run took instead of the "
            f"total_steps={announced} its first attempt announced")
    return Judgement(judgement.valid, judgement.verdicts, judgement.unfired_faults, [note, *judgement.notes])
