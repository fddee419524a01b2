"""Postgres text that holds NUL: what a user sends is stored and returned as sent.

Postgres refuses the character U+0000 in every text column (``text``, ``varchar``),
where SQLite and MySQL store it. A question, a form value, a session or dataset
name with a NUL in it would be a database error (HTTP 500) on Postgres only. RAGFlow
(MySQL) and our other backends keep such text as sent, so that is what Postgres
does too: every Postgres connection writes text through :func:`to_postgres` and
reads it back through :func:`from_postgres` (its cursors and rows, set by
:func:`use_text_encoding`), so the rest of the code never sees the difference.
Refusing such text (HTTP 400) was the other choice; it would refuse on SQLite and
MySQL what works there and in RAGFlow, and text that a component makes (a tool's
output echoed in an answer) would still fail its turn on Postgres.

The encoding is a prefix code over two Unicode noncharacters, which real text does
not hold (Unicode keeps them for a program's internal use)::

    U+0000  ->  U+FFFF
    U+FFFF  ->  U+FFFE U+FFFF
    U+FFFE  ->  U+FFFE U+FFFE

A NUL keeps its length (a name at a column's limit still fits); only the
noncharacters themselves grow. Text without any of the three is stored unchanged, so
rows look as before to anyone reading the database directly. Values are compared
encoded on both sides, so equality (and ``LIKE`` with a pattern free of the
noncharacters) finds what it finds on the other databases. JSON columns (snapshots,
DSLs, message meta) never hold a raw NUL: JSON writes it as ``\\u0000``. (A row
written before this encoding that holds U+FFFE or U+FFFF reads back differently;
noncharacters do not occur in text people write.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import psycopg

_NUL = "\x00"
_STANDS_FOR_NUL = "\uffff"
_ESCAPE = "\ufffe"
_ENCODED = re.compile(f"{_ESCAPE}([{_ESCAPE}{_STANDS_FOR_NUL}])|{_STANDS_FOR_NUL}")


def _has_codes(text: str) -> bool:
    # isascii() is O(1): most text needs no further look.
    return not text.isascii() and (_STANDS_FOR_NUL in text or _ESCAPE in text)


def to_postgres(text: str) -> str:
    """``text`` as a Postgres text column can hold it (no NUL; see the module docstring)."""
    if _has_codes(text):
        text = text.replace(_ESCAPE, _ESCAPE + _ESCAPE).replace(_STANDS_FOR_NUL, _ESCAPE + _STANDS_FOR_NUL)
    if _NUL in text:
        text = text.replace(_NUL, _STANDS_FOR_NUL)
    return text


def from_postgres(text: str) -> str:
    """The text that :func:`to_postgres` stored as ``text``."""
    if _has_codes(text):
        return _ENCODED.sub(lambda m: m.group(1) or _NUL, text)
    return text


def _encoded(params: Any) -> Any:
    """Query parameters with their text through :func:`to_postgres`; most have nothing
    to encode and are returned as they are (one pass, no call per value)."""
    values = params.values() if isinstance(params, Mapping) else params
    for v in values:
        if type(v) is str and (_NUL in v or not v.isascii() and (_STANDS_FOR_NUL in v or _ESCAPE in v)):
            break
    else:
        return params
    if isinstance(params, Mapping):
        return {k: to_postgres(v) if type(v) is str else v for k, v in params.items()}
    return [to_postgres(v) if type(v) is str else v for v in params]


def _decoded_row(values: list) -> tuple:
    for v in values:
        if type(v) is str and not v.isascii() and (_STANDS_FOR_NUL in v or _ESCAPE in v):
            return tuple([from_postgres(v) if type(v) is str else v for v in values])
    return tuple(values)


def _decoded_rows(cursor: psycopg.Cursor) -> Callable[[list], tuple]:
    """psycopg's default rows (tuples), with their text through :func:`from_postgres`."""
    return _decoded_row


class TextCursor(psycopg.Cursor):
    """A cursor that sends its parameters' text through :func:`to_postgres`.

    Once per statement and row in Python, rather than as psycopg adapters (a Python
    call per value, which costs several times more than psycopg's own C adapters)."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> TextCursor:
        return super().execute(query, None if params is None else _encoded(params), **kwargs)

    def executemany(self, query: Any, params_seq: Iterable, **kwargs: Any) -> None:
        return super().executemany(query, [_encoded(p) for p in params_seq], **kwargs)

    def stream(self, query: Any, params: Any = None, **kwargs: Any) -> Iterator:
        return super().stream(query, None if params is None else _encoded(params), **kwargs)


def use_text_encoding(conn: psycopg.Connection) -> None:
    """Make ``conn`` write text through :func:`to_postgres` and read it back through
    :func:`from_postgres` (its cursors and rows; see the module docstring)."""
    conn.cursor_factory = TextCursor
    conn.row_factory = _decoded_rows
