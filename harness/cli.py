"""The `trainwreck` command: a thin dispatcher over one module per subcommand.

Each command module exposes `configure(parser)` and `main(args) -> int`; exit codes
everywhere are 0 valid, 1 invalid, 2 not judged (unknown verdict or unusable input,
reported in one line, never a traceback), 130 interrupted by Ctrl-C, 143 by SIGTERM.
"""
from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from typing import Any, TextIO

# Only this before `main` runs: the rest is imported inside it (the checkers' package alone takes
# most of a second on a loaded machine), where a Ctrl-C meanwhile becomes the one line.
from trainwreck.rundir.arguments import end_without_collecting  # stdlib
from trainwreck.harness.supervise.interrupts import Received, Terminated, deferred, interrupt_of, stop_on_signals  # stdlib

# Subcommand → (module, one-line help). Modules are imported only when their command
# runs, so `trainwreck check` never pays for torch.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("trainwreck.harness.commands.demo", "a short chaos run over built-in scenarios, ending in a casebook"),
    "run": ("trainwreck.harness.commands.run", "one job under faults, judged against a golden run"),
    "check": ("trainwreck.invariants.cli", "re-judge a stored run directory"),
    "chaos": ("trainwreck.harness.commands.chaos", "random fault plans until the time budget is spent"),
    "sweep": ("trainwreck.harness.commands.sweep", "crash at every file operation of a checkpoint save"),
    "defects": ("trainwreck.harness.commands.defects", "run the planted-defect self-test table"),
    "handbook": ("trainwreck.harness.commands.handbook", "interview questions answered by runs made on the spot"),
    "report": ("trainwreck.harness.commands.report", "(re)render the report of a run directory"),
    "scenarios": ("trainwreck.harness.commands.scenarios", "list the built-in scenarios (--all: every suite's)"),
    "frameworks": ("trainwreck.harness.commands.frameworks", "judge real trainers (torchrun script, HF Trainer, Lightning, accelerate) under faults"),
}

def main(argv: list[str] | None = None) -> int:
    end_without_collecting()
    argv = list(sys.argv[1:] if argv is None else argv)
    stdout, sys.stdout = sys.stdout, ReaderMayLeave(sys.stdout)  # `... | head -1`: the exit code still says the verdict
    # From the first moment: a Ctrl-C or SIGTERM while torch imports stops the command with one line.
    said: Received | None = None
    try:
        with stop_on_signals():
            try:
                code = dispatch(argv)
                sys.stdout.flush()
                return code
            except (KeyboardInterrupt, Terminated) as exc:
                said = interrupt_of(exc)
                return interrupted(argv[0] if argv else "", said)
    except (KeyboardInterrupt, Terminated) as exc:
        # A signal that landed while stop_on_signals put the old handlers back (Python's own SIGINT
        # handler raises then): the command is stopping anyway, so the one line, once, and its code;
        # left to propagate it killed the process by SIGINT (exit -2) after the line was printed.
        if said is not None:
            return said.exit_code
        return interrupted(argv[0] if argv else "", interrupt_of(exc))
    finally:
        sys.stdout = stdout


def dispatch(argv: list[str]) -> int:
    from trainwreck.harness.launch.procs import one_openmp_thread  # stdlib-only
    from trainwreck.harness.launch.torchcache import keep_torch_cache_out_of_tmp  # stdlib-only
    from trainwreck.invariants.verdict import EXIT_UNKNOWN, EXIT_VALID
    from trainwreck.rundir.arguments import OneLineParser

    keep_torch_cache_out_of_tmp()  # before any command imports torch; its ranks inherit it
    one_openmp_thread()  # likewise: torch's OpenMP pool would make this process unsafe to fork a server from

    if not argv or argv[0] in ("-h", "--help"):
        print_usage()
        return 0 if argv else EXIT_UNKNOWN
    if argv[0] in ("-V", "--version"):
        print(f"trainwreck {version()}")
        return EXIT_VALID
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"trainwreck: unknown command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_UNKNOWN
    with deferred():  # most commands import torch here: a Ctrl-C inside its C++ start-up aborted the process
        module = importlib.import_module(COMMANDS[name][0])
    if name == "check":  # the checkers own their argument parsing (stdlib only)
        return int(module.main(rest))
    parser = OneLineParser(one_line, prog=f"trainwreck {name}", description=COMMANDS[name][1])
    module.configure(parser)
    try:
        args = parser.parse_args(rest)
    except SystemExit as exc:  # argparse: usage errors are "input that could not be used"
        return EXIT_VALID if exc.code == 0 else EXIT_UNKNOWN
    return run_command(name, module, args)


def run_command(name: str, module: Any, args: argparse.Namespace) -> int:
    """Run one command; the one place where unusable input becomes exit 2 and one line.

    Every validator raises an InputError subclass (ConfigError, SpecError, PlanError,
    RunDirError, UnknownName, ...; rundir/errors.py) or the checkers' own InputError
    (harness/errors.py INPUT_ERRORS says why there are two roots), so a command only raises:
    none prints "error:" or picks exit 2 itself (tests/harness/test_errors.py checks).
    Ctrl-C and SIGTERM: the supervisor has already stopped the ranks by the time the exception
    reaches `main`, which exits 130 or 143 (128 + the signal) as shells do."""
    from trainwreck.harness.errors import INPUT_ERRORS  # stdlib-only: no torch
    from trainwreck.invariants.verdict import EXIT_UNKNOWN
    from trainwreck.rundir.files import describe, is_environment_failure

    try:
        if getattr(args, "out", None) is not None:
            from trainwreck.harness.supervise.create_rundir import check_out_dir

            check_out_dir(args.out)  # before a golden run or any rank starts
        return int(module.main(args))
    except INPUT_ERRORS as exc:
        print(f"trainwreck {name}: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_UNKNOWN
    except OSError as exc:  # the machine, not the input: a full disk, a read-only folder, a taken port
        if not is_environment_failure(exc):
            raise
        near = getattr(args, "out", None) or getattr(args, "run_dir", None) or "."  # where the command writes
        print(f"trainwreck {name}: error: {one_line(describe(exc, near))}", file=sys.stderr)
        return EXIT_UNKNOWN


def interrupted(name: str, received: Received) -> int:
    who, how = f"trainwreck {name}" if name else "trainwreck", "Ctrl-C" if received.name == "SIGINT" else received.name
    print(f"{who}: interrupted ({how}); ranks stopped, partial results left in place", file=sys.stderr)
    return received.exit_code


class ReaderMayLeave:
    """stdout whose reader may go away (`| head -1`): later output is dropped, not a BrokenPipeError
    traceback, and fd 1 is pointed at /dev/null so the interpreter's last flush is quiet too."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.gone = stream, False

    def write(self, text: str) -> int:
        return self._guard(lambda: self.stream.write(text), len(text))

    def flush(self) -> None:
        self._guard(self.stream.flush, None)

    def _guard(self, op: Any, dropped: Any) -> Any:
        if self.gone:
            return dropped
        try:
            return op()
        except BrokenPipeError:
            self.gone = True
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, self.stream.fileno())
                finally:
                    os.close(devnull)
            except (OSError, ValueError, io.UnsupportedOperation):
                pass  # not a real file descriptor (a test's capture): nothing flushes it at exit
            return dropped

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, isatty, buffer...
        return getattr(self.stream, name)


def one_line(text: str, limit: int = 400) -> str:
    """A message fit for one terminal line: a hostile value can be huge or hold newlines."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def version() -> str:
    """The installed distribution's version (an uninstalled checkout has none to report)."""
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("trainwreck")
    except PackageNotFoundError:
        return "(not installed: run from a checkout)"


def print_usage() -> None:
    print("usage: trainwreck COMMAND [options]\n       trainwreck --version\n\ncommands:")
    for name, (_, help_text) in COMMANDS.items():
        print(f"  {name:<10} {help_text}")
    print("\n`trainwreck COMMAND --help` describes each one.")


if __name__ == "__main__":
    sys.exit(main())
