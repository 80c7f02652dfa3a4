"""The golden cache key of a `--cmd` job: everything that shapes an uninterrupted run of it.

A user's script is rarely one file: it imports its own `datautils.py`, `model.py`, a package
beside it. A key over the command line alone kept a stale golden run after such an edit, and
the next fault-free run was judged against the old code. So the key covers the command line,
the bytes of every file it names, every source file those import from the user's own tree
(followed transitively), and the installed versions of torch and trainwreck (with the bytes
of the probe, whose digest rule is in every golden event).

The imports are found statically (`ast`), without running anything: every `import`/`from`
statement anywhere in a file (inside functions and `try` blocks too), resolved against the
user's tree, that is the script's own directory, the working directory and `PYTHONPATH`
(never site-packages or the standard library: their versions are in the key or fixed). A
module imported by a computed name (`importlib.import_module(cfg.model)`) is invisible to
this; `--fresh-golden` rebuilds on demand. Measured in docs/FRAMEWORKS.md.
"""
from __future__ import annotations

import ast
import hashlib
import os
import platform
import shlex
import sys
import sysconfig
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

VERSIONED = ("torch", "trainwreck")
"""Installed distributions whose version is part of every --cmd golden key."""
MAX_FILES = 2000
"""A tree that imports more of itself than this is hashed that far (a runaway, not a training script)."""


@dataclass
class Sources:
    """What a command's golden run depends on: its files (named or imported) and the installed versions."""

    files: list[Path] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)


def command_sources(command: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Sources:
    """Every file of the user's tree the command names or (transitively) imports."""
    cwd = Path(cwd or Path.cwd())
    words = shlex.split(command)
    # The interpreter itself is named but is no source: its version is in the key instead.
    named = [cwd / w for w in words if (cwd / w).is_file() and not _interpreter(cwd / w)]
    roots = _roots(cwd, named, env if env is not None else os.environ)
    start = [p for p in named if p.suffix == ".py"]
    for i, word in enumerate(words[:-1]):
        if word == "-m":  # python -m package.module
            start += _module_files(words[i + 1], roots)
    seen: dict[Path, None] = {p.resolve(): None for p in [*named, *start]}
    queue = [p.resolve() for p in start]
    while queue and len(seen) < MAX_FILES:
        path = queue.pop()
        for found in imported_files(path, roots):
            if found not in seen:
                seen[found] = None
                queue.append(found)
    versions = {name: _version(name) for name in VERSIONED}
    versions["python"] = platform.python_version()
    return Sources(sorted(seen), versions)


def cmd_golden_key(command: str, world_size: int, cwd: Path | None = None) -> str:
    """The cache key: command line and world size, each source file's path and bytes, the versions,
    and the probe's own source (its digest rule)."""
    sources = command_sources(command, cwd)
    h = hashlib.sha256(f"{command} @{world_size}".encode())
    for path in sources.files:
        h.update(b"\0" + str(path).encode() + b"\0")
        h.update(_read(path))
    for name, version in sorted(sources.versions.items()):
        h.update(f"\0{name}=={version}".encode())
    h.update(_read(Path(__file__).resolve().parents[2] / "trainer" / "probe.py"))
    return h.hexdigest()[:20]


def imported_files(path: Path, roots: list[Path]) -> list[Path]:
    """Files of the user's tree that one source file imports (absolute and relative imports)."""
    try:
        tree = ast.parse(_read(path), filename=str(path))
    except (SyntaxError, ValueError):
        return []  # not Python we can read: its bytes are still in the key
    found: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _module_files(alias.name, roots)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, path, roots)
            if base is None:
                continue
            found += _module_files(base, roots) if base else []
            for alias in node.names:  # `from pkg import mod` may name a submodule
                if alias.name != "*":
                    found += _module_files(f"{base}.{alias.name}" if base else alias.name, roots)
    return found


def _absolute(node: ast.ImportFrom, path: Path, roots: list[Path]) -> str | None:
    """The absolute module name of a `from ... import`; None when a relative one leaves the tree."""
    if not node.level:
        return node.module or ""
    package = path.parent
    for _ in range(node.level - 1):
        package = package.parent
    for root in roots:
        try:
            parts = package.relative_to(root).parts
        except ValueError:
            continue
        return ".".join([*parts, *([node.module] if node.module else [])])
    return None


def _module_files(name: str, roots: list[Path]) -> list[Path]:
    """The files that importing `name` runs from the user's tree: the module and its packages' __init__."""
    parts = name.split(".")
    for root in roots:
        out = []
        for depth in range(1, len(parts) + 1):
            base = root.joinpath(*parts[:depth])
            module, package = base.with_suffix(".py"), base / "__init__.py"
            if package.is_file():
                out.append(package.resolve())
            elif module.is_file() and depth == len(parts):
                out.append(module.resolve())
            elif not base.is_dir():
                break
        if out:
            return out
    return []


def _roots(cwd: Path, named: list[Path], env: dict[str, str] | os._Environ[str]) -> list[Path]:
    """Where the command's own modules come from: the script's directory (sys.path[0]), the working
    directory, PYTHONPATH; never a directory of the installed interpreter's libraries."""
    candidates = [p.parent for p in named if p.suffix == ".py"] + [cwd]
    candidates += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    installed = {Path(p).resolve() for p in (sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"),
                                             sysconfig.get_path("platlib")) if p}
    roots: list[Path] = []
    for path in candidates:
        path = path.resolve()
        if path.is_dir() and path not in roots and not any(path == i or i in path.parents for i in installed):
            roots.append(path)
    return roots


def _interpreter(path: Path) -> bool:
    """A Python interpreter (or anything of the installation's own): not the user's source."""
    resolved = path.resolve()
    homes = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    return resolved == Path(sys.executable).resolve() or (
        resolved.suffix != ".py" and any(h in resolved.parents for h in homes))


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""

