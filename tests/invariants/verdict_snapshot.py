"""Every verdict the checker gives on a corpus of run directories, to compare two versions of it.

A change to the reader or to a checker for speed or memory must not change one word a user
sees. The suite's tests write hundreds of run directories (hand-built histories, hostile
files, scenario runs); this tool judges each of them every way the reader can take -
the default streaming reader, tiny blocks (every block boundary in a new place), the forked
parallel workers, the reference reader, every column on disk (tests/invariants/readers.py) -
and, for the runs a
test wrote side by side, each one against the others as its golden run, and writes what
`judge` says (valid, summaries, counts, evidence, notes, or the InputError) as JSON:

    python -m pytest -q -n 2 tests/invariants --basetemp=/tmp/corpus   # the corpus
    python tests/invariants/verdict_snapshot.py snapshot /tmp/corpus before.json
    ... change the checker ...
    python tests/invariants/verdict_snapshot.py snapshot /tmp/corpus after.json
    python tests/invariants/verdict_snapshot.py compare before.json after.json

Copy the corpus aside first if later test runs may reuse the basetemp.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from trainwreck.invariants import InputError, judge, load_history
from trainwreck.invariants import loader

sys.path.insert(0, str(Path(__file__).parent))
from readers import reference_judgement, run_dirs_under, spilled_judgement  # noqa: E402

MAX_GOLDEN_PEERS = 6  # run directories side by side judged against each other (pairs grow as n^2)


def _judged(run_dir: Path, golden: Path | None = None) -> Any:
    try:
        history = load_history(run_dir)
        reference = load_history(golden) if golden is not None else None
    except InputError as exc:
        return f"InputError: {exc}"
    return {"judgement": judge(history, reference).to_json(), "events": history.event_count}


def _with(settings: dict[str, Any], fn: Callable[[], Any]) -> Any:
    saved = {name: getattr(loader, name) for name in settings}
    for name, value in settings.items():
        setattr(loader, name, value)
    try:
        return fn()
    finally:
        for name, value in saved.items():
            setattr(loader, name, value)


def _small_block(run_dir: Path) -> int:
    """97 bytes, so that block boundaries fall everywhere; 64 KiB + 1 for a directory whose
    files are big (a 2 GiB sparse tail would be skimmed 97 bytes at a time)."""
    events = run_dir / "events"
    files = [p for p in events.iterdir() if p.is_file()] if events.is_dir() else []
    big = sum(p.stat().st_size for p in files if not p.is_symlink()) > 1 << 20
    return 65537 if big else 97


WAYS: dict[str, Callable[[Path], Any]] = {
    "default": lambda d: _judged(d),
    "small_blocks": lambda d: _with({"BLOCK": _small_block(d)}, lambda: _judged(d)),
    "parallel": lambda d: _with({"PARALLEL_MIN_BYTES": 0, "WORKERS": 2}, lambda: _judged(d)),
    "reference": reference_judgement,
    "spilled": spilled_judgement,  # every column on disk (invariants/spill.py), in chunks of 3 values
}


def snapshot(root: Path) -> dict[str, Any]:
    root = Path(root)
    out: dict[str, Any] = {}
    dirs = run_dirs_under(root)
    for run_dir in dirs:
        rel = str(run_dir.relative_to(root))
        for way, fn in WAYS.items():
            print(rel, way, file=sys.stderr, flush=True)
            out[f"{rel} [{way}]"] = _scrub(fn(run_dir), root)
    by_parent: dict[Path, list[Path]] = {}
    for run_dir in dirs:
        by_parent.setdefault(run_dir.parent, []).append(run_dir)
    for peers in by_parent.values():
        peers = peers[:MAX_GOLDEN_PEERS]
        for run_dir in peers:
            for golden in peers:
                if golden != run_dir:
                    rel = f"{run_dir.relative_to(root)} [golden {golden.name}]"
                    out[rel] = _scrub(_judged(run_dir, golden), root)
    return out


def _scrub(value: Any, root: Path) -> Any:
    """Absolute paths of the corpus as `<corpus>`, so that a copied corpus compares equal."""
    text = json.dumps(value, sort_keys=True, default=repr)
    for prefix in {str(root), os.path.realpath(root)}:
        text = text.replace(prefix, "<corpus>")
    return json.loads(text)


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    diffs = [f"only before: {k}" for k in sorted(before.keys() - after.keys())]
    diffs += [f"only after: {k}" for k in sorted(after.keys() - before.keys())]
    for key in sorted(before.keys() & after.keys()):
        if before[key] != after[key]:
            diffs.append(f"differs: {key}\n  before: {json.dumps(before[key])[:600]}\n  after:  {json.dumps(after[key])[:600]}")
    return diffs


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "snapshot":
        result = snapshot(Path(argv[1]))
        Path(argv[2]).write_text(json.dumps(result, sort_keys=True, indent=0))
        print(f"{len(result)} judgements of run directories under {argv[1]} -> {argv[2]}")
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        diffs = compare(json.loads(Path(argv[1]).read_text()), json.loads(Path(argv[2]).read_text()))
        print("\n".join(diffs) or f"identical: {len(json.loads(Path(argv[1]).read_text()))} judgements")
        return 1 if diffs else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
