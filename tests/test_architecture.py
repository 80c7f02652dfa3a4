"""Imports run one way: the layout table of docs/DESIGN.md, and no cycles.

Every import counts, the ones inside functions too: a lazy import that closes a cycle is
still a cycle, only hidden from the interpreter's start-up."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPS = ("rundir", "trainer", "faults", "invariants", "report", "harness", "benchmarks")

# docs/DESIGN.md, "Layout": which of our folders each folder may import.
MAY_IMPORT: dict[str, set[str]] = {
    # The run directory's format, its file layer and the input-error root: what every layer shares.
    "rundir": set(),
    "trainer": {"rundir"},
    "faults": {"rundir", "trainer"},
    "invariants": set(),  # standalone on purpose: its own loader, stdlib and orjson (numpy: vectors.py alone)
    # The report reads run directories and verdicts and writes prose: it runs nothing, so it
    # sits above the checkers and below the runner that calls it.
    "report": {"rundir", "trainer", "faults", "invariants"},
    "harness": {"rundir", "trainer", "faults", "invariants", "report"},
    "benchmarks": {"rundir", "trainer", "faults", "invariants", "report", "harness"},
}
# The harness is layered too: a module may import harness modules of its own layer or below.
HARNESS_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("declarations", ("harness.errors", "harness.registry")),
    ("launch", ("harness.launch",)),
    ("supervise", ("harness.supervise",)),
    ("run-and-judge", ("harness.judge",)),
    ("suites", ("harness.suites",)),
    ("front ends", ("harness.cli", "harness.commands", "harness.pytest_plugin")),
)
# ... and which third-party packages (everything else must be the standard library).
THIRD_PARTY: dict[str, set[str]] = {
    "rundir": set(),
    "trainer": {"torch", "numpy"},
    "faults": {"torch", "hypothesis"},
    "invariants": {"orjson", "msgspec"},  # msgspec optional (extra `fast`): loader.py imports it guarded
    "report": set(),  # standard library only: a report renders where torch is not installed
    "harness": {"torch", "psutil", "hypothesis", "pytest", "_pytest"},
    "benchmarks": {"torch", "psutil"},
}

# ... and per module, where one module alone may use an optional extra (the framework
# adapters): the rest of its folder still may not.
THIRD_PARTY_MODULES: dict[str, set[str]] = {
    "trainer.checksum": {"blake3"},
    "invariants.vectors": {"numpy"},  # long columns only, imported inside its functions: a small check never loads it  # the checkpoint checksum's one home: every other module asks it
    "trainer.frameworks.hf": {"transformers"},
    "trainer.frameworks.lightning": {"lightning"},
    "trainer.frameworks.accelerate": {"accelerate"},
    "trainer.frameworks.torchft_adapter": {"torchft"},
    "trainer.frameworks.torchft_train": {"torchft"},
    "trainer.frameworks.ray_train": {"ray", "psutil"},  # the [ray-train] extra; psutil is a dependency of the package: Ray Train's rows only
    "faults.foreign": {"safetensors"},
    "faults.foreign_record": {"safetensors"},
    "report.metrics": {"prometheus_client"},  # the [metrics] extra: report --metrics only
    "benchmarks.loader": {"torchdata"},  # the [torchdata] extra: StatefulDataLoader, when installed
    "harness.suites.rayengine": {"ray"},  # the [ray] extra: --engine ray only  # wraps serialize_file when installed, as faults.foreign does
}


# Example training scripts users copy: installed with the package, but scripts run by path,
# importing their own siblings by bare name (a user's `model.py`), not modules of ours.
SCRIPT_FOLDERS = (REPO / "trainer" / "frameworks" / "examples",)


def module_files() -> dict[str, Path]:
    found = {}
    for top in TOPS:
        for path in (REPO / top).rglob("*.py"):
            if any(path.is_relative_to(folder) for folder in SCRIPT_FOLDERS):
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(module: str, path: Path) -> set[str]:
    """Absolute dotted names of every import in the file, wherever it stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    # `from trainwreck import trainer` names the namespace itself, which holds no code.
    return {n[len("trainwreck."):] if n.startswith("trainwreck.") else n for n in names if n != "trainwreck"}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for name in imported_names(module, path):
            while name and name not in files:
                name = name.rpartition(".")[0]
            # A package's __init__ importing its own submodules is how packages re-export.
            if name and name != module and not (path.name == "__init__.py" and name.startswith(module + ".")):
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle_it_is_shown():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_form_no_cycle_even_counting_imports_inside_functions():
    assert cycles(import_graph()) == []


def test_no_module_imports_the_package_that_re_exports_it():
    """The cycle finder ignores a package's __init__ importing its submodules (that is how a
    package re-exports), so a submodule importing its package back would close a cycle unseen."""
    files = module_files()
    hidden = sorted(
        f"{module} -> {name}" for module, path in files.items() for name in imported_names(module, path)
        # `from package import submodule` names a module, not the package's re-exports
        if name not in files and (package := name.rpartition(".")[0]) in files
        and module.startswith(package + ".") and module in imported_names(package, files[package]))
    assert hidden == []


def test_every_import_between_folders_follows_the_layout_table():
    breaches = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                      for target in targets
                      if target.split(".")[0] != module.split(".")[0]
                      and target.split(".")[0] not in MAY_IMPORT[module.split(".")[0]])
    assert breaches == []


def harness_layer(module: str) -> int:
    for level, (_, prefixes) in enumerate(HARNESS_LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    raise AssertionError(f"{module} is in no harness layer: add it to HARNESS_LAYERS (and docs/HARNESS.md)")


def test_harness_modules_import_only_their_own_layer_or_below():
    graph = import_graph()
    upward = sorted(f"{m} ({HARNESS_LAYERS[harness_layer(m)][0]}) -> {t} ({HARNESS_LAYERS[harness_layer(t)][0]})"
                    for m, targets in graph.items() if m.startswith("harness.")
                    for t in targets if t.startswith("harness.") and harness_layer(t) > harness_layer(m))
    assert upward == []


def test_every_third_party_import_is_one_the_folder_may_use():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    files = module_files()
    breaches = sorted(
        f"{module} imports {name}" for module, path in files.items() for name in imported_names(module, path)
        if (top := name.split(".")[0]) not in stdlib and top not in TOPS and top
        and top not in THIRD_PARTY[module.split(".")[0]] | THIRD_PARTY_MODULES.get(module, set()))
    assert breaches == []


def test_every_harness_layer_between_the_declarations_and_the_front_ends_is_a_folder():
    """The tree draws the map (docs/HARNESS.md): a module at harness/'s top is a declaration or a
    front end; everything else lives in its layer's folder, named like the layer's prefix."""
    top_level = {f"harness.{p.stem}" for p in (REPO / "harness").glob("*.py") if p.stem != "__init__"}
    edges = {prefix for name, prefixes in HARNESS_LAYERS if name in ("declarations", "front ends")
             for prefix in prefixes}
    assert top_level - edges == set()
    for name, prefixes in HARNESS_LAYERS:
        if name not in ("declarations", "front ends"):
            assert all((REPO / prefix.replace(".", "/") / "__init__.py").is_file() for prefix in prefixes), name
