"""One error root and one exit path: commands raise, harness/cli.py `run_command` prints
the one line and picks exit 2."""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainwreck.harness import cli
from trainwreck.harness.errors import INPUT_ERRORS, SpecError
from trainwreck.invariants import InputError as RunInputError
from trainwreck.rundir import errors
from trainwreck.trainer import config
from trainwreck.rundir.errors import InputError, UnknownName

COMMANDS = Path(__file__).resolve().parents[2] / "harness" / "commands"
HAND_WRITTEN_EXIT = re.compile(r"return 2\b|return EXIT_UNKNOWN\b|exit\(2\)|error:")


def hand_written_exits(folder: Path) -> list[str]:
    return [f"{path.name}:{n}: {line.strip()}" for path in sorted(folder.glob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if HAND_WRITTEN_EXIT.search(line)]


def test_no_command_prints_error_or_returns_2_itself() -> None:
    assert hand_written_exits(COMMANDS) == [], "raise an InputError; harness/cli.py run_command reports it"


def test_the_exit_check_finds_a_hand_written_exit_it_is_shown(tmp_path: Path) -> None:
    (tmp_path / "c.py").write_text('def main():\n    print("trainwreck c: error: bad")\n    return 2\n')
    assert hand_written_exits(tmp_path) == ['c.py:2: print("trainwreck c: error: bad")', "c.py:3: return 2"]


def test_the_config_error_the_trainer_raises_is_the_one_definition() -> None:
    assert config.ConfigError is errors.ConfigError and issubclass(config.ConfigError, InputError)
    assert issubclass(SpecError, InputError) and issubclass(UnknownName, InputError)


def test_the_exit_path_takes_both_roots() -> None:
    assert set(INPUT_ERRORS) == {InputError, RunInputError}


def test_an_unknown_name_is_a_key_error_that_reads_as_a_sentence() -> None:
    from trainwreck.harness.supervise.scenarios import get_scenario

    with pytest.raises(KeyError) as caught:
        get_scenario("nope")
    assert isinstance(caught.value, InputError) and str(caught.value).startswith("unknown scenario 'nope'")


@pytest.mark.parametrize("error", [InputError("bad --x 3\nuse 4"), RunInputError("run.json: missing")])
def test_run_command_prints_one_line_and_exits_2_for_either_root(error: Exception,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def main(args: argparse.Namespace) -> int:
        raise error

    code = cli.run_command("demo", SimpleNamespace(main=main), argparse.Namespace())
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("trainwreck demo: error: ")


@pytest.mark.parametrize("argv, message", [
    (["demo", "--scenarios", "nope"], "unknown scenario 'nope'"),
    (["defects", "--only", "nope"], "unknown defect 'nope'"),
    (["chaos", "--budget", "soon"], "--budget: budget 'soon' is not a duration"),
    (["run", "--world-sizes", "a,b"], "--world-sizes 'a,b': expected integers"),
    (["frameworks", "--frameworks", "nope"], "--frameworks 'nope' is unknown"),
    (["sweep", "--power-loss", "--points", "0:before"], "--points names process-crash points"),
])
def test_bad_input_to_a_command_is_exit_2_and_one_line(argv: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainwreck {argv[0]}: error: ") and message in err and err.count("\n") == 1
