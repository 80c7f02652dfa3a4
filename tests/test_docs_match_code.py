"""The docs that draw the code are checked against it: DESIGN.md's command-line block
against harness/cli.py COMMANDS and each command's parser, HARNESS.md's one-screen map
against the harness's modules, its layers (tests/test_architecture.py) and the launcher
registry. A command, option, module or launcher added without its doc line fails here; so does a
performance figure in GUIDE.md or the README that is not the one its benchmark run wrote."""
from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

from tests.test_architecture import HARNESS_LAYERS
from trainwreck.harness.cli import COMMANDS
from trainwreck.harness.registry import LAUNCHERS

REPO = Path(__file__).resolve().parents[1]


def cli_block(design: str) -> dict[str, str]:
    """DESIGN.md's command-line block, command -> its lines (continuations included)."""
    block = design.split("## Command-line contract", 1)[1].split("```", 2)[1]
    groups: dict[str, list[str]] = {}
    current = None
    for line in block.splitlines():
        match = re.match(r"trainwreck (\w+)", line)
        current = match.group(1) if match else (current if line.startswith(" ") else None)
        if current is not None:
            groups.setdefault(current, []).append(line)
    return {name: "\n".join(lines) for name, lines in groups.items()}


def options(name: str) -> list[str]:
    if name == "check":  # the checkers parse their own arguments (invariants/cli.py)
        return ["--golden", "--json"]
    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[name][0]).configure(parser)
    return [o for action in parser._actions for o in action.option_strings if o.startswith("--") and o != "--help"]


def cli_doc_problems(design: str) -> list[str]:
    groups = cli_block(design)
    problems = [f"command {name!r} is missing from DESIGN.md's command-line block" for name in COMMANDS
                if name not in groups]
    problems += [f"option {option} of `trainwreck {name}` is missing from its lines in DESIGN.md"
                 for name in COMMANDS if name in groups for option in options(name) if option not in groups[name]]
    return problems + [f"DESIGN.md documents `trainwreck {name}`, which harness/cli.py does not have"
                       for name in groups if name not in COMMANDS]


def harness_map(harness_doc: str) -> str:
    return harness_doc.split("## Who owns what", 1)[1].split("```", 2)[1]


def map_problems(drawn: str, root: Path = REPO) -> list[str]:
    modules = sorted(p.relative_to(root / "harness") for p in (root / "harness").glob("*/**/*.py")
                     if p.stem != "__init__" and p.parts[len((root / "harness").parts)] != "commands")
    modules += sorted(p.relative_to(root / "harness") for p in (root / "harness").glob("*.py") if p.stem != "__init__")
    problems = [f"harness/{m} is missing from HARNESS.md's map" for m in modules
                if not re.search(rf"\b{m.stem}\b", drawn)]
    words = set(re.findall(r"[a-z]+", drawn))  # a layer's name may break across lines ("run-and-" / "judge")
    problems += [f"layer {layer!r} is missing from HARNESS.md's map" for layer, _ in HARNESS_LAYERS
                 if not set(re.findall(r"[a-z]+", layer)) <= words]
    return problems + [f"launcher {name!r} is missing from HARNESS.md's map" for name in LAUNCHERS
                       if not re.search(rf"\b{name}\b", drawn)]


def test_designs_command_line_block_names_every_command_and_option() -> None:
    assert cli_doc_problems((REPO / "docs" / "DESIGN.md").read_text()) == []


def test_the_cli_check_names_a_missing_command_and_a_missing_option() -> None:
    design = (REPO / "docs" / "DESIGN.md").read_text()
    without = re.sub(r"\ntrainwreck handbook[^\n]*", "", design).replace("[--limit N]", "")
    assert cli_doc_problems(without) == [
        "command 'handbook' is missing from DESIGN.md's command-line block",
        "option --limit of `trainwreck sweep` is missing from its lines in DESIGN.md"]


def test_harness_map_names_every_module_layer_and_launcher() -> None:
    assert map_problems(harness_map((REPO / "docs" / "HARNESS.md").read_text())) == []


def test_the_map_check_names_a_module_the_map_lacks(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "newcomer.py").write_text("")
    drawn = harness_map((REPO / "docs" / "HARNESS.md").read_text())
    assert map_problems(drawn, tmp_path) == ["harness/newcomer.py is missing from HARNESS.md's map"]


def test_the_readmes_handbook_counts_are_the_codes() -> None:
    """The README states how many chapters the default handbook has and how many --full adds:
    both are read from the chapter declarations, so a chapter added without the README fails here."""
    from trainwreck.harness.suites.handbook import CHAPTERS, default_chapters

    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    default = re.search(r"\(the default set: (\d+) chapters, (\d+) runs;", readme)
    full = re.search(r"`--full` adds (\d+) chapters", readme)
    assert default and full, "README no longer states the handbook's chapter counts where this test reads them"
    assert int(default.group(1)) == len(default_chapters())
    assert int(full.group(1)) == len([c for c in CHAPTERS if c.full])


def test_the_readmes_first_screen_fits_60_lines_and_says_what_where_and_how() -> None:
    """What it is, the two commands, one picture and where to read on, all in the first 60 lines."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## Read on")
    end = next(i for i in range(start + 2, len(lines)) if not lines[i].startswith("|"))  # the table's end
    assert end <= 60, f"the first screen runs to line {end}"
    screen = "\n".join(lines[:end])
    assert "```bash" in screen and "trainwreck demo" in screen and "pytest" in screen  # the two commands
    assert "![" in screen and "docs/GUIDE.md" in screen and "proves that" in screen


BENCHMARK_RUNS = REPO / "docs" / "benchmark-runs"


def test_the_guides_standing_table_is_rendered_from_the_runs_it_names() -> None:
    """GUIDE.md, "Where each target stands": the table between its markers is `--table` of the runs'
    files the opening marker names (docs/benchmark-runs/), so no figure in it is typed by hand."""
    from trainwreck.benchmarks.standing import load_run, render

    guide = (REPO / "docs" / "GUIDE.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- standing: --table (?P<files>[^>]*?) -->\n(?P<table>.*?)<!-- /standing -->", guide, re.S)
    assert found, "GUIDE.md no longer holds the standing table between its markers"
    runs = [load_run(BENCHMARK_RUNS / name) for name in found["files"].split()]
    assert found["table"] == render(runs)[0]


def test_the_readmes_scenario_split_is_the_one_of_the_run_it_names() -> None:
    """README's "Where one kill-and-resume scenario's time goes": each `part` figure is the named
    run's `scenario_split_s` to two places, the harness's own parts summed (HARNESS_PARTS), and the
    scenario's wall its `scenario_wall_s`."""
    from trainwreck.benchmarks.scenarios import HARNESS_PARTS
    from trainwreck.benchmarks.standing import load_run

    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    found = re.search(r"Where one kill-and-resume scenario's time goes \(`scenario_split_s` of "
                      r"docs/benchmark-runs/(?P<file>[\w.-]+),(?P<text>.*?)\(docs/GUIDE\.md", readme)
    assert found, "README no longer quotes a run's scenario split where this test reads it"
    run = load_run(BENCHMARK_RUNS / found["file"])
    split = run["scenario_split_s"]
    quoted = {part: float(value) for value, part in re.findall(r"(\d+\.\d+) s \(`(\w+)`\)", found["text"])}
    assert len(quoted) >= 4 and all(quoted[part] == round(split[part], 2) for part in quoted), (quoted, split)
    assert set(HARNESS_PARTS) <= set(split)
    harness = re.search(r"the harness's own parts \([^)]*\) (\d+\.\d+) s", found["text"])
    assert harness and float(harness.group(1)) == round(sum(split[part] for part in HARNESS_PARTS), 2)
    wall = re.search(r"(\d+\.\d+) s a scenario", found["text"])
    assert wall and float(wall.group(1)) == run["scenario_wall_s"]
