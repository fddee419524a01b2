"""Opening the database named by a URL, and the late-bound handle the models use.

``sqlite:///agentcanvas.db`` (a relative path is under ``AGENTCANVAS_HOME``, see
:func:`agent.settings.data_home`, so every command finds the same file whatever its
working directory),
``mysql://user:password@host:3306/dbname`` (``mariadb://`` is accepted as a synonym)
or ``postgresql://user:password@host:5432/dbname`` (``postgres://`` too; psycopg 3).
All are connection pools. SQLite runs in WAL mode with a busy timeout; MySQL and
Postgres connections are checked on check-out and a connection dropped mid-use is
reconnected, retrying the statement only when that is safe (a read outside a
transaction). The server databases are created if missing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from peewee import (
    Database,
    DatabaseError,
    DatabaseProxy,
    InterfaceError,
    MySQLDatabase,
    OperationalError,
    PostgresqlDatabase,
)
from playhouse.db_url import parse as parse_db_url
from playhouse.pool import PooledMySQLDatabase, PooledPostgresqlDatabase, PooledSqliteDatabase
from playhouse.shortcuts import ReconnectMixin

from agent.settings import data_home

#: The handle every model is bound to; :func:`bind_database` points it at a real one.
db = DatabaseProxy()

_READ_VERBS = frozenset({"SELECT", "SHOW", "DESCRIBE", "EXPLAIN"})


class _SafeReconnectMixin:
    """Reconnect after a dropped connection; retry the statement only if it is a read.

    peewee's ``ReconnectMixin`` retries every statement outside a transaction, but an
    ``UPDATE`` whose connection dropped may already have been applied, so running it
    again is not safe. Here a write's error reaches the caller, and the thread gets a
    fresh connection for its next statement either way. Inside a transaction nothing
    is reconnected: the transaction is lost and the caller must know.
    """

    # (error class, fragment of its message): the connection is gone.
    reconnect_errors = ReconnectMixin.reconnect_errors + (
        (OperationalError, "terminating connection"),  # psycopg 3: the server ended it
        (OperationalError, "the connection is closed"),  # psycopg 3: reused after a drop
        (OperationalError, "server closed the connection"),
        (InterfaceError, "connection already closed"),
    )

    def execute_sql(self, sql, params=None):  # noqa: ANN001 - peewee's signature
        try:
            return super().execute_sql(sql, params)
        except (OperationalError, InterfaceError) as exc:
            if self.in_transaction() or not self._connection_lost(exc):
                raise
            self._reopen()
            verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
            if verb not in _READ_VERBS:
                raise
            return super().execute_sql(sql, params)

    def begin(self, *args, **kwargs):  # noqa: ANN002, ANN003 - peewee's signature
        try:
            return super().begin(*args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            if not self._connection_lost(exc):
                raise
            self._reopen()  # nothing was sent yet: starting again is safe
            return super().begin(*args, **kwargs)

    def _connection_lost(self, exc: Exception) -> bool:
        text = str(exc).lower()
        return any(isinstance(exc, cls) and frag.lower() in text for cls, frag in self.reconnect_errors)

    def _reopen(self) -> None:
        # close()/connect() reset the thread's state, including the stack that
        # connection_context() pops on exit: keep it, also when connect() fails (the
        # server is still down), so that the caller sees that error and not an
        # IndexError from an emptied stack.
        ctx = list(self._state.ctx)
        try:
            self.close()
            self.connect()
        finally:
            self._state.ctx = ctx


class ReconnectingPooledMySQLDatabase(_SafeReconnectMixin, PooledMySQLDatabase):
    """Pooled MySQL/MariaDB through pymysql, reconnecting dropped connections."""


class ReconnectingPooledPostgresqlDatabase(_SafeReconnectMixin, PooledPostgresqlDatabase):
    """Pooled PostgreSQL through psycopg 3, reconnecting dropped connections."""

    # The models' LONGTEXT and LONGBLOB (for MySQL) are TEXT and BYTEA here: both unbounded.
    field_types = {**PooledPostgresqlDatabase.field_types, "LONGTEXT": "TEXT", "LONGBLOB": "BYTEA"}


class WalSqliteDatabase(PooledSqliteDatabase):
    """Pooled SQLite in WAL mode; write transactions take the write lock up front.

    ``write_lock`` lines up this process's writers (see :func:`write_transaction`).

    SQLite opens a file it may not write read-only, and such a connection stays
    read-only after the file becomes writable again. So a connection is noted as
    read-only when it is opened on an unwritable file, and dropped at check-out once
    the file is writable: writes work again at once, not after the pool's stale
    timeout. (One ``open()`` per new connection; pooled ones cost nothing.)
    """

    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003 - peewee's signature
        super().__init__(*args, **kwargs)
        self.write_lock = threading.RLock()
        self._seen: set[int] = set()
        self._opened_read_only: set[int] = set()

    def _connect(self):  # noqa: ANN202 - peewee's signature
        while True:
            conn = super()._connect()
            key = id(conn)
            if key not in self._seen:
                self._seen.add(key)
                if not self._file_writable():
                    self._opened_read_only.add(key)
            if key in self._opened_read_only and self._file_writable():
                self._close(conn, close_conn=True)  # the file is writable now: open afresh
                continue
            return conn

    def _close_raw(self, conn) -> None:  # noqa: ANN001 - peewee's signature
        self._seen.discard(id(conn))
        self._opened_read_only.discard(id(conn))
        super()._close_raw(conn)

    def _file_writable(self) -> bool:
        return _may_write(Path(self.database))


def check_writable(database: Database) -> None:
    """Raise ``OperationalError`` if a SQLite database's file or folder cannot be written.

    Called at start, so that a server on a read-only file fails at once with a clear
    message instead of looking healthy and failing every write. The folder is tried
    for real; the file is asked (see :func:`_may_write`).
    """
    if not isinstance(database, PooledSqliteDatabase):
        return
    path = Path(database.database)
    problem = None
    try:
        if not _may_write(path):
            raise PermissionError(errno.EACCES, "the file is read-only or immutable")
        probe = path.parent / f".{path.name}.{os.getpid()}.write-check"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        problem = exc
    if problem is not None:
        raise OperationalError(
            f"the SQLite database {str(path)!r} (or its folder, where SQLite keeps its journal) cannot "
            f"be written ({problem.strerror or problem}); make it writable or point AGENTCANVAS_DATABASE_URL "
            f"elsewhere"
        )


def _may_write(path: Path) -> bool:
    """Whether this process may write the SQLite file at ``path`` (a missing one: yes).

    Asked with ``access(2)``, which sees the immutable flag and a read-only mount even
    for root, never by opening the file: closing any descriptor of a file drops every
    POSIX lock this process holds on it, SQLite's included, and other connections of
    this process would then read stale snapshots (a revoked token still accepted).
    """
    return not path.exists() or os.access(path, os.W_OK)


def is_sqlite(database: Database | DatabaseProxy) -> bool:
    target = database.obj if isinstance(database, DatabaseProxy) else database
    return isinstance(target, PooledSqliteDatabase)


def is_postgres(database: Database | DatabaseProxy) -> bool:
    target = database.obj if isinstance(database, DatabaseProxy) else database
    return isinstance(target, PooledPostgresqlDatabase)


def _sqlite_path(url: str) -> str:
    path = urlparse(url).path
    if path.startswith("/"):
        path = path[1:]  # sqlite:///rel.db -> rel.db ; sqlite:////abs.db -> /abs.db
    if not path or path == ":memory:":
        raise ValueError(
            f"database URL {url!r} names no file; use sqlite:///agentcanvas.db "
            f"(in-memory databases are not shared between threads)"
        )
    file = Path(path)
    if not file.is_absolute():
        file = data_home() / file
    file.parent.mkdir(parents=True, exist_ok=True)
    return str(file)


def open_database(url: str, max_connections: int = 32) -> Database:
    """A pooled database for ``url``; nothing is connected yet.

    Raises:
        ValueError: the URL's scheme is not ``sqlite``, ``mysql``/``mariadb`` or
            ``postgresql``/``postgres``, or it names no database.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(
            f"database URL {url!r} is not a URL; use sqlite:///agentcanvas.db, "
            f"mysql://user:password@host:3306/dbname or postgresql://user:password@host:5432/dbname"
        )
    scheme = urlparse(url).scheme.lower()
    if scheme in ("sqlite", "sqlite+pool"):
        return WalSqliteDatabase(
            _sqlite_path(url),
            max_connections=max_connections,
            stale_timeout=600,
            timeout=30,
            check_same_thread=False,
            pragmas={
                "journal_mode": "wal",
                "synchronous": "normal",
                "busy_timeout": 30000,
                "foreign_keys": 1,
            },
        )
    if scheme in ("mysql", "mysql+pool", "mariadb", "mysql+pymysql"):
        kwargs = parse_db_url(url, unquote_password=True, unquote_user=True)
        if "passwd" in kwargs:
            kwargs["password"] = kwargs.pop("passwd")
        name = kwargs.pop("database", "")
        if not name:
            raise ValueError(f"database URL {url!r} names no database; add it: mysql://host:3306/agentcanvas")
        kwargs.setdefault("charset", "utf8mb4")
        kwargs.setdefault("connect_timeout", 10)
        # Report rows *matched* by an UPDATE, as SQLite does, not rows changed: a
        # conditional UPDATE that sets a value already there still counts as a hit.
        from pymysql.constants import CLIENT

        kwargs["client_flag"] = int(kwargs.get("client_flag") or 0) | CLIENT.FOUND_ROWS
        return ReconnectingPooledMySQLDatabase(
            name, max_connections=max_connections, stale_timeout=300, timeout=30, **kwargs
        )
    if scheme in ("postgresql", "postgres", "postgresql+pool", "postgres+pool", "postgresql+psycopg"):
        kwargs = parse_db_url(url, unquote_password=True, unquote_user=True)
        name = kwargs.pop("database", "")
        if not name:
            raise ValueError(
                f"database URL {url!r} names no database; add it: postgresql://host:5432/agentcanvas"
            )
        kwargs.setdefault("connect_timeout", 10)
        return ReconnectingPooledPostgresqlDatabase(
            name,
            max_connections=max_connections,
            stale_timeout=300,
            timeout=30,
            prefer_psycopg3=True,
            **kwargs,
        )
    raise ValueError(
        f"database URL {url!r} has unsupported scheme {scheme!r}; "
        f"use sqlite:///path, mysql://host/db or postgresql://host/db"
    )


def ensure_server_database(database: Database) -> None:
    """Create the MySQL or Postgres database the URL names if it does not exist yet.

    Raises:
        OperationalError: the server cannot be reached; the message says where.
    """
    if isinstance(database, PooledPostgresqlDatabase):
        _ensure_postgres_database(database)
        return
    if not isinstance(database, PooledMySQLDatabase):
        return
    params = dict(database.connect_params)
    # information_schema exists on every MySQL-compatible server: a place to stand
    # while creating the real database.
    admin = MySQLDatabase("information_schema", **params)
    quoted = "`" + database.database.replace("`", "``") + "`"
    try:
        admin.connect()
        admin.execute_sql(f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    except (OperationalError, InterfaceError) as exc:
        host = f"{params.get('host', 'localhost')}:{params.get('port', 3306)}"
        raise OperationalError(
            f"cannot use MySQL database {database.database!r} at {host} as {params.get('user')!r}: {exc}; "
            f"check AGENTCANVAS_DATABASE_URL and that the server is running"
        ) from None
    finally:
        admin.close()


def _ensure_postgres_database(database: PooledPostgresqlDatabase) -> None:
    params = dict(database.connect_params)
    params.pop("prefer_psycopg3", None)
    # The maintenance database "postgres" exists on every server (CockroachDB and
    # YugabyteDB have it too): a place to stand while creating the real one.
    admin = PostgresqlDatabase("postgres", prefer_psycopg3=True, **params)
    quoted = '"' + database.database.replace('"', '""') + '"'
    try:
        admin.connect()
        exists = admin.execute_sql("SELECT 1 FROM pg_database WHERE datname = %s", (database.database,))
        if exists.fetchone() is None:
            try:
                admin.execute_sql(f"CREATE DATABASE {quoted}")
            except DatabaseError:
                # Another process created it between our look and our CREATE.
                again = admin.execute_sql(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (database.database,)
                )
                if again.fetchone() is None:
                    raise
    except (OperationalError, InterfaceError) as exc:
        host = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
        raise OperationalError(
            f"cannot use Postgres database {database.database!r} at {host} as {params.get('user')!r}: {exc}; "
            f"check AGENTCANVAS_DATABASE_URL and that the server is running"
        ) from None
    finally:
        admin.close()


def bind_database(database: Database) -> None:
    """Point the models' handle at ``database``, closing the previous pool's idle connections.

    A connection another thread is using (a parse worker or lease keeper of an earlier
    app in this process) is left to that thread: closing it under a running query
    crashed the C driver (a segfault seen in the test suite).
    """
    previous = db.obj
    if previous is not None and previous is not database:
        with contextlib.suppress(Exception):
            previous.close_idle()
    db.initialize(database)


def writer_in_line() -> contextlib.AbstractContextManager:
    """On SQLite, this process's write lock (for a single write outside
    :func:`write_transaction`); nothing elsewhere."""
    return db.obj.write_lock if is_sqlite(db) else contextlib.nullcontext()


@contextlib.contextmanager
def write_transaction() -> Iterator[None]:
    """One transaction that writes. On SQLite it takes the write lock at ``BEGIN``.

    A deferred SQLite transaction that reads first and writes later can fail with
    "database is locked" when another writer got in between; ``BEGIN IMMEDIATE``
    waits for the lock (busy timeout) instead. The threads of one process also queue
    on the database's ``write_lock`` first: a thread that finds SQLite's lock taken
    sleeps in growing steps (up to 100 ms) before it looks again, while one waiting on
    the process's lock goes on the moment the writer before it is done.
    """
    if is_sqlite(db):
        with writer_in_line(), db.atomic(lock_type="IMMEDIATE"):
            yield
    else:
        with db.atomic():
            yield


def insert_rows(table: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """``INSERT`` many rows with one prepared statement (``executemany``).

    For bulk writes on a hot path (chunks, index entries): peewee's ``insert_many``
    builds the SQL of every value anew, which costs more than the database takes to
    store them. ``table`` and ``columns`` are the code's own names, never input.
    """
    if not rows:
        return
    marks = ", ".join([db.obj.param] * len(columns))
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
    cursor = db.cursor()
    try:
        cursor.executemany(sql, rows)
    finally:
        cursor.close()
