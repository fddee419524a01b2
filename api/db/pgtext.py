"""Postgres text that holds NUL: what a user sends is stored and returned as sent.

Postgres refuses the character U+0000 in every text column (``text``, ``varchar``),
where SQLite and MySQL store it. A question, a form value, a session or dataset
name with a NUL in it would be a database error (HTTP 500) on Postgres only. RAGFlow
(MySQL) and our other backends keep such text as sent, so that is what Postgres
does too: every Postgres connection writes text through :func:`to_postgres` and
reads it back through :func:`from_postgres` (psycopg adapters registered by
:func:`register_text_adapters`), so the rest of the code never sees the difference.
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

from psycopg.adapt import AdaptersMap
from psycopg.types import string

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


def _text_dumper(base: type) -> type:
    class Dumper(base):
        def dump(self, obj: str) -> bytes:
            return to_postgres(obj).encode(self._encoding)

    Dumper.__name__ = Dumper.__qualname__ = base.__name__
    return Dumper


class _TextLoader(string.TextLoader):
    def load(self, data) -> bytes | str:  # noqa: ANN001 - a buffer, as psycopg's
        text = super().load(data)
        return from_postgres(text) if isinstance(text, str) else text  # bytes: a SQL_ASCII database


class _TextBinaryLoader(_TextLoader):
    format = string.TextBinaryLoader.format


# In psycopg's order: the last dumper registered for a format is its default.
_DUMPERS = [
    _text_dumper(base)
    for base in (
        string.StrBinaryDumperName,
        string.StrBinaryDumperVarchar,
        string.StrBinaryDumper,
        string.StrDumperName,
        string.StrDumperVarchar,
        string.StrDumper,
        string.StrDumperUnknown,
    )
]
_TEXT_TYPES = ("bpchar", "name", "text", "varchar", '"char"')


def register_text_adapters(adapters: AdaptersMap) -> None:
    """Make a psycopg connection (its ``adapters``) write and read text through
    :func:`to_postgres` and :func:`from_postgres`."""
    for dumper in _DUMPERS:
        adapters.register_dumper(str, dumper)
    adapters.register_loader(0, _TextLoader)  # a value of unknown type: text
    for name in _TEXT_TYPES:
        adapters.register_loader(name, _TextLoader)
        adapters.register_loader(name, _TextBinaryLoader)
