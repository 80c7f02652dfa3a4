"""Composition, crash safety, unfired faults, and `trainwreck check`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from histories import HistoryBuilder, digest, golden_run

from trainwreck.invariants import Verdict, check_safe, compose, intervals, judge
from trainwreck.invariants.cli import main

KILL = {"id": "k1", "kind": "kill", "rank": 1, "step": 6}


def good_run(b: HistoryBuilder) -> HistoryBuilder:
    b.attempt(2).train(5, save_every=2).crash(1, "k1")
    b.attempt(2, restore="step-00000004").train(8)
    b.end()
    return b


def test_composition_is_false_over_unknown_over_true():
    assert compose([True, True]) is True
    assert compose([True, "unknown"]) == "unknown"
    assert compose(["unknown", False, True]) is False
    assert compose([]) == "unknown"


def test_a_checker_that_crashes_is_unknown_never_a_pass():
    def broken(history, golden=None):
        raise ZeroDivisionError("oops")

    verdict = check_safe("coverage", broken, None)
    assert verdict.valid == "unknown"
    assert verdict.summary == "checker crashed: ZeroDivisionError: oops"


def test_sample_ids_print_as_intervals():
    assert intervals([9, 3, 4, 5]) == "3-5,9"
    assert intervals([]) == ""
    assert intervals(range(0, 100, 2), limit=3) == "0,2,4 (+47 more ids)"


def test_verdicts_are_frozen():
    verdict = Verdict("x", True, "fine")
    with pytest.raises(AttributeError):
        verdict.valid = False  # type: ignore[misc]


def test_valid_run_is_valid(builder):
    judgement = judge(good_run(builder(total_steps=8, faults=[KILL])).load())
    assert judgement.valid is True, {n: v.summary for n, v in judgement.verdicts.items()}
    assert list(judgement.verdicts) == ["coverage", "continuity", "atomicity", "hang", "replicas", "progress"]


def test_planned_fault_that_never_fired_makes_the_run_unknown(builder):
    b = builder(total_steps=8, faults=[KILL])
    b.attempt(2).train(8)
    b.end()
    judgement = judge(b.load())
    assert all(v.valid is True for v in judgement.verdicts.values())
    assert judgement.valid == "unknown"
    assert judgement.unfired_faults == ["k1"]


def test_a_violation_outweighs_an_unfired_fault(builder):
    b = builder(total_steps=8, faults=[KILL, {"id": "k2", "kind": "kill"}])
    good_run(b)
    b.attempts[1].emit(0, "step", step=8, loss=0.0, digest="other")
    assert judge(b.load()).valid is False


def test_fault_that_fired_twice_counts_once(builder):
    b = builder(total_steps=8, faults=[KILL])
    good_run(b)
    b.attempts[0].fault("k1", rank=1)
    assert judge(b.load()).valid is True


# -- the command line ------------------------------------------------------------


def golden(builder, digests=digest):
    return golden_run(builder("golden").dir, total_steps=8, digests=digests)


def test_check_exits_0_on_a_valid_run_and_prints_a_table(builder, capsys):
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    assert main([str(run), "--golden", str(golden(builder))]) == 0
    out = capsys.readouterr().out
    assert "VALID    coverage" in out and out.rstrip().endswith("overall: VALID")


def test_check_exits_1_on_an_invalid_run_with_evidence_lines(builder, capsys):
    b = builder(total_steps=8, faults=[KILL])
    b.attempt(2).train(5, save_every=2).crash(1, "k1")
    b.attempt(2, restore="step-00000002").train(8)
    b.end()
    assert main([str(b.write())]) == 1
    out = capsys.readouterr().out
    assert "INVALID  atomicity" in out
    assert "    - attempt 1 restored step-00000002" in out


def test_check_json_has_the_contract_shape(builder, capsys):
    golden = builder("golden", total_steps=8)
    golden.attempt(2).train(8)
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    assert main([str(run), "--golden", str(golden.write()), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["valid"] is True
    assert set(payload["verdicts"]) == {"coverage", "continuity", "atomicity", "hang", "replicas", "progress"}
    for verdict in payload["verdicts"].values():
        assert verdict["valid"] in (True, False, "unknown") and isinstance(verdict["summary"], str)


def test_check_exits_2_when_the_run_is_unknown(builder, capsys):
    b = builder(total_steps=8, faults=[KILL])
    b.attempt(2).train(8)
    b.end()
    assert main([str(b.write()), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["valid"] == "unknown"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda run: (run / "run.json").unlink(), "run.json: missing"),
        (lambda run: (run / "run.json").write_text("{oops"), "run.json: line 1 column 2"),
        (lambda run: (run / "events" / "harness.jsonl").write_text('{"kind": "end"\n{"kind": "end", "t": 1}\n'), "events/harness.jsonl line 1"),
    ],
)
def test_unusable_input_exits_2_with_a_message_not_a_traceback(builder, capsys, damage, message):
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    damage(run)
    assert main([str(run), "--json"]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err
    assert json.loads(captured.out)["valid"] == "unknown"


def test_unusable_golden_run_exits_2(builder, capsys, tmp_path):
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    assert main([str(run), "--golden", str(tmp_path / "nowhere")]) == 2
    assert "golden run:" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2


def test_python_dash_m_invariants_runs_the_check(builder):
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    # A real interpreter: the installed pytest plugin puts this distribution's modules
    # under assertion rewriting, which runpy cannot execute as __main__.
    result = subprocess.run([sys.executable, "-m", "trainwreck.invariants", str(run), "--json",
                             "--golden", str(golden(builder))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["valid"] is True


def test_invariants_import_no_torch_and_numpy_only_inside_the_vectors_functions():
    import ast

    from trainwreck import invariants
    from trainwreck.invariants import vectors

    modules = [m for m in sys.modules.values() if getattr(m, "__file__", None) and "/invariants/" in m.__file__]
    assert invariants.__file__ and vectors in modules
    for module in modules:
        source = open(module.__file__).read()
        banned = {"torch"} if module is vectors else {"torch", "numpy"}
        assert not any(f"import {name}" in source or f"from {name}" in source for name in banned), module
    top_level = [node for node in ast.parse(open(vectors.__file__).read()).body if isinstance(node, ast.Import)]
    assert not [alias.name for node in top_level for alias in node.names if alias.name == "numpy"]


def test_judging_a_short_run_leaves_numpy_unimported_and_a_long_column_imports_it(builder):
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    probe = ("import sys; from trainwreck.invariants import judge, load_history, vectors; "
             f"judge(load_history({str(run)!r})); short = 'numpy' in sys.modules; "
             "vectors.VECTOR_MIN = 0; judge(load_history(sys.argv[1])); print(short, 'numpy' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def record_golden(run, golden) -> None:
    """What `trainwreck run` leaves: verdicts.json naming the golden run it judged against."""
    (run / "verdicts.json").write_text(json.dumps({"valid": True, "verdicts": {}, "golden": str(golden)}))


def test_a_restarted_run_judged_with_no_golden_run_is_never_valid_and_names_the_fix(builder, capsys):
    """Only a golden run shows a resume that lost the RNG or the LR schedule: without one the
    comparison was skipped, so the run is not judged (exit 2), never VALID."""
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    assert main([str(run)]) == 2
    out = capsys.readouterr().out
    assert out.rstrip().endswith("overall: UNKNOWN")
    assert "not judged without a golden run" in out and "pass --golden DIR" in out and "no verdicts.json" in out
    one_attempt = builder("single", total_steps=8)
    one_attempt.attempt(2).train(8)
    one_attempt.end()
    assert main([str(one_attempt.write())]) == 0, "one attempt resumes nothing: no golden run needed"


def test_check_uses_the_golden_run_verdicts_json_names_and_says_so(builder, capsys):
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    uninterrupted = golden(builder)
    record_golden(run, uninterrupted)
    assert main([str(run)]) == 0
    assert f"note: golden run: {uninterrupted}, which verdicts.json names" in capsys.readouterr().out


def test_a_resume_only_the_recorded_golden_run_catches_is_invalid_without_golden(builder, capsys):
    """rng_not_restored in small: every restore equals its save, yet from step 6 the run leaves
    the uninterrupted run (here the golden run's digests differ from step 6 on)."""
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    record_golden(run, golden(builder, digests=lambda k: digest(k) if k < 6 else f"other-{k}"))
    assert main([str(run)]) == 1
    assert "INVALID  continuity" in capsys.readouterr().out


def test_a_recorded_golden_run_that_is_gone_is_said_and_not_judged(builder, capsys, tmp_path):
    run = good_run(builder(total_steps=8, faults=[KILL])).write()
    record_golden(run, tmp_path / "deleted-golden")
    assert main([str(run), "--json"]) == 2
    payload = json.loads(capsys.readouterr().out)
    assert payload["valid"] == "unknown" and "golden" not in payload
    assert any("deleted-golden, no longer exists" in n and "--golden DIR" in n for n in payload["notes"])
