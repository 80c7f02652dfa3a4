"""Which tests share an xdist worker: each module in ONE_WORKER runs whole on one worker, so its
module fixtures are built once; every other test is scheduled alone (what `--dist loadgroup` does).

pytest-xdist's own `xdist_group` mark stopped working with pytest 9.2: the worker appends the
group to the test's node id, and pytest 9.2 ignores that change, so the group is silently lost
(pytest-dev/pytest-xdist#1386). CI then built the handbook's 23 runs on both workers (151 s each).
The grouping is made here instead, by xdist's documented scheduler hook, from the node ids the
controller already has."""
from __future__ import annotations

from typing import Any

ONE_WORKER = frozenset({
    "tests/report/test_handbook.py",  # one module fixture builds the default handbook: about 2 minutes of 23 runs
})


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
