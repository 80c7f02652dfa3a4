"""Where each target stands (benchmarks/standing.py): what a run records about itself, the table
`--table` renders from runs' own files."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from trainwreck.benchmarks import standing
from trainwreck.benchmarks.standing import TARGETS, NotARun, load_run, render, source_commit



def a_run(**figures: Any) -> dict[str, Any]:
    """A run that meets every target a CPU host measures, changed by `figures`."""
    met = {key: bound for key, (op, bound) in TARGETS.items() if not key.startswith("gpu_")}
    return {**met, "targets": {}, **figures}


def target_row(markdown: str, key: str) -> list[str]:
    row = next(line for line in markdown.splitlines() if line.startswith(f"| `{key}` |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_a_target_met_in_every_run_counts_and_one_missed_once_is_not_done() -> None:
    markdown, done = render([a_run(), a_run(scenarios_per_min=117.3), a_run()])
    assert not done
    assert target_row(markdown, "scenarios_per_min") == ["`scenarios_per_min`", ">= 500", "500 / 117.3 / 500", "2 of 3"]
    assert target_row(markdown, "launch_warm_s_4") == ["`launch_warm_s_4`", "<= 0.5", "0.5 / 0.5 / 0.5", "3 of 3"]
    assert render([a_run(), a_run(), a_run()])[1]


def test_a_target_a_run_did_not_measure_is_not_met_there_and_one_no_run_measured_is_listed_apart() -> None:
    missing = a_run()
    del missing["report_s_16m"]  # its section failed in that run
    markdown, done = render([a_run(), missing, a_run(cmd_warm_speedup=None)])
    assert not done
    assert target_row(markdown, "report_s_16m")[2:] == ["60 / — / 60", "2 of 3"]
    assert target_row(markdown, "cmd_warm_speedup")[2:] == ["5 / 5 / —", "2 of 3"]
    assert "Measured by none of these runs: `gpu_async_stall_of_step_1gb`." in markdown
    assert "| `gpu_async_stall_of_step_1gb` |" not in markdown


def test_each_runs_record_is_its_row_and_a_run_without_one_says_not_recorded() -> None:
    record = {"started_utc": "2026-11-28T15:45:09+00:00", "commit": "0123456789abcdef", "dirty": True,
              "load_average_start": [0.68, 2.16, 2.27], "load_average_end": [3.5, 3.0, 2.5],
              "speed_probe_ms_start": 31.2, "speed_probe_ms_end": 29.0, "wall_s": 1001.4}
    markdown, _ = render([a_run(run=record), a_run(), a_run(run={"load_average_start": ["x"], "wall_s": "1"})])
    rows = [line for line in markdown.splitlines() if re.match(r"\| \d \|", line)]
    assert rows[0] == ("| 1 | 2026-11-28 15:45 | 0123456 (with uncommitted changes) | 16 min 41 s | 0.68 → 3.5 "
                       "| 31.2 / 29 |")
    assert rows[1] == rows[2].replace("| 3 |", "| 2 |") == "| 2 | " + " | ".join(["not recorded"] * 5) + " |"


@pytest.mark.parametrize("content, says", [
    (b"not json", "not JSON"),
    (b"[1, 2]", 'no "targets" object'),
    (b'{"targets": [1]}', 'no "targets" object'),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
])
def test_a_file_that_is_not_a_run_exits_2_naming_it_and_how_to_make_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, says: str) -> None:
    from trainwreck.benchmarks.__main__ import main

    bad = tmp_path / "q1.json"
    bad.write_bytes(content)
    with pytest.raises(NotARun, match=re.escape(f"--table {bad}: {says}")):
        load_run(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(a_run()))
    assert main(["--table", str(good), str(bad)]) == 2
    error = capsys.readouterr().err
    assert str(bad) in error and "--out FILE" in error and "Traceback" not in error


def test_a_fifo_or_a_folder_given_as_a_run_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "q1.json"
    os.mkfifo(fifo)  # nobody ever writes it: a blocking open would wait forever
    with pytest.raises(NotARun, match=re.escape(f"--table {fifo}: cannot read it (") + ".*FIFO"):
        load_run(fifo)
    with pytest.raises(NotARun, match=re.escape(f"--table {tmp_path}: cannot read it (") + ".*directory"):
        load_run(tmp_path)


def test_table_exits_0_only_when_every_target_was_met_in_every_run_and_refuses_to_measure_beside_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainwreck.benchmarks.__main__ import main

    paths = []
    for number, figures in enumerate([a_run(), a_run(), a_run(checker_events_per_s=501_135)], 1):
        paths.append(tmp_path / f"q{number}.json")
        paths[-1].write_text(json.dumps(figures))
    assert main(["--table", *map(str, paths[:2])]) == 0
    assert "every target met in all 2 runs" in capsys.readouterr().err
    assert main(["--table", *map(str, paths)]) == 1
    out = capsys.readouterr().out
    assert target_row(out, "checker_events_per_s")[2:] == ["2 000 000 / 2 000 000 / 501 135", "2 of 3"]
    assert main(["--table", str(paths[2])]) == 1
    assert "not every target met in the one run" in capsys.readouterr().err
    assert main(["--table", str(paths[0]), "--quick"]) == 2
    assert "measures nothing" in capsys.readouterr().err


def test_a_run_records_when_from_which_commit_and_how_loaded_and_fast_the_machine_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwreck.benchmarks import __main__ as benchmarks

    monkeypatch.setattr(benchmarks, "sections", lambda quick: [("launch", lambda: {"launch_warm_s_4": 0.07})])
    monkeypatch.setattr(benchmarks, "machine", lambda: {"cores": 2})
    out = tmp_path / "q.json"
    results = benchmarks.run_all(True, lambda line: None, out)
    run = results["run"]
    assert json.loads(out.read_text())["run"] == run
    assert run["started_utc"] <= run["finished_utc"] and run["started_utc"].endswith("+00:00")
    assert run["wall_s"] >= 0
    assert all(len(run[key]) == 3 for key in ("load_average_start", "load_average_end"))
    assert 0 < run["speed_probe_ms_start"] < 10_000 and 0 < run["speed_probe_ms_end"] < 10_000
    assert (run["commit"], run["dirty"]) == source_commit()
    assert results["targets"]["launch_warm_s_4"] == {"target": "<= 0.5", "measured": 0.07, "met": True}


def test_the_commit_is_the_checkouts_and_says_when_its_tracked_files_changed(tmp_path: Path) -> None:
    assert source_commit(tmp_path) == (None, None)  # not a checkout: an installed wheel's case
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "standing.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "standing.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "untracked.json").write_text("{}")
    assert source_commit(tmp_path) == (head, False)
    (tmp_path / "standing.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == (head, True)
    (tmp_path / "site-packages").mkdir()  # a wheel installed into a venv inside a checkout
    assert source_commit(tmp_path / "site-packages") == (None, None)


def test_the_speed_probe_times_the_sum_and_keeps_the_best_of_its_repeats() -> None:
    ticks = iter([0.0, 0.040, 1.0, 1.031, 2.0, 2.035, 3.0, 3.050, 4.0, 4.033])
    assert standing.speed_probe_ms(lambda: next(ticks)) == 31.0
    assert next(ticks, None) is None  # five repeats, each timed from its own start

