"""report.json's text, as `json.JSONEncoder(indent=..., default=str).iterencode` writes it, faster.

The standard library's encoder runs in C only when it writes one line (no `indent`); with an indent
it is a pure-Python generator that yields each value and separator on its own. A 16 M-event run's
report holds rank 0's loss at each of a million updates (two lists of a million numbers), and
encoding it so took 9 of the report's 95 profiled seconds. Here a list of plain numbers, strings,
booleans and None is written as one join over `map` (C loops), a batch at a time; everything else
(dicts, nested lists, other objects through `default=str`) follows the library's rules item by
item. tests/report/test_json_text.py holds the text to the library's, byte for byte.
"""
from __future__ import annotations

import math
from json.encoder import encode_basestring_ascii
from typing import Any, Callable, Iterator

BATCH = 1 << 16
"""List items joined into one piece: a million-number list is written without its whole text held."""


def _float(value: float) -> str:
    # The library's spelling of the values JSON has no word for (allow_nan=True).
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


_SCALARS: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii, int: int.__repr__, float: _float, bool: lambda v: "true" if v else "false",
    type(None): lambda v: "null",
}


def iterencode(value: Any, indent: int) -> Iterator[str]:
    """The pieces of `value`'s JSON text, `indent` spaces a level, ASCII, NaN allowed, keys in their
    order, anything the library cannot write as str(it)."""
    yield from _value(value, 0, " " * indent)


def _scalar(value: Any) -> str | None:
    """The text of a plain value as the library writes it (its subclasses too: an IntEnum is an int)."""
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None or value is True or value is False:
        return _SCALARS[type(value)](value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float(value)
    return None


def _value(value: Any, level: int, indent: str) -> Iterator[str]:
    text = _scalar(value)
    if text is not None:
        yield text
    elif isinstance(value, (list, tuple)):
        yield from _list(value, level, indent)
    elif isinstance(value, dict):
        yield from _dict(value, level, indent)
    else:
        yield from _value(str(value), level, indent)  # default=str


def _list(items: list[Any] | tuple[Any, ...], level: int, indent: str) -> Iterator[str]:
    if not items:
        yield "[]"
        return
    inner = "\n" + indent * (level + 1)
    separator = "," + inner
    yield "[" + inner
    for start in range(0, len(items), BATCH):
        batch = items[start : start + BATCH]
        if start:
            yield separator
        kinds = set(map(type, batch))
        if kinds <= _SCALARS.keys():  # exact types (a subclass goes the long way, as the library's)
            yield separator.join(_plain(batch, kinds))
            continue
        for i, item in enumerate(batch):
            if i:
                yield separator
            yield from _value(item, level + 1, indent)
    yield "\n" + indent * level + "]"


def _plain(batch: list[Any] | tuple[Any, ...], kinds: set[type]) -> list[str] | Iterator[str]:
    """The texts of values all of _SCALARS' exact types: one C-level map where they share a type."""
    if kinds == {float}:
        texts = list(map(float.__repr__, batch))
        return texts if all(map(math.isfinite, batch)) else list(map(_float, batch))
    if len(kinds) == 1:
        return map(_SCALARS[kinds.pop()], batch)
    return [_SCALARS[type(v)](v) for v in batch]


def _key(key: Any) -> str:
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    text = _scalar(key)
    if text is None:
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
    return encode_basestring_ascii(text)


def _dict(mapping: dict[Any, Any], level: int, indent: str) -> Iterator[str]:
    """Plain values are held and written with their keys in one piece: each piece costs a resume of
    every generator above it, and a long run's report has tens of thousands of small dicts."""
    if not mapping:
        yield "{}"
        return
    inner = "\n" + indent * (level + 1)
    held = ["{" + inner]
    for i, (key, item) in enumerate(mapping.items()):
        held.append(("," + inner if i else "") + _key(key) + ": ")
        text = _scalar(item)
        if text is not None:
            held.append(text)
            continue
        yield "".join(held)
        held = []
        yield from _value(item, level + 1, indent)
    held.append("\n" + indent * level + "}")
    yield "".join(held)
