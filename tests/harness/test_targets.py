"""`JobSpec.target`: what a job runs owns its checks, its golden run, its judgement inputs
and its reproduce line (harness/supervise/spec.py, harness/supervise/command/target.py); no process starts here."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trainwreck.harness.supervise.command.target import Command
from trainwreck.harness.supervise.command.golden_key import cmd_golden_key
from trainwreck.harness.supervise.create_rundir import run_json
from trainwreck.harness.supervise.spec import JobSpec, SpecError
from trainwreck.harness.supervise.spec import Reference, golden_key
from trainwreck.trainer.config import TrainConfig

CFG = TrainConfig.tiny()


def test_a_config_alone_is_the_reference_target_and_a_command_carries_no_config() -> None:
    assert JobSpec(config=CFG).target == Reference(CFG)
    assert JobSpec(target=Reference(CFG)).config == CFG
    assert JobSpec(target=Command("python t.py")).config is None


def test_a_job_without_a_target_is_refused_with_both_ways_to_give_one() -> None:
    with pytest.raises(SpecError, match=r"config=TrainConfig\(...\) for the reference trainer, or target=Command"):
        JobSpec()


def test_a_config_that_disagrees_with_the_target_is_refused() -> None:
    with pytest.raises(SpecError, match="config and target=Reference disagree"):
        replace(JobSpec(config=CFG), config=replace(CFG, total_steps=CFG.total_steps + 1))
    with pytest.raises(SpecError, match="config and target=Command disagree"):
        JobSpec(config=CFG, target=Command("python t.py"))


@pytest.mark.parametrize("command, ckpt_dir, message", [
    ("", "checkpoints", "--cmd is empty"),
    ("python 't.py", "checkpoints", "cannot be split into words"),
    ("python t.py", "../elsewhere", "must be a path inside the run directory"),
])
def test_an_unusable_command_is_refused_before_anything_runs(command: str, ckpt_dir: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        JobSpec(target=Command(command, ckpt_dir))


def test_a_command_takes_only_the_faults_its_probe_can_reach() -> None:
    plan = [{"id": "s1", "kind": "storage_stall", "step": 2, "rank": 0, "seconds": 1.0}]
    with pytest.raises(SpecError, match="a --cmd run takes only"):
        JobSpec(target=Command("python t.py"), plan=plan)


def test_a_planted_defect_is_judged_against_the_reference_trainers_golden_run() -> None:
    defect = JobSpec(config=replace(CFG, variant="sampler_not_saved"))
    assert defect.target.golden_name(defect) == golden_key(CFG, 2) == JobSpec(config=CFG).target.golden_name(defect)


def test_a_commands_golden_run_is_keyed_by_its_command_and_first_world_size() -> None:
    spec = JobSpec(target=Command("python t.py"), world_sizes=(4, 2))
    assert spec.target.golden_name(spec) == f"cmd-{cmd_golden_key('python t.py', 4)}"
    golden = spec.target.golden_spec(spec, Path("/g"))
    assert golden.world_sizes == (4,) and golden.plan == [] and golden.max_restarts == 0
    assert golden.target == spec.target and golden.run_dir == Path("/g")


def test_each_target_writes_its_own_run_json_and_reproduce_line() -> None:
    ref = JobSpec(config=CFG, plan=[{"id": "k", "kind": "kill", "rank": 0, "step": 3}])
    assert run_json(ref)["config"] == CFG.to_dict() and "command" not in run_json(ref)
    assert ref.target.reproduce(ref).startswith("trainwreck run --plan ")
    cmd = JobSpec(target=Command("python t.py", "ckpt"))
    assert run_json(cmd)["command"] == "python t.py" and "config" not in run_json(cmd)
    assert cmd.target.reproduce(cmd) == ("trainwreck run --cmd 'python t.py' --plan '[]' --world-sizes 2 "
                                         "--hang-timeout 10 --ckpt-dir ckpt")
