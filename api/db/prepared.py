"""Hot-path statements compiled to SQL once per database, then run with new values.

peewee builds a query's SQL anew on every execution, which costs more than SQLite
takes to run it. A turn runs the same four statements every time (read the session,
claim it, save it, append to the log), so :class:`Prepared` builds each one once,
with named markers where the values go, and afterwards only binds values. The SQL
is still written by peewee, so it stays portable across SQLite and MySQL.

Values are passed as the database wants them (``int``, ``str``, ``bool``,
``None``; the text of a :func:`mark_text` also as UTF-8 ``bytes``): no field
conversion happens on this path.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from peewee import AutoField, Cast, Model, Node, Query, Value

from api.db.database import Sent, WriteMissed, db, is_postgres, is_sqlite

_MARK = "\x00agentcanvas:"
_MARK_UTF8 = "\x00agentcanvas-utf8:"
_MARK_BYTES = "\x00agentcanvas-bytes:"
# How a statement's parameter is made from its named values.
_FIXED, _NAMED, _DECODED, _ENCODED = range(4)


def mark(name: str) -> Value:
    """A placeholder for the value named ``name`` (bound at execution)."""
    return Value(_MARK + name, converter=False)


def mark_text(name: str) -> Node:
    """A placeholder for the text named ``name``, given as ``str`` or as its UTF-8
    ``bytes``. SQLite stores the bytes as the text itself (``CAST(? AS TEXT)``: the
    column holds TEXT, as if the ``str`` had been bound), so a non-ASCII text already
    at hand as UTF-8 is not made a ``str`` to be encoded again; so does MySQL (its
    ``text_of_utf8``: the bytes go into the statement escaped); other databases get the
    decoded ``str``. Call it in the builder (it depends on the database)."""
    if is_sqlite(db):
        return Cast(mark(name), "TEXT")
    return Value(_MARK_UTF8 + name, converter=False)


def mark_utf8(name: str) -> Node:
    """A placeholder for the text named ``name``, given as ``str`` or as its UTF-8
    ``bytes``, for a binary column that keeps it as UTF-8: SQLite binds it as given (the
    bytes are stored as a blob, a ``str`` as text), MySQL escapes the bytes into the
    statement as they are (:func:`mark_text`), Postgres gets bytes (``bytea``; a text
    would go through :mod:`api.db.pgtext`'s encoding). Call it in the builder."""
    if is_sqlite(db):
        return mark(name)
    if is_postgres(db):
        return Value(_MARK_BYTES + name, converter=False)
    return Value(_MARK_UTF8 + name, converter=False)


def _decoded(value: Any) -> Any:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _encoded(value: Any) -> Any:
    return value.encode("utf-8") if isinstance(value, str) else value


def _binder(
    slots: list[tuple[int, Any]], text_of_utf8: Callable[[Any], Any] = _decoded
) -> Callable[[dict[str, Any]], tuple | list]:
    """What makes a statement's parameters from its named values: ``slots`` holds, in
    order, ``(_NAMED, name)`` for a value bound at execution (``_DECODED``: UTF-8 bytes
    of it as ``text_of_utf8`` makes them a text; ``_ENCODED``: a text of it as its UTF-8
    bytes), ``(_FIXED, value)`` for one fixed
    when the SQL was built. The caller's dict of named values is left as it is (the
    turn passes one dict to two statements): the fixed ones join a copy."""
    if len(slots) > 1 and all(kind in (_FIXED, _NAMED) for kind, _ in slots):
        # One C call (two with fixed values: they join a copy under names of their own).
        fixed = {f"\x00{i}": v for i, (kind, v) in enumerate(slots) if kind == _FIXED}
        getter = operator.itemgetter(
            *(v if kind == _NAMED else f"\x00{i}" for i, (kind, v) in enumerate(slots))
        )
        if not fixed:
            return getter

        def bind(values: dict[str, Any]) -> tuple:
            return getter(values | fixed)

        return bind
    convert = {_DECODED: text_of_utf8, _ENCODED: _encoded}
    return lambda values: [
        v if kind == _FIXED else values[v] if kind == _NAMED else convert[kind](values[v])
        for kind, v in slots
    ]


def _slot(param: Any) -> tuple[int, Any]:
    """The slot (see :func:`_binder`) of a parameter of the SQL a builder's query wrote."""
    if isinstance(param, str):
        if param.startswith(_MARK):
            return _NAMED, param[len(_MARK) :]
        if param.startswith(_MARK_UTF8):
            return _DECODED, param[len(_MARK_UTF8) :]
        if param.startswith(_MARK_BYTES):
            return _ENCODED, param[len(_MARK_BYTES) :]
    return _FIXED, param


class Prepared:
    """A statement built once per database by ``build(mark)``.

    Args:
        build: returns the peewee query, using ``mark(name)`` wherever a value goes.
    """

    def __init__(self, build: Callable[[Callable[[str], Value]], Query]):
        self._build = build
        #: id of a database -> (the database, SQL, its binder, the database's ``defer`` or None)
        self._compiled: dict[int, tuple[Any, str, Callable, Callable | None]] = {}

    def _prepare(self) -> tuple[Any, str, Callable, Callable | None]:
        """This statement for the database the models use now (built on first use)."""
        database = db.obj
        entry = self._compiled.get(id(database))
        if entry is None or entry[0] is not database:
            query = self._build(mark)
            sql, params = query.sql()
            bind = _binder([_slot(p) for p in params], getattr(database, "text_of_utf8", _decoded))
            entry = (database, sql, bind, getattr(database, "defer", None))
            self._compiled[id(database)] = entry
        return entry

    def execute(self, values: dict[str, Any] | None = None, /, **named: Any) -> int:
        """Run it; the number of rows matched (UPDATE) or written (INSERT).

        The values by name: as keywords, or as one dict (a statement of many values:
        spreading a dict into keywords copies it, ~10k instructions for 20 values)."""
        database, sql, bind, _ = self._prepare()
        return database.execute_sql(sql, bind(named if values is None else values)).rowcount

    def send(self, values: dict[str, Any] | None = None, /, *, one_row: bool = False, **named: Any) -> Sent:
        """Run a write as part of the open transaction without waiting for its answer
        where the database allows it (MySQL: it goes with the transaction's next
        statement; Postgres: with the other writes sent after it, in one pipeline,
        before the next statement or with the ``COMMIT``; on SQLite, and outside a
        transaction, it runs now). For writes whose outcome the transaction need not
        know at once: their ``Sent.rowcount``, when read, waits for the answer. An error
        of the write is raised by a later statement or the ``COMMIT``, and the
        transaction is lost. The values as :meth:`execute` takes them.

        ``one_row`` (an ``UPDATE`` or ``DELETE``, a version check's): the transaction
        must not commit unless the write matched exactly one row. Where it did not,
        :class:`~api.db.database.WriteMissed` is raised at the latest by the
        ``COMMIT`` (on SQLite at once; on MySQL before the next statement; on Postgres
        by the server, so the ``COMMIT`` need not wait for the count), and nothing of
        the transaction is committed.
        """
        database, sql, bind, defer = self._prepare()
        params = bind(named if values is None else values)
        if defer is None:  # SQLite: every turn's writes (Sent.answered, inlined)
            rowcount = database.execute_sql(sql, params).rowcount
            if one_row and rowcount != 1:
                raise WriteMissed(rowcount)
            return Sent(None, rowcount)
        return defer(sql, params, one_row)

    def row(self, **values: Any) -> tuple | None:
        """Run a SELECT and return its first row as a tuple of the selected columns."""
        database, sql, bind, _ = self._prepare()
        rows = database.execute_sql(sql, bind(values)).fetchall()
        return rows[0] if rows else None

    def first(self, model: type[Model], **values: Any) -> Model | None:
        """Run a SELECT and return its first row as a ``model`` instance, or ``None``."""
        _, sql, bind, _ = self._prepare()
        for row in model.raw(sql, *bind(values)):
            return row
        return None


def inserting(model: type[Model]) -> Prepared:
    """An INSERT of one ``model`` row: every column but an auto-increment key, each value
    by its field's name, as :func:`new_row` makes them."""
    return Prepared(
        lambda m: model.insert(
            {f: m(f.name) for f in model._meta.sorted_fields if not isinstance(f, AutoField)}
        )
    )


def new_row(model: type[Model], **values: Any) -> dict[str, Any]:
    """The values of a new ``model`` row for :func:`inserting`: ``values``, and every other
    field's default (called when it is a function), as ``model.create(**values)`` stores
    them (values as the database takes them: no field conversion, see the module's)."""
    row = {}
    for f in model._meta.sorted_fields:
        if f.name in values:
            row[f.name] = values[f.name]
        elif not isinstance(f, AutoField):
            default = f.default
            row[f.name] = default() if callable(default) else default
    return row
