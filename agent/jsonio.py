"""JSON for snapshots: orjson when it can, the standard library when it cannot.

A turn parses and writes its whole snapshot; with the standard library that is most
of what a turn costs once the history is long. orjson is several times faster at
both. It refuses a few things the standard library accepts (integers beyond 64
bits, lone surrogates in text), so those fall back to :mod:`json`; parse errors are
re-raised by :mod:`json` so their messages stay the familiar ones.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def _default(value: Any) -> str:
    return str(value)


def dumps(value: Any) -> str:
    """Compact JSON text (no spaces, non-ASCII kept); unknown objects as ``str()``."""
    return dumps_plain(value)[0]


def dumps_plain(value: Any) -> tuple[str, bool]:
    """:func:`dumps`, and whether orjson wrote it (``False``: the standard library did)."""
    text = dumps_orjson(value)
    if text is not None:
        return text, True
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":")), False


def dumps_orjson(value: Any) -> str | None:
    """:func:`dumps` as orjson writes it; ``None`` for a value only the standard library writes."""
    data = dumps_utf8(value)
    return None if data is None else data.decode("utf-8")


def dumps_utf8(value: Any) -> bytes | None:
    """:func:`dumps_orjson`'s text as its UTF-8 bytes, as orjson writes it (no text is made)."""
    try:
        return orjson.dumps(value, default=_default)
    except (TypeError, orjson.JSONEncodeError):
        return None


def loads(text: str | bytes) -> Any:
    """Parse JSON; raises ``json.JSONDecodeError`` (a ``ValueError``) on bad input."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def loads_plain(text: str | bytes) -> tuple[Any, bool]:
    """:func:`loads`, and whether the text was plain JSON (orjson read it).

    A plain JSON value dumps back to text that parses to an equal value; a value only
    the standard library reads may not (``NaN`` dumps as ``null``)."""
    try:
        return orjson.loads(text), True
    except orjson.JSONDecodeError:
        return json.loads(text), False
