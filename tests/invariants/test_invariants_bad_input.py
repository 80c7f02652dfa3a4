"""Every unusable run directory gets exit 2 and one line naming what to fix -
never a traceback, never a verdict on evidence the checker could not read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from histories import HistoryBuilder

from trainwreck.invariants.cli import main

DEEP = "[" * 100_000 + "]" * 100_000


def valid_run(b: HistoryBuilder) -> HistoryBuilder:
    b.attempt(2).train(4, save_every=2)
    b.end(final_step=4)
    return b


def check(run_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main([str(run_dir), *extra])
    return code, capsys.readouterr().err


def test_the_untouched_run_is_valid_so_the_cases_below_can_fail(builder, capsys):
    code, _ = check(valid_run(builder(total_steps=4)).write(), capsys)
    assert code == 0


@pytest.mark.parametrize(
    "line, named",
    [
        ('{"kind": "step", "t": %s}' % DEEP, "nested too deeply"),
        ('{"kind": "step", "t": NaN, "attempt": 0}', "NaN"),
        ('{"kind": "step", "t": Infinity, "attempt": 0}', "Infinity"),
        ('{"kind": "step", "t": %s, "attempt": 0}' % ("9" * 400), "field 't'"),
        ('{"kind": "step", "t": 1e400, "attempt": 0}', "field 't'"),
        ('{"kind": "fault", "t": 1.0, "attempt": 0, "fault_id": ["a"], "rank": null}', "field 'fault_id'"),
        ('{"kind": "fault", "t": 1.0, "attempt": 0, "fault_id": {"a": 1}, "rank": null}', "field 'fault_id'"),
    ],
)
def test_an_unreadable_event_line_is_exit_2_naming_file_line_and_field(builder, capsys, line, named):
    b = valid_run(builder(total_steps=4))
    b.files[b.attempts[0].file(1)].insert(2, line)
    code, err = check(b.write(), capsys)
    assert code == 2
    assert err.count("\n") == 1 and "a000-r001" in err and "line 3" in err and named in err


@pytest.mark.parametrize("value, named", [(DEEP, "nested too deeply"), ("NaN", "NaN"), ("-Infinity", "Infinity")])
def test_an_unreadable_run_json_is_exit_2(builder, capsys, value, named):
    run_dir = valid_run(builder(total_steps=4)).write()
    spec = (run_dir / "run.json").read_text()
    (run_dir / "run.json").write_text(spec[:-1] + ', "extra": %s}' % value)  # an otherwise complete spec
    code, err = check(run_dir, capsys)
    assert code == 2 and "run.json" in err and named in err and err.count("\n") == 1


def test_an_unreadable_golden_run_is_exit_2_naming_the_golden(builder, tmp_path, capsys):
    run_dir = valid_run(builder(total_steps=4)).write()
    golden = valid_run(HistoryBuilder(tmp_path / "golden", total_steps=4)).write()
    (golden / "events" / "harness.jsonl").write_text('{"kind": "end", "t": %s}\n{"kind": "x", "t": 1}\n' % DEEP)
    code, err = check(run_dir, capsys, "--golden", str(golden))
    assert code == 2 and "golden run" in err and "nested too deeply" in err


def test_a_torn_deeply_nested_last_line_is_skipped_not_fatal(builder, capsys):
    b = valid_run(builder(total_steps=4))
    b.raw_line(b.attempts[0].file(0), '{"kind": "step", "t": ' + "[" * 100_000)
    code, _ = check(b.write(), capsys)
    assert code == 0


def test_a_golden_run_missing_steps_makes_the_verdict_unknown(builder, tmp_path, capsys):
    run_dir = valid_run(builder(total_steps=4)).write()
    whole = valid_run(HistoryBuilder(tmp_path / "whole", total_steps=4)).write()
    assert check(run_dir, capsys, "--golden", str(whole))[0] == 0  # the same golden, complete, passes
    short = HistoryBuilder(tmp_path / "short", total_steps=4)
    short.attempt(2).train(2, save_every=2)
    short.end(final_step=2)
    code = main([str(run_dir), "--golden", str(short.write()), "--json"])
    verdicts = json.loads(capsys.readouterr().out)["verdicts"]
    assert code == 2
    assert verdicts["continuity"]["valid"] == "unknown" and verdicts["coverage"]["valid"] == "unknown"
