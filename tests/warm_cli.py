"""`python -m MODULE ARGS` as real processes forked from one warm server (the harness's own
command server, harness/launch/cmdserver.py) instead of a fresh interpreter each.

Each command is still a process of its own, with its own environment, working directory, exit
code and output, run as `__main__` the way `python -m` runs it; only the imports (torch, the
harness) are paid once per server instead of once per command: about 3.5 s each on the 2-core
machine, 43 of them in the hostile-input table. stdout and stderr share one log. A command is
waited for and, past its time, killed as the harness does a forked attempt (WarmAttempt).
"""
from __future__ import annotations

from pathlib import Path

from trainwreck.harness.cli import COMMANDS
from trainwreck.harness.launch.launchers import ForkServer, start_command

WARM = ("torch", "trainwreck.trainer.standalone", *(module for module, _ in COMMANDS.values()))
"""What the commands import, never the `-m` modules themselves: one already imported when runpy
runs it as `__main__` draws a RuntimeWarning a fresh interpreter never prints."""


class WarmCli:
    def __init__(self) -> None:
        self.server = ForkServer("trainwreck.harness.launch.cmdserver", WARM)

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], log: Path,
            timeout_s: float = 120) -> tuple[int, str]:
        """Exit code and output of `argv` (`[python, "-m", MODULE, ...]`) run in `cwd` with `env`."""
        attempt = start_command(self.server, argv, cwd, env, log)
        if isinstance(attempt, str):
            raise RuntimeError(f"the command server refused {argv[1:3]}: {attempt}")
        code = attempt.finish(timeout_s)
        if code is None:
            raise TimeoutError(f"{argv[1:3]} still running after {timeout_s} s (killed)")
        return code, log.read_text(errors="replace")

    def close(self) -> None:
        self.server.close()
