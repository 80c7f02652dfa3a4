"""Which tests share an xdist worker: a test module that declares a module-scoped fixture runs whole
on one worker, so the fixture is built once; every other test is scheduled alone (what `--dist
loadgroup` does for tests without a group).

Spread over both workers, each worker built its own copy of such a fixture: the handbook's 23 runs
(135 s) and the hang chapter's runs (31 s) twice in CI. pytest-xdist's `xdist_group` mark, which
kept the handbook on one worker before, is silently lost with pytest 9.2 (the worker appends the
group to the test's node id, and pytest 9.2 ignores the change: pytest-dev/pytest-xdist#1386), so
the grouping is made here, by xdist's scheduler hook, from the node ids the controller has."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODULE_FIXTURE = re.compile(r"@pytest\.fixture\([^)]*scope=[\"']module[\"']")


def modules_with_module_fixtures(root: Path = ROOT) -> frozenset[str]:
    """Test modules (paths as node ids start) whose source declares a module-scoped fixture."""
    return frozenset(path.relative_to(root).as_posix() for path in (root / "tests").rglob("test_*.py")
                     if MODULE_FIXTURE.search(path.read_text(encoding="utf-8")))


ONE_WORKER = modules_with_module_fixtures()


def scope_of(nodeid: str) -> str:
    """The unit a worker gets whole: the module for ONE_WORKER's modules, else the test itself."""
    module = nodeid.split("::", 1)[0]
    return module if module in ONE_WORKER else nodeid


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None  # another --dist was asked for: xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    class ModulesOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ModulesOnOneWorker(config, log)
