"""`trainwreck run --parallelism fsdp` and `--set FIELD=VALUE`: bad input exits 2 before any rank starts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwreck.harness.cli import main as cli


@pytest.mark.parametrize("flags, names", [
    (["--set", "parallelism=zero3"], "parallelism='zero3' is not one of ddp, fsdp"),
    (["--set", "width=abc"], "--set width='abc': not a valid int; give an integer"),
    (["--set", "nope=1"], "expected FIELD=VALUE with FIELD one of"),
    (["--parallelism", "fsdp", "--set", "global_batch=24", "--world-sizes", "4,5"],
     "world size 5 does not divide global_batch=24"),
])
def test_bad_config_input_exits_2_with_one_line_before_any_process_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], names: str) -> None:
    out = tmp_path / "run"
    assert cli(["run", "kill-resume", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert names in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists(), "a run directory was written for input that was refused"


def test_an_fsdp_kill_resume_run_is_judged_valid_and_its_reproduce_line_keeps_the_parallelism(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = cli(["run", "kill-resume", "--parallelism", "fsdp", "--set", "dropout=0.2", "--out", str(out), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result
    assert "--set=parallelism=fsdp" in result["reproduce"] and "--set=dropout=0.2" in result["reproduce"]
    manifests = sorted((out / "checkpoints").glob("step-*/manifest.json"))
    assert manifests and all(json.loads(m.read_text())["parallelism"] == "fsdp" for m in manifests)
    # The kill fired: a second attempt restored a sharded checkpoint.
    assert result["outcome"] == "completed" and any(
        '"restore"' in line for p in (out / "events").glob("a001-*.jsonl") for line in p.read_text().splitlines())


@pytest.mark.slow
def test_a_world_size_above_a_parameters_rows_gives_empty_shards_that_save_and_reshard_onto_2_ranks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The sharding itself sets no bound on the world size: FSDP2 pads, and with 8 ranks the
    # 4-row head leaves ranks 4-7 an empty shard. Only the global batch bounds it (above).
    out = tmp_path / "run"
    plan = json.dumps([{"id": "k", "kind": "kill", "rank": 1, "step": 4}])
    code = cli(["run", "--parallelism", "fsdp", "--world-sizes", "8,2", "--total-steps", "6", "--set",
                "ckpt_interval=2", "--plan", plan, "--out", str(out), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["valid"] is True, result
    fired = [json.loads(line)["fault_id"] for p in (out / "events").glob("a000-*.jsonl")
             for line in p.read_text().splitlines() if '"kind":"fault"' in line]
    assert fired == ["k"], "the kill never fired: nothing was resharded"
    restores = [json.loads(line) for p in (out / "events").glob("a001-*.jsonl") for line in p.read_text().splitlines()
                if '"restore"' in line]
    assert restores and {r["world_size"] for r in restores} == {2}
    manifest = json.loads((out / "checkpoints" / restores[0]["checkpoint"] / "manifest.json").read_text())
    assert manifest["world_size"] == 8 and manifest["shards"] == 8
