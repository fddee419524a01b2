"""Hot-path statements compiled to SQL once per database, then run with new values.

peewee builds a query's SQL anew on every execution, which costs more than SQLite
takes to run it. A turn runs the same four statements every time (read the session,
claim it, save it, append to the log), so :class:`Prepared` builds each one once,
with named markers where the values go, and afterwards only binds values. The SQL
is still written by peewee, so it stays portable across SQLite and MySQL.

Values are passed as the database wants them (``int``, ``str``, ``bool``,
``None``): no field conversion happens on this path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from peewee import Model, Query, Value

from api.db.database import Sent, db

_MARK = "\x00agentcanvas:"


def mark(name: str) -> Value:
    """A placeholder for the value named ``name`` (bound at execution)."""
    return Value(_MARK + name, converter=False)


class Prepared:
    """A statement built once per database by ``build(mark)``.

    Args:
        build: returns the peewee query, using ``mark(name)`` wherever a value goes.
    """

    def __init__(self, build: Callable[[Callable[[str], Value]], Query]):
        self._build = build
        self._compiled: dict[int, tuple[Any, str, list]] = {}

    def _sql(self) -> tuple[Any, str, list]:
        database = db.obj
        entry = self._compiled.get(id(database))
        if entry is None or entry[0] is not database:
            query = self._build(mark)
            sql, params = query.sql()
            slots = [
                (True, p[len(_MARK) :]) if isinstance(p, str) and p.startswith(_MARK) else (False, p)
                for p in params
            ]
            entry = (database, sql, slots)
            self._compiled[id(database)] = entry
        return entry

    def _params(self, slots: list, values: dict[str, Any]) -> list:
        return [values[v] if named else v for named, v in slots]

    def execute(self, **values: Any) -> int:
        """Run it; the number of rows matched (UPDATE) or written (INSERT)."""
        _, sql, slots = self._sql()
        cursor = db.execute_sql(sql, self._params(slots, values))
        return cursor.rowcount

    def send(self, **values: Any) -> Sent:
        """Run a write as part of the open transaction without waiting for its answer
        where the database allows it (MySQL: it goes with the transaction's next
        statement, at the latest before ``COMMIT``; elsewhere, and outside a
        transaction, it runs now). For writes whose outcome the transaction need not
        know at once: their ``Sent.rowcount``, when read, waits for the answer. An error
        of the write is raised by a later statement or the ``COMMIT``, and the
        transaction is lost.
        """
        _, sql, slots = self._sql()
        params = self._params(slots, values)
        defer = getattr(db.obj, "defer", None)
        if defer is None:
            return Sent(None, db.execute_sql(sql, params).rowcount)
        return defer(sql, params)

    def row(self, **values: Any) -> tuple | None:
        """Run a SELECT and return its first row as a tuple of the selected columns."""
        _, sql, slots = self._sql()
        rows = db.execute_sql(sql, self._params(slots, values)).fetchall()
        return rows[0] if rows else None

    def first(self, model: type[Model], **values: Any) -> Model | None:
        """Run a SELECT and return its first row as a ``model`` instance, or ``None``."""
        _, sql, slots = self._sql()
        for row in model.raw(sql, *self._params(slots, values)):
            return row
        return None
