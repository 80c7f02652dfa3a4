"""The root of every "this input cannot be used" error: one definition, exit 2 and one line.

Every validator above the trainer (config fields, fault plans, job specs, run directories,
launcher names, command-line values) raises a subclass of `InputError`, and the command
lines turn it into exit 2 with its message on one line (harness/cli.py `run_command`,
trainer/__main__.py); nothing else prints "error:". It lives in trainer/ because trainer/
imports nothing of ours, so faults/ and harness/ can all derive from it.

The checkers' own error (`trainwreck.invariants.InputError`: a run directory that cannot
be judged) cannot derive from this one: invariants/ may import nothing of ours and the
trainer may not import invariants/ (docs/DESIGN.md, "Layout"). harness/errors.py therefore
names both as the input errors of the one exit path.
"""
from __future__ import annotations


class InputError(ValueError):
    """Input from a user cannot be used; the message names the field and the fix."""


class ConfigError(InputError):
    """A configuration value is invalid; the message names the field and the fix."""


class UnknownName(InputError, KeyError):
    """A name that is not in its table (a scenario, a defect, a chapter); the message lists the
    known ones. Still a KeyError for callers that look names up, but read as a sentence."""

    __str__ = BaseException.__str__  # KeyError's would quote the whole message
