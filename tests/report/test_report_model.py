"""The report's facts, from hand-written run directories whose every number is known (no torch)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwreck.report import NotARun, build_report, render_report
from trainwreck.report.model import ranges
from tests.report.rundirs import RunWriter, clean_run, duplicated_sample_run, hung_run, killed_run


def test_ranges_turn_steps_into_contiguous_runs() -> None:
    assert ranges([7, 1, 2, 3, 8, 8]) == [[1, 3], [7, 8]]
    assert ranges([]) == []


def test_render_report_writes_json_markdown_and_html_into_the_run_directory(tmp_path: Path) -> None:
    run = clean_run(tmp_path / "run")
    html = render_report(run)
    assert html == run / "report" / "report.html"
    assert {p.name for p in (run / "report").iterdir()} == {"report.json", "report.md", "report.html"}
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["format"] == "trainwreck-report/1"
    assert report["valid"] is True
    assert "all 6 invariants hold" in report["headline"]


def test_without_verdicts_json_the_report_judges_the_run_itself_and_says_so(tmp_path: Path) -> None:
    report = build_report(clean_run(tmp_path / "run"))
    assert report["judged_by"].startswith("report (no golden run")
    assert set(report["verdicts"]) == {"coverage", "continuity", "atomicity", "hang", "replicas", "progress"}


def test_a_stored_verdicts_json_is_the_judgement_the_report_shows(tmp_path: Path) -> None:
    run = clean_run(tmp_path / "run")
    (run / "verdicts.json").write_text(json.dumps({
        "valid": False, "verdicts": {"continuity": {"valid": False, "summary": "step 3 left the golden run",
                                                    "counts": {}, "evidence": ["step 3: digest d3 != g3"]}},
        "unfired_faults": [], "notes": [], "golden": "/cache/g1", "reproduce": "trainwreck run kill-resume --plan '[]'",
        "outcome": "completed", "attempts": 1}))
    report = build_report(run)
    assert report["valid"] is False and report["judged_by"] == "verdicts.json"
    assert report["golden"] == "/cache/g1"
    assert report["scenario"]["name"] == "kill-resume"  # read from the reproduce command
    assert any(a["topic"] == "violation:continuity" for a in report["angles"])


def test_a_duplicated_sample_makes_the_report_invalid_with_the_ids_as_evidence(tmp_path: Path) -> None:
    run = duplicated_sample_run(tmp_path / "run")
    render_report(run)
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["valid"] is False
    assert report["verdicts"]["coverage"]["valid"] is False
    assert "ids used twice: 5,7" in report["verdicts"]["coverage"]["evidence"][0]
    assert "violated: coverage" in report["headline"]
    for name in ("report.md", "report.html"):
        assert "ids used twice: 5,7" in (run / "report" / name).read_text()


def test_a_kill_yields_recovery_figures_measured_from_the_fault(tmp_path: Path) -> None:
    report = build_report(killed_run(tmp_path / "run"))
    (row,) = report["recovery"]
    assert row["attempt"] == 0 and row["fault_id"] == "k1"
    assert row["progress_at_failure"] == 5
    assert (row["checkpoint"], row["checkpoint_step"], row["checkpoint_age_steps"]) == ("step-00000004", 4, 1)
    # step 5 ended 0.1 s after the save of step 4 (+0.02 s), then 0.05 s to the fault
    assert row["checkpoint_age_s"] == pytest.approx(0.15, abs=1e-6)
    assert row["steps_redone"] == 1 and row["samples_redone"] == 4  # update 5, both ranks' 2 samples
    assert row["restored"] == {"checkpoint": "step-00000004", "step": 4}
    assert row["resumed_after_s"] > row["restart_after_s"] > row["detected_after_s"] > 0


def test_lanes_split_each_ranks_work_into_lineage_and_redo(tmp_path: Path) -> None:
    report = build_report(killed_run(tmp_path / "run"))
    first, second = report["attempts"]
    assert first["ended"] == "failed" and second["ended"] == "completed"
    assert [lane["lineage"] for lane in first["lanes"]] == [[[1, 4]], [[1, 4]]]
    assert [lane["redo"] for lane in first["lanes"]] == [[[5, 5]], [[5, 5]]]
    assert second["lanes"][0]["lineage"] == [[5, 8]] and second["lanes"][0]["redo"] == []
    assert report["totals"]["redo_steps"] == 1 and report["totals"]["lineage_steps"] == 8


def test_a_hang_answer_quotes_the_measured_delay_the_timeout_and_the_stack(tmp_path: Path) -> None:
    report = build_report(hung_run(tmp_path / "run"))
    (hang,) = report["hangs"]
    assert hang["ranks"] == [1] and hang["stacks"][0]["frame"] == "trainer/loop.py:214 forward_backward"
    angle = next(a for a in report["angles"] if a["topic"] == "hang")
    assert "3.20 s after h1 hit rank 1" in angle["answer"]
    assert "3 s timeout" in angle["answer"]
    assert "1800 s" in angle["answer"]
    assert report["recovery"][0]["detected_after_s"] == pytest.approx(3.2, abs=1e-6)


STACKS = Path(__file__).parent / "data" / "stacks"
"""Recorded faulthandler dumps (record.py says how the two current-*.txt were made)."""


@pytest.mark.parametrize("dump,frame", [
    # record.py: SIGUSR1 handled by the main thread, whose "Current thread" block comes second
    ("current-second.txt", "stacks/record.py:24 train_step"),
    # record.py: handled by the waiting worker, whose block comes first and is "Current"
    ("current-first.txt", "stacks/record.py:24 train_step"),
    # hang-holding-gil with async saves: the persist thread's block first, no block "Current" (a
    # gloo thread ran the handler); the first block made the handbook place rank 0 in fsync_dir
    ("gil-async-rank0.txt", "faults/blocking.py:31 holding_gil"),
])
def test_a_stack_is_read_from_the_training_threads_block_wherever_the_dump_puts_it(
        tmp_path: Path, dump: str, frame: str) -> None:
    run = hung_run(tmp_path / "run")
    (run / "stacks" / "a000-r001-p1.txt").write_text((STACKS / dump).read_text())
    (stack,) = build_report(run)["hangs"][0]["stacks"]
    assert stack["threads"] == 2 and stack["frame"] == frame, stack
    assert stack["in_injector"] is frame.startswith("faults/") and stack["faulthandler"] is True


def test_the_scenario_question_leads_the_interview_angle(tmp_path: Path) -> None:
    run = hung_run(tmp_path / "run")
    (run / "verdicts.json").write_text(json.dumps({
        "valid": True, "verdicts": {}, "reproduce": "trainwreck run hang-detect --plan '[]'"}))
    report = build_report(run)
    assert report["angles"][0]["question"] == "How do you find the rank that hangs?"


def test_the_slowest_rank_is_the_one_with_the_most_own_work(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run")
    w.slow = {1: 0.3}  # rank 1 spends 0.3 s more in `data` per update
    w.attempt(0, 3)
    w.train(0, 3, 1, 8)
    w.exits(0, {0: 0, 1: 0, 2: 0})
    w.end()
    phases = build_report(w.write())["phases"]
    assert phases["slowest_rank"] == 1
    assert [r["steps"] for r in phases["ranks"]] == [8, 8, 8]
    assert phases["save_seconds"] == {"count": 4, "mean": 0.02, "max": 0.02, "interval_count": 3, "interval_mean": 0.02}


def test_a_save_that_was_due_but_never_committed_is_reported_missed(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run")
    w.attempt(0, 2)
    w.train(0, 2, 1, 3)
    w.train(0, 2, 4, 4)
    w.files[w.rank_file(0, 0)].pop()  # the save of step 4 never committed: the writer died inside it
    w.exits(0, {0: -9, 1: -9})
    w.end("failed", 4)
    report = build_report(w.write())
    assert report["missed_saves"] == [{"attempt": 0, "step": 4}]


def test_a_directory_without_run_json_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(NotARun, match="run.json: missing"):
        render_report(tmp_path)


def test_events_the_checkers_refuse_still_give_a_report_with_an_unknown_verdict(tmp_path: Path) -> None:
    run = clean_run(tmp_path / "run")
    events = run / "events" / "a000-r000-p0.jsonl"
    lines = events.read_text().splitlines()
    events.write_text("\n".join(lines[:3] + ["{not json"] + lines[3:]) + "\n")  # a bad line mid-file
    render_report(run)
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["valid"] == "unknown"
    assert "could not be judged" in report["error"]
    assert report["attempts"][0]["lanes"]  # the picture is still drawn from what parsed
    assert "skipped 1 line" in " ".join(report["raw_notes"])


def test_a_damaged_newest_checkpoint_sends_the_restart_further_back_and_the_report_says_so(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", faults=[{"id": "k1", "kind": "kill", "rank": 1, "step": 6},
                                            {"id": "c1", "kind": "corrupt", "attempt": 1}])
    w.attempt(0, 2)
    w.train(0, 2, 1, 5)
    w.emit(w.rank_file(0, 1), "fault", attempt=0, fault_id="k1", rank=1, detail="killed at step 6")
    w.exits(0, {1: -9, 0: -9})
    w.harness("fault", attempt=1, fault_id="c1", rank=None, checkpoint="step-00000004", detail="flipped bytes")
    w.spec["world_sizes"].append(2)
    w.harness("attempt", attempt=1, world_size=2, launcher="warm", pids=[])
    w.emit(w.rank_file(1, 0), "reject", attempt=1, rank=0, checkpoint="step-00000004", reason="digest mismatch")
    for rank in (0, 1):
        w.emit(w.rank_file(1, rank), "restore", attempt=1, rank=rank, world_size=2, step=2,
               checkpoint="step-00000002", digest="d2")
    w.train(1, 2, 3, 8)
    w.exits(1, {0: 0, 1: 0})
    w.end()
    report = build_report(w.write())
    assert report["verdicts"]["atomicity"]["valid"] is True, report["verdicts"]["atomicity"]
    assert "failed after update 5 and restarted from step-00000002 (step 2); 3 update(s) of its work redone" \
        in report["headline"]
    frequency = next(a for a in report["angles"] if a["topic"] == "frequency")
    assert "the restart went back to step-00000002" in frequency["answer"]
    silent = next(a for a in report["angles"] if a["topic"] == "silent")
    assert "1 checkpoint(s) damaged by faults (step-00000004), 1 rejected on verification" in silent["answer"]


def test_a_hang_is_blamed_on_the_fault_planned_to_hang_not_an_earlier_survived_delay(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run", faults=[{"id": "d1", "kind": "comm_delay", "rank": 1, "step": 2, "seconds": 0.02},
                                            {"id": "h1", "kind": "hang", "rank": 1, "step": 4, "expect": "hang"}])
    w.attempt(0, 2)
    w.train(0, 2, 1, 1)
    w.emit(w.rank_file(0, 1), "fault", attempt=0, fault_id="d1", rank=1, detail="all-reduce 20 ms late")
    w.train(0, 2, 2, 3)
    w.emit(w.rank_file(0, 1), "fault", attempt=0, fault_id="h1", rank=1, detail="blocks forever")
    w.t += 3.1
    w.harness("hang", attempt=0, ranks=[1], waiting=[0], last_step=4, detected_after_s=3.05, stacks=[])
    w.exits(0, {0: -9, 1: -9})
    w.attempt(1, 2, restore=("step-00000002", 2))
    w.train(1, 2, 3, 8)
    w.exits(1, {0: 0, 1: 0})
    w.end()
    report = build_report(w.write())
    (row,) = report["recovery"]
    assert row["fault_id"] == "h1" and row["progress_at_failure"] == 3
    assert "after h1 hit rank 1" in next(a for a in report["angles"] if a["topic"] == "hang")["answer"]


def _manifest(run: Path, name: str, files: dict[str, int], **fields: object) -> Path:
    folder = run / "checkpoints" / name
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(
        {"format": "trainwreck-ckpt/1", "files": {k: {"blake3": "0" * 64, "size": v} for k, v in files.items()},
         **fields}))
    return folder


def test_the_report_holds_rank_0s_loss_per_update_and_the_steps_that_paid_for_a_save(tmp_path: Path) -> None:
    report = build_report(killed_run(tmp_path / "run"))
    assert report["loss"]["steps"] == list(range(1, 9))
    assert report["loss"]["values"] == [round(2.0 / k, 4) for k in range(1, 9)]  # redone 5 from attempt 1
    assert report["loss"]["final"] == 0.25
    # saves after 2, 4 (attempt 0) and 4, 6 (attempt 1) land in the next step's checkpoint phase; 8 is the last
    assert [r["checkpoint_steps"] for r in report["phases"]["ranks"]] == [4, 4]


def test_the_state_a_rank_holds_comes_from_the_newest_checkpoints_manifest(tmp_path: Path) -> None:
    run = clean_run(tmp_path / "run")
    _manifest(run, "step-00000008", {"__0_0.distcp": 600, "__1_0.distcp": 640, ".metadata": 50, "rng.pt": 9},
              world_size=2, step=8, parallelism="fsdp", shards=2)
    state = build_report(run)["state"]
    assert state == {"checkpoint": "step-00000008", "step": 8, "parallelism": "fsdp", "world_size": 2,
                     "rank_bytes": [600, 640], "state_bytes": 1240, "rank_share": round(640 / 1240, 4)}
    ddp = clean_run(tmp_path / "ddp")
    _manifest(ddp, "step-00000008", {"model.pt": 400, "optimizer.pt": 800, "rng.pt": 9}, world_size=2, step=8)
    assert build_report(ddp)["state"]["rank_bytes"] == [1200, 1200]  # every replica holds it all


def test_a_symlinked_checkpoint_is_never_followed_for_the_state(tmp_path: Path) -> None:
    run = clean_run(tmp_path / "run")
    outside = _manifest(tmp_path / "elsewhere", "step-00000008", {"__0_0.distcp": 1}, world_size=1)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step-00000008").symlink_to(outside, target_is_directory=True)
    assert build_report(run)["state"] is None
    _manifest(run, "step-00000006", {"model.pt": 4, "optimizer.pt": 8}, world_size=2, step=6)
    assert build_report(run)["state"]["checkpoint"] == "step-00000006"  # the newest one inside the run


def test_the_state_reads_only_the_manifests_of_checkpoints_still_on_disk(tmp_path: Path, monkeypatch) -> None:
    from trainwreck.report import model

    run = clean_run(tmp_path / "run")  # saves after 2, 4, 6 and 8
    _manifest(run, "step-00000004", {"model.pt": 4, "optimizer.pt": 8}, world_size=2, step=4)
    read: list[str] = []
    real = model._manifest
    monkeypatch.setattr(model, "_manifest", lambda run_dir, name: read.append(name) or real(run_dir, name))
    assert build_report(run)["state"]["checkpoint"] == "step-00000004"
    assert read == ["step-00000004"]  # the pruned 8 and 6 are not looked for


def test_an_fsdp_report_whose_shards_are_empty_still_gets_an_interview_angle(tmp_path: Path) -> None:
    run = clean_run(tmp_path / "run")
    spec = json.loads((run / "run.json").read_text())
    spec["config"]["parallelism"] = "fsdp"
    (run / "run.json").write_text(json.dumps(spec))
    _manifest(run, "step-00000008", {"__0_0.distcp": 0, "__1_0.distcp": 0}, world_size=2, step=8)
    report = build_report(run)
    assert report["state"]["rank_share"] is None
    answer = next(a["answer"] for a in report["angles"] if a["topic"] == "sharding")
    assert "median update here took" in answer and "shard(s)" not in answer
