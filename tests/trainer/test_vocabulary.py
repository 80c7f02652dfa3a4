"""The run format's vocabulary is spelled once per side of the layering: the writer's in
trainer/ (events.FORMAT, progress.BOARD_PHASES / TIMED_PHASES) and, where the independent
checker may import nothing of ours, once more in invariants/. Every other module imports
one of them; these tests fail when a copy drifts or a module spells its own."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.test_architecture import TOPS
from trainwreck.rundir import events
from trainwreck.trainer import progress

REPO = Path(__file__).resolve().parents[2]
SOURCE_TOPS = TOPS
FORMAT_HOMES = {"rundir/events.py", "invariants/history.py"}


def constants_equal_to(value: str, root: Path) -> list[str]:
    found = []
    for top in SOURCE_TOPS:
        for path in sorted((root / top).rglob("*.py")):
            rel = str(path.relative_to(root))
            found += [rel for node in ast.walk(ast.parse(path.read_text(), rel))
                      if isinstance(node, ast.Constant) and node.value == value]
    return found


def test_the_checker_reads_the_format_the_trainer_writes() -> None:
    from trainwreck.invariants import FORMAT

    assert FORMAT == events.FORMAT


def test_only_the_writer_and_the_checker_spell_the_run_format() -> None:
    assert set(constants_equal_to(events.FORMAT, REPO)) == FORMAT_HOMES


def test_the_format_check_finds_a_module_that_spells_it(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "x.py").write_text(f'FORMAT = "{events.FORMAT}"\n')
    assert constants_equal_to(events.FORMAT, tmp_path) == ["harness/x.py"]


def test_the_report_and_the_handbook_time_the_phases_the_trainer_declares() -> None:
    from trainwreck.report import chapters, model, rawlog

    assert rawlog.TIMED_PHASES == progress.TIMED_PHASES == chapters.PHASES
    assert set(model.OWN_PHASES) <= set(progress.TIMED_PHASES)


def test_every_phase_the_trainer_publishes_or_times_is_a_board_phase() -> None:
    spelled = set()
    for path in sorted((REPO / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("phase", "mark") and node.args
                    and isinstance(node.args[-1], ast.Constant) and isinstance(node.args[-1].value, str)):
                spelled.add(node.args[-1].value)
    assert spelled and spelled <= set(progress.BOARD_PHASES), spelled - set(progress.BOARD_PHASES)
