"""Walk tracer (tests/test_walks.py): imported by every Python process of a traced run through
PYTHONPATH, it writes which of the repository's modules are on the call stack at each milestone of
the run: the plan read, a rank process started, a fault acting inside a rank (a signal or fork there),
the verdict, the report. The union of those stacks is the walk a reader follows from the command line
to the verdict. The harness's own cleanup signals are not milestones: whether a survivor is still
there to be signalled is a race, and the walk must not depend on it.

Profiling, not tracing: only calls are seen (no line events), and only a name comparison is made
per call, so a traced run takes about twice as long, not ten times."""
import json
import os
import sys

_REPO = os.environ.get("TRAINWRECK_WALK_REPO", "")
_OUT = os.environ.get("TRAINWRECK_WALK_OUT", "")
_CALLS = {"parse_plan": "faults/plan.py", "judge": "invariants/judge.py", "render_report": "report/render.py",
          "_execute_child": "subprocess.py"}
_C_CALLS: dict = {}


def _record(frame, what: str) -> None:
    modules: list[str] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_REPO) and not name.startswith(os.path.join(_REPO, "tests")):
            module = os.path.relpath(name, _REPO)
            if module not in modules:
                modules.append(module)
        frame = frame.f_back
    with open(os.path.join(_OUT, f"walk-{os.getpid()}.jsonl"), "a") as out:
        out.write(json.dumps({"at": what, "modules": modules[::-1]}) + "\n")


def _profile(frame, event, arg):
    if event == "call":
        path = _CALLS.get(frame.f_code.co_name)
        if path is not None and frame.f_code.co_filename.endswith(path):
            _record(frame, frame.f_code.co_name)
    elif event == "c_call":
        what = _C_CALLS.get(arg)
        if what is not None and os.getpid() != _ROOT:
            _record(frame, what)


_ROOT = int(os.environ.setdefault("TRAINWRECK_WALK_ROOT", str(os.getpid())))
"""The first traced process (the CLI): its children inherit its pid through the environment."""
if _REPO and _OUT:
    _C_CALLS.update({os.kill: "os.kill", os.fork: "os.fork"})
    sys.setprofile(_profile)
    import threading

    threading.setprofile(_profile)
