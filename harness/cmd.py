"""`trainwreck run --cmd "python train.py ..."`: a user's own trainer under the harness.

The job is an ordinary JobSpec with launcher 'cmd' (harness/launchers.py CmdLauncher), so
it gets everything the reference trainer gets from harness/supervisor.py: the watchdog,
restarts on the world-size schedule, external faults at steps, and (through the probe, which
builds faults/cmdrank.py's hooks from the plan) kill/hang at its fault points and crashes
inside the framework's own save. This module adds what
only a foreign command needs: its golden run (cached by the command and the hashes of
the files it names), corrupting its newest checkpoint between attempts, and the bad-input
rule: a command that breaks the run format's contract is judged "unknown" with the
reason, never valid.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import replace
from pathlib import Path

from trainwreck.harness.golden import _intact, _publish, _build_name, _write_manifest, default_cache_dir, \
    ensure_cache_dir, remove_stale_builds
from trainwreck.harness.restarts import RunRecord
from trainwreck.harness.runner import JudgedRun, publish
from trainwreck.harness.spec import JobSpec
from trainwreck.harness.supervisor import run_job
from trainwreck.invariants import InputError, Judgement, judge, load_history
from trainwreck.invariants.verdict import UNKNOWN
from trainwreck.trainer.rundir import RunDir, iter_events, read_run_json

CONTRACT_FIELDS = ("dataset_size", "global_batch", "drop_last", "total_steps")
"""run.json fields only the command knows; its probe writes them (Probe.write_run_json)."""


def input_hash(command: str, cwd: Path | None = None) -> str:
    """The command line plus the bytes of every file it names (the script, a config), so a
    cached golden run is rebuilt as soon as the user edits their trainer."""
    h = hashlib.sha256(command.encode())
    for word in shlex.split(command):
        path = Path(cwd or Path.cwd()) / word
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:20]


def golden_cmd_run(spec: JobSpec, cache_dir: Path | None = None) -> Path:
    """An uninterrupted run of the same command on the first world size (cached)."""
    cache_dir = cache_dir or default_cache_dir()
    final = cache_dir / f"cmd-{input_hash(f'{spec.command} @{spec.world_sizes[0]}')}"
    if _intact(final):
        return final
    ensure_cache_dir(cache_dir)
    remove_stale_builds(cache_dir)
    scratch = cache_dir / _build_name(final.name)
    record = run_job(replace(spec, world_sizes=spec.world_sizes[:1], plan=[], run_dir=scratch, keep=True,
                             max_restarts=0, scenario=None))
    problems = contract_problems(record)
    if record.status != "completed" or problems:
        raise GoldenFailed(f"the golden run of --cmd failed ({'; '.join(problems) or record.outcome}); "
                           f"see {scratch}/logs")
    _write_manifest(scratch)
    _publish(scratch, final)
    return final


class GoldenFailed(RuntimeError):
    """The command could not even run uninterrupted: nothing can be judged against it."""


def contract_problems(record: RunRecord) -> list[str]:
    """Why this --cmd run cannot be judged, each with the fix; empty when it can."""
    run_dir = record.run_dir
    spec = read_run_json(run_dir)
    exits = {(e["attempt"], e["rank"]): e.get("code") for e in iter_events(run_dir, batches=False)
             if e.get("kind") == "exit" and "rank" in e and "attempt" in e}
    rank_events = [e for e in iter_events(run_dir, batches=False) if "rank" in e and e.get("kind") != "exit"
                   and e.get("kind") != "fault"]
    if not rank_events:
        codes = {f"a{a}r{r}": c for (a, r), c in sorted(exits.items())}
        return [f"the command wrote no events (exit codes by attempt and rank {codes}; see {RunDir(run_dir).logs}): "
                "call trainwreck.trainer.probe.Probe.from_env() in it (docs/FRAMEWORKS.md)"]
    problems = []
    missing = [f for f in CONTRACT_FIELDS if f not in spec]
    if missing:
        problems.append(f"run.json lacks {', '.join(missing)}: the command must call "
                        "probe.write_run_json(dataset_size=..., global_batch=..., drop_last=..., total_steps=...)")
    planned = spec.get("world_sizes") or [1]
    for event in rank_events:
        attempt = event.get("attempt")
        want = planned[min(attempt, len(planned) - 1)] if isinstance(attempt, int) and attempt >= 0 else None
        if event.get("world_size") != want or not (isinstance(event.get("rank"), int) and 0 <= event["rank"] < (want or 0)):
            problems.append(f"attempt {attempt} was given WORLD_SIZE={want} but its events say rank "
                            f"{event.get('rank')!r} of world_size {event.get('world_size')!r}: the command ignores "
                            "torchrun's RANK/WORLD_SIZE; build the probe with Probe.from_env()")
            break
    steps = [e for e in rank_events if e.get("kind") == "step"]
    if not steps:
        problems.append("the command applied no update (no `step` event): it exited or failed before its "
                        f"first step; see {RunDir(run_dir).logs}")
    return problems


def judge_cmd_run(record: RunRecord, golden_dir: Path | None) -> Judgement:
    """The usual judgement, but "unknown" with the reasons when the command broke the contract.
    `golden_dir` None: the run is itself a golden run (nothing to compare with)."""
    problems = contract_problems(record)
    try:
        judgement = judge(load_history(record.run_dir), load_history(golden_dir) if golden_dir is not None else None)
    except InputError as exc:
        return Judgement(UNKNOWN, {}, [], [f"the command's run cannot be judged: {exc}", *problems])
    if problems:
        return Judgement(UNKNOWN, judgement.verdicts, judgement.unfired_faults, [*problems, *judgement.notes])
    return judgement


def run_cmd_judged(spec: JobSpec, golden_cache: Path | None = None) -> JudgedRun:
    """Run a --cmd job, judge it against the command's golden run, write verdicts.json and the report."""
    try:
        golden_dir = golden_cmd_run(spec, golden_cache)
    except GoldenFailed as exc:
        golden_dir = None
        reason = str(exc)
    record = run_job(spec)
    if golden_dir is None:
        judgement = Judgement(UNKNOWN, {}, [], [reason, *contract_problems(record)])
        golden_dir = Path("")
    else:
        judgement = judge_cmd_run(record, golden_dir)
    judged = JudgedRun(record, judgement, golden_dir, reproduce_cmd(spec))
    publish(judged)
    return judged


def reproduce_cmd(spec: JobSpec) -> str:
    return shlex.join(["trainwreck", "run", "--cmd", spec.command or "", "--plan",
                       json.dumps(spec.plan, separators=(",", ":")),
                       "--world-sizes", ",".join(map(str, spec.world_sizes)),
                       "--hang-timeout", f"{spec.hang_timeout_s:g}", "--ckpt-dir", spec.ckpt_dir])
