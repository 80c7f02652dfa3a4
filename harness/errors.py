"""The harness's errors, below every harness layer so each layer can raise them.

Bad input derives from the one root, `trainwreck.rundir.errors.InputError`, and reaches
the one exit path (harness/cli.py `run_command`: exit 2 and one line). `INPUT_ERRORS` adds
the checkers' `trainwreck.invariants.InputError`, which cannot share that root because
invariants/ imports nothing of ours (rundir/errors.py says why): the exit path treats both
alike, so a command never catches either itself.
"""
from __future__ import annotations

from trainwreck.invariants.history import InputError as RunInputError
from trainwreck.rundir.errors import InputError, UnknownName

__all__ = ["INPUT_ERRORS", "GoldenFailed", "InputError", "RunInputError", "SpecError", "UnknownName"]

INPUT_ERRORS: tuple[type[Exception], ...] = (InputError, RunInputError)
"""What the one exit path turns into exit 2 and one line."""


class SpecError(InputError):
    """A job specification is unusable; the message names the field and the fix."""


class GoldenFailed(RuntimeError):
    """The target could not even run uninterrupted: nothing can be judged against it."""
