"""What the command lines read from their users: argparse with one-line usage errors, and JSON from a
flag's value or an @FILE, refusing what json.loads lets through (NaN, Infinity, deep nesting,
endless devices). The trainer's CLI, the plan reader and the harness's CLI all take input through
here, so a bad value reads the same wherever it is given (an InputError naming the flag and a fix).
And how they end: without walking torch's objects once more (`end_without_collecting`)."""
from __future__ import annotations

import argparse
import atexit
import functools
import gc
import json
from typing import Any, Callable, NoReturn

from trainwreck.rundir.errors import InputError
from trainwreck.rundir.files import SMALL_LIMIT


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (its default prints the whole usage first);
    `shorten` trims a hostile value, the CLIs share this so both read alike."""

    def __init__(self, shorten: Callable[[str], str] = str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shorten = shorten

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {self.shorten(message)}; see {self.prog} --help\n")


@functools.cache  # once per process
def end_without_collecting() -> None:
    """At this process's exit, after every other exit handler, move every live object out of the
    collector's reach (gc.freeze), so that the interpreter's final collections skip them.

    With torch imported, those collections walked its ~290 000 objects for nothing: a process that
    imported torch and its FSDP modules took 5.45 s to end, 4.10 s frozen (2026-11-27, 2-core
    machine). Reference counting still frees and closes everything it did before; only cyclic
    garbage left at exit goes unfinalized, which the interpreter never promised to finalize.
    Registered first (once per process), so it runs last: exit handlers run newest first."""
    atexit.register(gc.freeze)


def _refuse_constant(name: str) -> Any:
    raise InputError(f"holds {name}, which is not a finite number; use a finite number")


def load_json_arg(text: str, flag: str, example: str) -> Any:
    """JSON from a command-line value or from @FILE, refusing what json.loads lets through.

    NaN/Infinity would make a fault never fire or a timeout never expire, and deep
    nesting raises RecursionError (not ValueError) inside the json module."""
    if text.startswith("@"):
        try:  # bounded: @/dev/zero must not be read until memory runs out (a pipe, @/dev/stdin, is fine)
            with open(text[1:], "rb") as file:
                raw = file.read(SMALL_LIMIT + 1)
            if len(raw) > SMALL_LIMIT:
                raise InputError(f"{flag} @{text[1:]}: longer than {SMALL_LIMIT} bytes (an endless device?); "
                                 "give a JSON file")
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise InputError(f"{flag} @{text[1:]}: cannot read the file ({reason}); give a readable JSON file") from None
    return loads_strict(text, flag, example)


MAX_JSON_DEPTH = 64
"""Deeper than any plan or config can be (they are 3 levels); refused before parsing, because
how deep Python's parser can go before a RecursionError differs between versions."""


def json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of JSON text (strings skipped), counting no further than limit + 1."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif char in "]}":
            depth -= 1
    return deepest


def loads_strict(text: str | bytes, what: str, example: str) -> Any:
    """json.loads that refuses NaN/Infinity and deep nesting with an InputError naming `what`."""
    if json_depth(text.decode(errors="replace") if isinstance(text, bytes) else text) > MAX_JSON_DEPTH:
        raise InputError(f"{what} is nested too deeply to be a plausible value (over {MAX_JSON_DEPTH} "
                         f"levels); e.g. {example}")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except InputError as exc:
        raise InputError(f"{what} {exc}; e.g. {example}") from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply to be a plausible value; e.g. {example}") from None
    except ValueError as exc:
        raise InputError(f"{what} is not valid JSON ({exc}); e.g. {example}") from None
