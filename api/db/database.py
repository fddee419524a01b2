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
import fcntl
import functools
import logging
import os
import re
import select
import sqlite3
import struct
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, TypeVar
from urllib.parse import parse_qs, urlparse

from peewee import (
    Database,
    DatabaseError,
    DatabaseProxy,
    InterfaceError,
    MySQLDatabase,
    OperationalError,
    PeeweeException,
    PostgresqlDatabase,
    SqliteDatabase,
    __exception_wrapper__,
    _transaction,
)
from playhouse.pool import (
    MaxConnectionsExceeded,
    PooledMySQLDatabase,
    PooledPostgresqlDatabase,
    PooledSqliteDatabase,
)
from playhouse.shortcuts import ReconnectMixin

from agent.settings import data_home
from api.db import cluster
from api.db.urls import ServerUrl, parse_server_url, typed_option

T = TypeVar("T")
T_Text = TypeVar("T_Text", str, bytes)

log = logging.getLogger("agentcanvas.db")
_PEEWEE_LOG = logging.getLogger("peewee")  # where peewee logs each statement (debug)


class _Handle(DatabaseProxy):
    """peewee's proxy, whose connection context opens and closes on one database.

    peewee's looks the database up again on leaving: a thread inside the context when the
    handle is pointed elsewhere (:func:`bind_database`, a second app built in one process,
    as tests do) closed a connection of the other database and failed in its pool's
    bookkeeping (``IndexError: pop from empty list``).
    """

    def connection_context(self):  # noqa: D102 - peewee's
        return self.obj.connection_context()


#: The handle every model is bound to; :func:`bind_database` points it at a real one.
db = _Handle()

_READ_VERBS = frozenset({"SELECT", "SHOW", "DESCRIBE", "EXPLAIN"})

#: A statement longer than this is not deferred (:meth:`ReconnectingPooledMySQLDatabase.defer`):
#: a deferred one goes as one packet, and pymysql splits those of 16 MB and more.
_DEFERRED_MAX_BYTES = 4 * 1024 * 1024
#: Result descriptions a MySQL connection keeps parsed (its statements' are a few dozen).
_KNOWN_RESULTS = 256


def _verb(sql: str) -> str:
    """The statement's first word, upper-cased (``""`` for an empty one)."""
    words = sql.split(None, 1)
    return words[0].upper() if words else ""


def _check_failed(exc: BaseException, detail: str | None = None) -> bool:
    """Whether ``exc`` is the failed check of a pooled MySQL connection (``detail``:
    and that attribute of it is true; see :func:`_mysql_connection_class`)."""
    orig = getattr(exc, "orig", exc)
    return hasattr(orig, "unsent") and (detail is None or bool(getattr(orig, detail)))


class _SafeReconnectMixin:
    """Reconnect after a dropped connection; retry the statement only if it is a read.

    peewee's ``ReconnectMixin`` retries every statement outside a transaction, but an
    ``UPDATE`` whose connection dropped may already have been applied, so running it
    again is not safe. Here a write's error reaches the caller, and the thread gets a
    fresh connection for its next statement either way. Inside a transaction nothing
    is reconnected: the transaction is lost and the caller must know; except on its
    first statement when it was begun with that statement (MySQL, see
    :meth:`ReconnectingPooledMySQLDatabase.begin`): nothing of it can have been
    committed, so it is begun again on a fresh connection, as a ``BEGIN`` that failed
    would be.

    With several hosts (:mod:`api.db.cluster`), the host of a connection that dropped or
    whose node is not ready is marked down, and the fresh connection goes to another one. A
    statement the node refused before running it (Galera's 1047) is run again there,
    a write too; so is a single statement rolled back by a write conflict (1213, a
    Galera certification failure), up to :data:`~api.db.cluster.CONFLICT_RETRIES` times.
    """

    # (error class, fragment of its message): the connection is gone.
    reconnect_errors = ReconnectMixin.reconnect_errors + (
        (OperationalError, "terminating connection"),  # psycopg 3: the server ended it
        (OperationalError, "the connection is closed"),  # psycopg 3: reused after a drop
        (OperationalError, "server closed the connection"),
        (InterfaceError, "connection already closed"),
    )

    def execute_sql(self, sql, params=None):  # noqa: ANN001 - peewee's signature
        conflicts = 0
        moves = len(self.host_list.hosts)
        while True:
            first = self._begins_transaction()
            try:
                return super().execute_sql(sql, params)
            except (OperationalError, InterfaceError) as exc:
                verb = _verb(sql)  # worked out only when a statement failed (hot path)
                gone = self._connection_lost(exc) or cluster.node_unusable(exc)
                if self.in_transaction():
                    if not gone:
                        raise
                    self._leave_host(exc)
                    if not first or moves <= 0:
                        raise
                    moves -= 1
                    self._reopen_transaction()
                    continue
                if cluster.write_conflict(exc) and conflicts < cluster.CONFLICT_RETRIES:
                    conflicts += 1  # rolled back whole: run it again after a short pause
                    cluster.pause_before_retry(conflicts)
                    continue
                refused = (
                    cluster.refused_before_running(exc)
                    or _check_failed(exc, "unsent")
                    or (
                        # A Galera node cut off from the cluster fails a read that needs no
                        # table (SELECT 1, SELECT @@port) with 1205 at once: its wait for
                        # the cluster (wsrep_sync_wait) cannot begin. A plain read takes no
                        # row lock, so it is no lock wait of ours.
                        self.galera and verb in _READ_VERBS and cluster.mysql_code(exc) == 1205
                    )
                )
                if not (refused or gone):
                    raise
                self._leave_host(exc)
                self._reopen()
                if not (refused or verb in _READ_VERBS) or moves <= 0:
                    raise
                moves -= 1

    def begin(self, *args, **kwargs):  # noqa: ANN002, ANN003 - peewee's signature
        try:
            return super().begin(*args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            if not (self._connection_lost(exc) or cluster.node_unusable(exc)):
                raise
            self._leave_host(exc)
            self._reopen()  # nothing was sent yet: starting again is safe
            return super().begin(*args, **kwargs)

    def _begins_transaction(self) -> bool:
        """Whether the next statement begins the open transaction (it was begun with it)."""
        return False

    def _reopen_transaction(self) -> None:
        """Begin the open transaction, of which nothing was answered, again on a new connection."""
        raise NotImplementedError

    def _connection_lost(self, exc: Exception) -> bool:
        text = str(exc).lower()
        return any(isinstance(exc, cls) and frag.lower() in text for cls, frag in self.reconnect_errors)

    def _leave_host(self, exc: Exception) -> None:
        """Mark the host of this thread's connection down (``exc``: it is gone or not ready).

        Not when the check of a pooled connection found it closed by the server (its
        host answered that much; it was restarted, or ended idle connections): the
        next connection goes there again, and finds out."""
        if _check_failed(exc) and not _check_failed(exc, "silent"):
            return
        conn = self._state.conn
        if conn is not None and id(conn) in self._conn_hosts:
            self.host_list.mark_down(self._conn_hosts[id(conn)], exc)

    def _reopen(self) -> None:
        # close()/connect() reset the thread's state, including the stack that
        # connection_context() pops on exit: keep it, also when connect() fails (the
        # server is still down), so that the caller sees that error and not an
        # IndexError from an emptied stack. The same for the transactions, when the one
        # open is begun again on the new connection (_reopen_transaction).
        ctx, transactions = list(self._state.ctx), list(self._state.transactions)
        self._state.transactions = []
        try:
            self.close()
            self.connect()
        finally:
            self._state.ctx, self._state.transactions = ctx, transactions

    def _connect(self):  # noqa: ANN202 - peewee's signature
        # The pool hands out its idle connections first: pass over those on a host that
        # is down, and those on a later host once an earlier one is up again.
        while True:
            conn = super()._connect()
            if self._may_keep(conn):
                return conn
            self._close(conn, close_conn=True)

    def _may_keep(self, conn) -> bool:  # noqa: ANN001 - a driver connection
        hosts = self.host_list
        index = self._conn_hosts.get(id(conn))
        if len(hosts.hosts) < 2 or index is None:
            return True
        return not (hosts.is_down(index) or hosts.better_than(index))

    def close_all(self) -> None:
        self.host_list.stop()
        super().close_all()

    def _close_raw(self, conn) -> None:  # noqa: ANN001 - peewee's signature
        self._conn_hosts.pop(id(conn), None)
        super()._close_raw(conn)


class _LetGoOnCloseAll:
    """A pool whose ``close_all`` closes no connection another thread has checked out.

    peewee's closes those too, under whatever their threads are doing: a statement
    running on one then fails (MySQL, Postgres; SQLite crashed: see
    :meth:`WalSqliteDatabase.close_all`). Here they are let go of (no longer the pool's),
    each closed where its thread checks it in (or, SQLite's parked by its thread, where the
    next ``connect()`` or ``close_idle()`` takes it); one a thread never gives back is
    closed with its last reference, as the driver closes a connection nobody holds.
    """

    def _close(self, conn, close_conn=False):  # noqa: ANN001, ANN202 - peewee's signature
        with self._pool_lock:
            if not close_conn and self.conn_key(conn) not in self._in_use:
                # Let go of by close_all while its thread had it: closed, not pooled
                # (peewee's check-in would leave it open).
                self._close_raw(conn)
                self._pool_available.notify()
                return
            super()._close(conn, close_conn)

    def close_all(self) -> None:
        """Close this thread's connection and the idle ones; let go of the others."""
        self.close()
        with self._pool_lock:
            self.close_idle()
            self._in_use = {}
            self._pool_available.notify_all()


class _HostTracking:
    """Which host each driver connection went to, for :class:`_SafeReconnectMixin`."""

    #: whether the last connection made went to a Galera node
    galera = False

    def __init__(self, database, hosts=(), cool_down=None, **kwargs):  # noqa: ANN001, ANN003 - peewee's
        self.host_list = cluster.HostList(
            tuple(hosts),
            cluster.HOST_COOL_DOWN_SECONDS if cool_down is None else cool_down,
            probe=self._probe_host,
        )
        #: id of a driver connection -> its host's index
        self._conn_hosts: dict[int, int] = {}
        super().__init__(database, **kwargs)

    def _track(self, conn, index: int) -> None:  # noqa: ANN001 - a driver connection
        self.host_list.mark_up(index)
        self._conn_hosts[id(conn)] = index

    def _open_on(self, index: int):  # noqa: ANN202 - a driver connection
        """A new connection to host ``index`` alone, ready for use (or the driver's error)."""
        raise NotImplementedError

    def _probe_host(self, index: int) -> None:
        """Raise unless host ``index`` takes a connection and is ready (see :class:`~api.db.cluster.HostList`)."""
        self._open_on(index).close()


#: What a single-quoted MySQL string literal escapes with a backslash, the backslash first:
#: pymysql's table without the double quote, which needs none there (its ``\\"`` reads
#: back as ``"``; it is for literals in double quotes, which this module never writes).
_MYSQL_ESCAPES = tuple(
    (char, char, escaped)  # (what to look for, what to replace, its escape)
    for char, escaped in (
        ("\\", "\\\\"),
        ("\0", "\\0"),
        ("\n", "\\n"),
        ("\r", "\\r"),
        ("\032", "\\Z"),
        ("'", "\\'"),
    )
)
#: The same for text as UTF-8 bytes (each character escaped is one byte, and no other
#: character's UTF-8 holds an ASCII byte), with the byte looked for as an int: ``bytes in
#: bytes`` first tries its argument as an int and makes a TypeError (with its message).
_MYSQL_ESCAPES_UTF8 = tuple(
    (ord(char), char.encode(), escaped.encode()) for _, char, escaped in _MYSQL_ESCAPES
)


#: Those bytes, to delete from a short text: one C call tells whether it holds any.
_MYSQL_SPECIAL_UTF8 = bytes(probe for probe, _, _ in _MYSQL_ESCAPES_UTF8)
#: A text of fewer bytes is checked for bytes to escape at once (:data:`_MYSQL_SPECIAL_UTF8`);
#: a longer one (a snapshot) by ``bytes in bytes`` for each (memchr: no copy made).
_SHORT_TEXT_BYTES = 256


def escape_mysql_text(text: T_Text) -> T_Text:
    """``text`` escaped for a MySQL string literal in single quotes (``'...'``), as
    pymysql's ``escape_string`` does but for ``"``, left as it is.

    pymysql maps every character through a table (``str.translate``), about 20 ns a
    character: 100-160 us for a turn's 7 KB snapshot, which every end-of-turn UPDATE
    sends. One ``str.replace`` per special character found does the same in C. A
    snapshot is JSON, about one character in ten a ``"``: escaping those too was half
    the cost of sending the UPDATE (a replace of 500 of them in 5,000 characters, ~25 us).
    Given UTF-8 ``bytes``, the same in UTF-8.
    """
    for probe, char, escaped in _MYSQL_ESCAPES if isinstance(text, str) else _MYSQL_ESCAPES_UTF8:
        if probe in text:
            text = text.replace(char, escaped)
    return text


class Utf8Text:
    """A text value given as its UTF-8 bytes (:func:`api.db.prepared.mark_text`): a MySQL
    connection whose encoding is UTF-8 escapes the bytes and sends them as they are, so
    a text at hand as UTF-8 (a snapshot orjson wrote) is not decoded to be encoded again."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    @staticmethod
    def of(value: Any) -> Any:
        """``value``, UTF-8 ``bytes`` wrapped (a ``str`` as it is)."""
        return Utf8Text(value) if type(value) is bytes else value


class WriteMissed(Exception):  # noqa: N818 - says what happened, as peewee's DoesNotExist
    """A write sent with ``one_row`` (:meth:`Prepared.send
    <api.db.prepared.Prepared.send>`) matched no row, or several: its transaction is
    lost, nothing of it is committed (the caller's ``write_transaction`` rolls it back)."""

    def __init__(self, rowcount: int | None):
        self.rowcount = rowcount
        matched = "an unknown number of rows" if rowcount is None else f"{rowcount} rows"
        super().__init__(f"a write that had to match one row matched {matched}")


#: Postgres: what :func:`one_row_checked` makes the server say (its error's message begins
#: with the marker) when the write matched another number of rows, and that error's SQLSTATE.
ONE_ROW_MARKER = "agentcanvas: a write that had to match one row matched "
ONE_ROW_SQLSTATE = "22P02"  # invalid_text_representation: see one_row_checked


@functools.lru_cache(maxsize=64)
def one_row_checked(sql: str) -> str:
    """Postgres: the ``UPDATE`` or ``DELETE`` ``sql`` made one statement that answers one
    row (``rowcount`` 1) where it matched exactly one row, and otherwise fails, failing
    its transaction. The check is the server's, so the writes after it and the
    ``COMMIT`` go in the same round trip: none of them waits for its count.

    Plain SQL has no statement that raises an error of one's choosing, and a function
    that would (PL/pgSQL's ``RAISE``) must be created first, which the distributed
    engines of the family do not all allow (README, "Outgrowing one database server").
    So the error is a cast of a text that is no number: the server's message quotes the
    text, which says what happened (``... matched 0 rows``). The cast is evaluated only
    in that branch, as it depends on the count."""
    return (
        f"WITH written AS ({sql} RETURNING 1) SELECT CASE WHEN count(*) = 1 THEN 1 "
        f"ELSE ('{ONE_ROW_MARKER}' || count(*)::text || ' rows')::integer END FROM written"
    )


def _missed_on_server(exc: BaseException) -> WriteMissed | None:
    """The :class:`WriteMissed` a Postgres error is, if it is :func:`one_row_checked`'s."""
    if getattr(exc, "sqlstate", None) != ONE_ROW_SQLSTATE or ONE_ROW_MARKER not in str(exc):
        return None
    matched = re.search(re.escape(ONE_ROW_MARKER) + r"(\d+) rows", str(exc))
    return WriteMissed(int(matched[1]) if matched else None)


class Sent:
    """A write of the open transaction sent with the next statement (:meth:`Prepared.send
    <api.db.prepared.Prepared.send>`): its ``rowcount`` is known once the database has
    answered; reading it before then asks for the answer (one round trip).

    ``one_row``: the transaction must fail unless the write matched exactly one row
    (:meth:`check`, where the client checks it; Postgres checks it on the server)."""

    __slots__ = ("_database", "_rowcount", "one_row")

    def __init__(self, database: Database | None, rowcount: int | None = None, one_row: bool = False):
        self._database = database
        self._rowcount = rowcount
        self.one_row = one_row

    @classmethod
    def answered(cls, rowcount: int, one_row: bool) -> Sent:
        """A write run at once, its count checked (:meth:`check`)."""
        sent = cls(None, rowcount, one_row)
        sent.check()
        return sent

    def check(self) -> None:
        """Raise :class:`WriteMissed` if the write was to match one row and did not."""
        if self.one_row and self._rowcount != 1:
            raise WriteMissed(self._rowcount)

    @property
    def rowcount(self) -> int:
        if self._rowcount is None and self._database is not None:
            self._database.flush_deferred()
        return -1 if self._rowcount is None else self._rowcount

    @rowcount.setter
    def rowcount(self, value: int) -> None:
        self._rowcount = value


@functools.cache
def _mysql_connection_class() -> type:
    """pymysql's connection class as the pool uses it: a shared TLS context, a faster
    escape of values (:func:`escape_mysql_text`), the columns of results parsed once per
    connection (``Result``), and commands sent ahead of a statement in the same packet
    write.

    **TLS.** Given no TLS options, pymysql (1.1.1 and later) uses TLS if the server offers
    it and builds a new default context for every connection to be ready: it loads the
    system's CA certificates, about 20 ms of CPU per connection (a connection without
    it takes about 0.5 ms). That context verifies nothing and is the same every time, so
    it is made once and shared. Explicit TLS options still get a context of their own.

    **Commands sent ahead.** A server answers the commands of one connection in the order
    they came, so a command whose answer is only an OK can go out in the same write as
    the statement after it, and the two answers are read one after the other: one round
    trip instead of two. Three kinds:

    * the **check** of a connection taken from the pool (:attr:`unchecked`): a ``PING``
      whose answer is awaited at most the connect timeout, so that a server that
      stopped answering (frozen, or behind a network that drops packets) fails the
      statement within that time instead of hanging it, and the statement runs again
      on another connection. The ping goes ahead of a statement that may run on a
      server nobody listens to any more: a read, ``BEGIN``, or any statement of a
      transaction (never committed there). Ahead of a write outside a transaction it
      is a round trip of its own, as it always was, and the write is not sent when it
      fails (:attr:`CheckFailed.unsent`): a write waiting in a frozen server would be
      applied when it wakes up, after its caller was told it failed, or made it again
      elsewhere.
    * ``SET autocommit``: a transaction is begun by switching autocommit off
      (:meth:`begin_lazily`) ahead of its first statement, which starts it; ``COMMIT``
      or ``ROLLBACK`` ends it, and autocommit is switched on again ahead of the next
      statement outside a transaction (none is left open by then: a snapshot held
      between requests would hide other connections' writes from it). So ``BEGIN`` is
      no round trip of its own. Not ``BEGIN`` itself sent ahead: a ``BEGIN`` that
      fails (on Galera it waits for the cluster, and that wait can time out) would
      leave the statement behind it to run and commit alone, while ``SET autocommit``
      sets a session variable and has nothing to fail on.

    * **deferred writes** of the open transaction (:meth:`defer`, ``Prepared.send``):
      their answers are read before the statement's, at the latest before ``COMMIT``
      (a ``COMMIT`` sent behind a write that failed would commit the rest).

    A command sent ahead that fails closes the connection (the statement's answer is
    still on its way, out of step; the server rolls back the open transaction) and its
    error is raised.
    """
    import pymysql
    from pymysql import converters
    from pymysql.connections import MAX_PACKET_LEN, TEXT_TYPES, MySQLResult
    from pymysql.constants import COMMAND, CR, FIELD_TYPE, SERVER_STATUS
    from pymysql.protocol import FieldDescriptorPacket, MysqlPacket

    shared: list = []  # the TLS context, once made
    ping = struct.pack("<iB", 1, COMMAND.COM_PING)

    def query(sql: bytes) -> bytes:
        return struct.pack("<iB", len(sql) + 1, COMMAND.COM_QUERY) + sql

    autocommit_on, autocommit_off = query(b"SET autocommit=1"), query(b"SET autocommit=0")
    rollback = query(b"ROLLBACK")
    may_follow = tuple(verb.encode() for verb in (*_READ_VERBS, "BEGIN"))

    def _may_follow_check(sql: str | bytes) -> bool:
        """Whether ``sql`` outside a transaction may go out with the check: a read, or
        ``BEGIN`` (:meth:`_SafeReconnectMixin.begin` begins again elsewhere when it fails)."""
        return (sql if isinstance(sql, bytes) else sql.encode()).lstrip()[:8].upper().startswith(may_follow)

    class CheckFailed(pymysql.err.OperationalError):
        """The check of a pooled connection got no answer (2013): the connection is closed.

        ``unsent``: the statement was not sent (it runs nowhere). ``silent``: the
        server did not answer within the connect timeout (else it closed the connection).
        """

        def __init__(self, reason: BaseException, unsent: bool):
            super().__init__(
                CR.CR_SERVER_LOST, f"the database connection did not answer its check ({reason})"
            )
            self.unsent = unsent
            self.silent = isinstance(reason.__context__, TimeoutError)

    def describe(conn, field: FieldDescriptorPacket) -> tuple:  # noqa: ANN001 - a Connection
        """``(field, description, (encoding, converter))`` of a result's column, as
        pymysql's ``MySQLResult._get_descriptions`` works them out."""
        encoding = None
        if conn.use_unicode:
            if field.type_code == FIELD_TYPE.JSON:
                encoding = conn.encoding  # JSON is decoded by the connection's encoding
            elif field.type_code in TEXT_TYPES:
                encoding = None if field.charsetnr == 63 else conn.encoding  # 63: binary
            else:
                encoding = "ascii"
        converter = conn.decoders.get(field.type_code)
        if converter is converters.through:
            converter = None
        return field, field.description(), (encoding, converter)

    ok_tail = struct.Struct("<HH")  # an OK packet's server status and warning count
    eof_tail = struct.Struct("<xhh")  # an EOF packet's warning count and server status

    def length_encoded(data: bytes, pos: int) -> tuple[int | None, int]:
        """The length-encoded integer at ``data[pos]`` and the position after it (as
        pymysql's ``MysqlPacket.read_length_encoded_integer``: 251 is NULL)."""
        first = data[pos]
        if first < 251:
            return first, pos + 1
        if first == 252:
            return int.from_bytes(data[pos + 1 : pos + 3], "little"), pos + 3
        if first == 253:
            return int.from_bytes(data[pos + 1 : pos + 4], "little"), pos + 4
        if first == 254:
            return int.from_bytes(data[pos + 1 : pos + 9], "little"), pos + 9
        return None, pos + 1

    class Ok:
        """An OK packet read, with the fields of pymysql's ``OKPacketWrapper``, which
        parses them through a dozen calls (a ``struct.Struct`` made anew for two of
        them): a statement's answers hold several (the turn's commit, seven)."""

        __slots__ = ("affected_rows", "has_next", "insert_id", "message", "server_status", "warning_count")

        def __init__(self, data: bytes):
            # Nearly always single bytes (a count and an id under 251): read as such.
            affected, insert_id = data[1], data[2]
            if affected < 251 and insert_id < 251:
                self.affected_rows, self.insert_id, pos = affected, insert_id, 3
            else:
                self.affected_rows, pos = length_encoded(data, 1)
                self.insert_id, pos = length_encoded(data, pos)
            self.server_status, self.warning_count = ok_tail.unpack_from(data, pos)
            self.message = data[pos + 4 :]
            self.has_next = self.server_status & SERVER_STATUS.SERVER_MORE_RESULTS_EXISTS

    class Result(MySQLResult):
        """A result read without pymysql's steps per packet and column.

        The description of a statement's columns comes as the same bytes every time it
        runs, and pymysql parses it in Python, about 10 us a column (a turn's read of its
        session has nine): here a description known by its bytes is not parsed again.
        Its packets, and the rows', are read in one loop each (:meth:`Connection.read_payloads`),
        and the rows' values taken apart in one more: pymysql made about 25 calls a row.
        """

        def _get_descriptions(self) -> None:
            conn = self.connection
            raws = conn.read_payloads(self.field_count + 1)  # the columns, then an EOF
            eof = raws.pop()
            assert eof[0] == 0xFE and len(eof) < 9, "Protocol error, expecting EOF"  # pymysql's is_eof_packet
            key = b"".join(raws)  # each column's bytes say where they end: no two lists join alike
            known = conn.known_results.get(key)
            if known is None:
                if len(conn.known_results) >= _KNOWN_RESULTS:
                    conn.known_results.clear()
                columns = [describe(conn, FieldDescriptorPacket(raw, conn.encoding)) for raw in raws]
                known = conn.known_results[key] = (
                    [c[0] for c in columns],
                    [c[2] for c in columns],
                    tuple(c[1] for c in columns),
                )
            self.fields, self.converters, self.description = known

        def _read_rowdata_packet(self) -> None:
            # pymysql's, with its _read_row_from_packet inline
            payloads = self.connection.read_payloads(None)
            self._read_eof(payloads.pop())
            self.connection = None  # as pymysql: no reference cycle
            converters = self.converters
            rows = []
            for data in payloads:
                row, pos, end = [], 0, len(data)
                for encoding, converter in converters:
                    if pos >= end:  # fewer values than columns (pymysql stops there too)
                        break
                    first = data[pos]
                    if first < 251:
                        value, pos = data[pos + 1 : pos + 1 + first], pos + 1 + first
                    elif first == 251:  # NULL
                        row.append(None)
                        pos += 1
                        continue
                    else:
                        length, pos = length_encoded(data, pos)
                        value, pos = data[pos : pos + length], pos + length
                    if encoding is not None:
                        value = value.decode(encoding)
                    if converter is not None:
                        value = converter(value)
                    row.append(value)
                rows.append(tuple(row))
            self.affected_rows = len(rows)
            self.rows = tuple(rows)

        def _read_ok_packet(self, packet: MysqlPacket) -> None:
            ok = Ok(packet.get_all_data())
            self.affected_rows, self.insert_id, self.message = ok.affected_rows, ok.insert_id, ok.message
            self.server_status, self.warning_count = ok.server_status, ok.warning_count
            self.has_next = ok.has_next

        def _check_packet_is_eof(self, packet: MysqlPacket) -> bool:
            return self._read_eof(packet.get_all_data())

        def _read_eof(self, data: bytes) -> bool:
            """Whether ``data`` is an EOF packet; if so, its warning count and status are read."""
            if not (data[0] == 0xFE and len(data) < 9):  # pymysql's is_eof_packet
                return False
            self.warning_count, status = eof_tail.unpack_from(data)
            self.has_next = status & SERVER_STATUS.SERVER_MORE_RESULTS_EXISTS
            return True

    class Connection(pymysql.connections.Connection):
        #: taken from the pool, not heard from since: the next statement takes the check along
        unchecked = False
        #: ``False`` while a transaction begun by :meth:`begin_lazily` is open
        autocommit_wanted = True
        #: whether a statement went out since :meth:`begin_lazily` (else COMMIT and ROLLBACK have nothing to end)
        began = False
        #: whether the server is a Galera node (set when connected)
        galera = False
        #: statements of the open transaction to send with the next one: (packet, Sent)
        deferred: tuple = ()
        #: whether one of them must match one row (``Sent.one_row``): they go, and are
        #: checked, before another statement (:meth:`_send_ahead`)
        must_match = False
        _ahead = b""
        #: the error of a failed check (set below)
        CheckFailed: type

        def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003 - pymysql's signature
            #: the descriptions of results seen, by their bytes (see Result)
            self.known_results: dict[bytes, tuple] = {}
            super().__init__(*args, **kwargs)

        def _read_query_result(self, unbuffered: bool = False) -> int:
            # pymysql's, with a Result of the class above
            self._result = None
            result = Result(self)
            if unbuffered:
                result.init_unbuffered_query()
            else:
                result.read()
            self._result = result
            if result.server_status is not None:
                self.server_status = result.server_status
            return result.affected_rows

        def _read_packet(self, packet_type: type = MysqlPacket) -> MysqlPacket:
            return packet_type(self.read_payloads(1)[0], self.encoding)

        def read_payloads(self, count: int | None) -> list[bytes]:
            """The payloads of the next ``count`` packets (``None``: up to an EOF packet,
            the last one), read as pymysql's ``_read_packet`` reads each: its reads inline
            (its _read_bytes twice a packet, the join of the parts and is_error_packet
            were four calls a packet, and a request of a turn reads about twenty). An
            error packet is raised. Failures are pymysql's (see _read_failed)."""
            if self._current_timeout != self._read_timeout:
                self._sock.settimeout(self._read_timeout)
                self._current_timeout = self._read_timeout
            read = self._rfile.read
            payloads = []
            while count is None or len(payloads) < count:
                parts = []
                while True:
                    try:
                        header = read(4)
                    except BaseException as exc:  # noqa: BLE001 - as pymysql's _read_bytes
                        header = self._read_failed(exc, 4)
                    if len(header) < 4:
                        self._read_failed(None, 4)
                    number = header[3]
                    if number != self._next_seq_id:
                        self._force_close()
                        if number == 0:  # MariaDB sends an error with 0 when it shuts down
                            raise pymysql.err.OperationalError(
                                CR.CR_SERVER_LOST, "Lost connection to MySQL server during query"
                            )
                        raise pymysql.err.InternalError(
                            f"Packet sequence number wrong - got {number} expected {self._next_seq_id}"
                        )
                    self._next_seq_id = (number + 1) % 256
                    length = header[0] | header[1] << 8 | header[2] << 16
                    try:
                        data = read(length)
                    except BaseException as exc:  # noqa: BLE001 - as pymysql's _read_bytes
                        data = self._read_failed(exc, length)
                    if len(data) < length:
                        self._read_failed(None, length)
                    if length < MAX_PACKET_LEN:
                        break
                    parts.append(data)  # one of a statement's 16 MB pieces: more follow
                if parts:
                    parts.append(data)
                    data = b"".join(parts)
                first = data[0]
                if first == 0xFF:  # an error (pymysql's is_error_packet)
                    if self._result is not None and self._result.unbuffered_active is True:
                        self._result.unbuffered_active = False
                    MysqlPacket(data, self.encoding).raise_for_error()
                payloads.append(data)
                if count is None and first == 0xFE and len(data) < 9:  # EOF (pymysql's is_eof_packet)
                    break
            return payloads

        def _read_failed(self, exc: BaseException | None, wanted: int) -> bytes:
            """What pymysql's ``_read_bytes`` does when a read raised ``exc`` or (``None``)
            came short: read again if it was interrupted (returns the bytes), else close
            the connection and raise."""
            if isinstance(exc, OSError) and exc.errno == errno.EINTR:
                return self._read_bytes(wanted)
            self._force_close()
            if exc is None:
                raise pymysql.err.OperationalError(
                    CR.CR_SERVER_LOST, "Lost connection to MySQL server during query"
                )
            if isinstance(exc, OSError):
                raise pymysql.err.OperationalError(
                    CR.CR_SERVER_LOST, f"Lost connection to MySQL server during query ({exc})"
                )
            raise exc

        def _read_ok_packet(self) -> Ok:
            # pymysql's, with an Ok of the class above
            data = self.read_payloads(1)[0]
            if not (data[0] == 0 and len(data) >= 7):  # pymysql's is_ok_packet
                raise pymysql.err.OperationalError(CR.CR_COMMANDS_OUT_OF_SYNC, "Command Out of Sync")
            ok = Ok(data)
            self.server_status = ok.server_status
            return ok

        def _create_ssl_ctx(self, sslp):  # noqa: ANN001, ANN202 - pymysql's signature
            if sslp != {}:
                return super()._create_ssl_ctx(sslp)
            if not shared:
                shared.append(super()._create_ssl_ctx({}))
            return shared[0]

        def _escape_string(self, s: str) -> str:
            if self.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
                return s.replace("'", "''")  # as pymysql: only quotes, doubled
            return escape_mysql_text(s)

        escape_string = _escape_string  # its name before pymysql 2

        def escape(self, obj, mapping=None) -> str:  # noqa: ANN001 - pymysql's signature
            # The values of most parameters, without pymysql's look-up of an encoder
            # (escape_int, escape_None: the same text). bool is a type of its own.
            kind = type(obj)
            if kind is int:
                return str(obj)
            if kind is str:
                return f"'{self._escape_string(obj)}'"
            if obj is None:
                return "NULL"
            if kind is Utf8Text:
                return f"'{self._escape_string(obj.data.decode('utf-8'))}'"
            return super().escape(obj, mapping)

        def literal_utf8(self, obj) -> bytes:  # noqa: ANN001 - any value pymysql escapes
            """The literal of ``obj`` as :meth:`escape` writes it, in UTF-8 (the
            connection's encoding): a text is escaped as its bytes."""
            kind = type(obj)
            if kind is Utf8Text:
                text = obj.data
            elif kind is str:
                text = obj.encode("utf-8")
            elif kind is int:
                return b"%d" % obj
            elif obj is None:
                return b"NULL"
            else:
                return self.escape(obj).encode("utf-8", "surrogateescape")  # as pymysql encodes a statement
            if self.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
                return b"'" + text.replace(b"'", b"''") + b"'"  # as _escape_string
            return b"'" + escape_mysql_text(text) + b"'"

        def check(self) -> None:
            """Ping the server now, waiting at most the connect timeout for its answer.

            Raises:
                CheckFailed: no answer; the connection is closed.
            """
            self.unchecked = False
            try:
                self._execute_command(COMMAND.COM_PING, "")
            except pymysql.err.MySQLError as exc:
                raise CheckFailed(exc, unsent=True) from exc
            self._read_answers_ahead((True,), unsent=True)

        def begin_lazily(self) -> None:
            """Begin a transaction with the next statement (see the class docstring)."""
            self.autocommit_wanted, self.began = False, False

        def end_lazily(self) -> None:
            self.autocommit_wanted, self.began, self.deferred, self.must_match = True, False, (), False

        def bind(self, sql: str, params: tuple | list) -> bytes:
            """``sql`` with ``params`` escaped into it, as a cursor's ``mogrify`` does
            (without making a cursor), encoded. In UTF-8 the values are encoded one by
            one and put into the encoded ``sql``: a text's characters are not copied
            into a ``str`` of the whole statement (of its widest character's size) to
            be encoded with it."""
            try:
                if self.encoding != "utf8":
                    return (sql % tuple(map(self.escape, params))).encode(self.encoding)
                if self.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
                    return sql.encode("utf-8") % tuple(map(self.literal_utf8, params))
                # literal_utf8's literals, made in one loop (a statement binds up to 20
                # values, and a call per value and a loop over the six escapes per text
                # cost more than the rest of binding): most texts hold nothing to
                # escape, which one C call finds out for a short one.
                literals = []
                add = literals.append
                for value in params:
                    kind = type(value)
                    if kind is str:
                        value = value.encode()  # UTF-8 (no argument to parse)
                    elif kind is Utf8Text:
                        value = value.data
                    elif kind is int:
                        add(b"%d" % value)
                        continue
                    elif value is None:
                        add(b"NULL")
                        continue
                    elif kind is bool:
                        add(b"1" if value else b"0")  # as pymysql's escape_bool
                        continue
                    else:
                        add(self.literal_utf8(value))
                        continue
                    if len(value) >= _SHORT_TEXT_BYTES or len(
                        value.translate(None, _MYSQL_SPECIAL_UTF8)
                    ) != len(value):
                        value = escape_mysql_text(value)
                    add(b"'%s'" % value)
                return sql.encode() % tuple(literals)
            except TypeError as exc:
                raise pymysql.err.ProgrammingError(str(exc)) from exc

        def defer(self, sql: bytes, sent: Sent) -> None:
            """Send ``sql`` (a write of the open transaction, its values bound and
            encoded: :meth:`bind`) with the next statement; its answer fills ``sent``."""
            self.deferred = (*self.deferred, (query(sql), sent))
            self.must_match = self.must_match or sent.one_row

        def flush(self) -> None:
            """Send the deferred statements now and read their answers: one round trip.

            Raises WriteMissed: one that had to match one row did not (every answer read:
            the connection stays usable, for the ROLLBACK)."""
            deferred = self.deferred
            if deferred:
                self._send_ahead(None)
                if self.must_match:
                    self.must_match = False
                    for _, sent in deferred:
                        sent.check()

        def _execute_command(self, command, sql):  # noqa: ANN001, ANN202 - pymysql's signature
            if command != COMMAND.COM_QUERY:
                return super()._execute_command(command, sql)
            return self._send_ahead(sql)

        def _send_ahead(self, sql) -> None:  # noqa: ANN001 - str or bytes, or None (the deferred alone)
            if not self._sock:
                raise pymysql.err.InterfaceError(0, "")  # closed (as pymysql says it)
            if self.must_match and sql is not None:
                # A write before it must match one row: MySQL runs each statement sent
                # ahead whatever the one before answered, so they go, and are checked,
                # first (no statement after one that missed runs; COMMIT included).
                self.flush()
            ahead, answers = [], []
            if self.unchecked:
                if self.autocommit_wanted and sql is not None and not _may_follow_check(sql):
                    self.check()  # a round trip of its own: this statement is sent only if it passes
                else:
                    self.unchecked = False
                    ahead.append(ping)
                    answers.append(True)
            status = self.server_status
            if self.autocommit_wanted:
                if not status & SERVER_STATUS.SERVER_STATUS_AUTOCOMMIT:
                    if status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
                        # Left open (never by this module's own transactions): switching
                        # autocommit on would commit it.
                        ahead.append(rollback)
                        answers.append(False)
                    ahead.append(autocommit_on)
                    answers.append(False)
            else:
                self.began = True
                if status & SERVER_STATUS.SERVER_STATUS_AUTOCOMMIT:
                    ahead.append(autocommit_off)
                    answers.append(False)
            for packet, sent in self.deferred:
                ahead.append(packet)
                answers.append(sent)
            if sql is not None and not ahead:
                return super()._execute_command(COMMAND.COM_QUERY, sql)
            self._ahead = b"".join(ahead)
            try:
                if sql is None:
                    self._write_bytes(b"")
                else:
                    super()._execute_command(COMMAND.COM_QUERY, sql)
            except pymysql.err.OperationalError as exc:
                if answers[0] is True and cluster.connection_failed(exc):
                    raise CheckFailed(exc, unsent=False) from exc
                raise
            finally:
                self._ahead = b""
            expected = self._next_seq_id  # of the statement's answer (more than 1 after a 16 MB statement)
            self._read_answers_ahead(answers, unsent=False)
            self.deferred = ()  # answered (kept until then: a new connection sends them again)
            self._next_seq_id = expected
            return None

        def _write_bytes(self, data):  # noqa: ANN001, ANN202 - pymysql's signature
            if self._ahead:
                data, self._ahead = self._ahead + data, b""
            super()._write_bytes(data)

        def _read_answers_ahead(self, answers, unsent: bool) -> None:  # noqa: ANN001
            """Read the OK of each command sent ahead. ``answers``: ``True`` for the check
            (awaited at most the connect timeout), ``False`` for a command whose OK is all,
            or the :class:`Sent` of a deferred statement; ``unsent``: no statement follows."""
            read_timeout = self._read_timeout
            try:
                for answer in answers:
                    bounded = answer is True
                    self._read_timeout = (read_timeout or self.connect_timeout) if bounded else read_timeout
                    self._next_seq_id = 1
                    try:
                        ok = self._read_ok_packet()
                    except pymysql.err.OperationalError as exc:
                        if bounded and cluster.connection_failed(exc):
                            raise CheckFailed(exc, unsent=unsent) from exc
                        raise
                    if not isinstance(answer, bool):
                        answer.rowcount = ok.affected_rows
            except BaseException:
                self._force_close()  # the statement's answer would be read as this one's
                raise
            finally:
                self._read_timeout = read_timeout

    Connection.CheckFailed = CheckFailed
    return Connection


class _HostsMySQLDatabase(_HostTracking, MySQLDatabase):
    """MySQL on the first usable of several hosts (:class:`~api.db.cluster.HostList`).

    A new connection tries the hosts in the list's order; a host that refuses the
    connection, drops it, or is a Galera node that is not ready is marked down and the next
    one is tried. A connection to a Galera node reads its own writes across the
    cluster (:func:`~api.db.cluster.prepare_mysql_connection`). If no host answers, the
    error names each host with its reason (one host: the driver's error as it is).
    ``wsrep_sync_wait`` is what such a connection sets (the URL option of that name).
    """

    def __init__(self, database, wsrep_sync_wait=cluster.WSREP_SYNC_WAIT, **kwargs):  # noqa: ANN001, ANN003
        self.wsrep_sync_wait = wsrep_sync_wait
        super().__init__(database, **kwargs)

    def _open_on(self, index: int):  # noqa: ANN202 - a driver connection

        host, port = self.host_list.hosts[index]
        params = dict(self.connect_params)
        read_timeout = params.pop("read_timeout", None)
        # The server's greeting and the login are read with the connect timeout, so that
        # a host that takes the TCP connection and never answers (a frozen server) fails
        # the connection instead of hanging it forever (pymysql reads them with the read
        # timeout, by default none); statements then read as the URL says.
        handshake_timeout = read_timeout or params.get("connect_timeout")
        conn = _mysql_connection_class()(
            database=self.database,
            autocommit=True,
            host=host,
            port=port,
            read_timeout=handshake_timeout,
            **params,
        )
        conn._read_timeout = read_timeout  # noqa: SLF001 - pymysql has no setter; applied at the next read
        try:
            self.galera = conn.galera = cluster.prepare_mysql_connection(
                conn, self.host_list.where(index), self.wsrep_sync_wait
            )
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        return conn

    def _connect(self):  # noqa: ANN202 - peewee's signature
        import pymysql

        hosts = self.host_list
        failures: list[tuple[str, Exception]] = []
        for index in hosts.candidates():
            try:
                conn = self._open_on(index)
            except pymysql.MySQLError as exc:
                if not cluster.node_unusable(exc):
                    raise
                hosts.mark_down(index, exc)
                failures.append((hosts.where(index), exc))
                continue
            self._track(conn, index)
            return conn
        if len(failures) == 1:
            raise failures[0][1]
        code = cluster.mysql_code(failures[-1][1]) or 2003
        reasons = "; ".join(f"{where}: {exc.args[-1] if exc.args else exc}" for where, exc in failures)
        raise pymysql.err.OperationalError(code, f"no database host is usable ({reasons})")


class ReconnectingPooledMySQLDatabase(
    _SafeReconnectMixin, _LetGoOnCloseAll, PooledMySQLDatabase, _HostsMySQLDatabase
):
    """Pooled MySQL/MariaDB through pymysql on one of several hosts, reconnecting dropped connections."""

    #: a text value given as UTF-8 bytes, as its connections take it (:class:`Utf8Text`)
    text_of_utf8 = staticmethod(Utf8Text.of)

    def _is_closed(self, conn) -> bool:  # noqa: ANN001 - a pymysql connection
        # No round trip here: the connection's first statement takes the check along
        # (see _mysql_connection_class). A connection whose socket is closed is dropped.
        if conn._sock is None:  # noqa: SLF001 - pymysql has no public "closed"
            return True
        conn.unchecked = True
        return False

    def _can_reuse(self, conn) -> bool:  # noqa: ANN001 - a pymysql connection
        # peewee rolls back at check-in unless the driver says no transaction is open;
        # pymysql has no ``in_transaction``, so peewee sent a ROLLBACK for every
        # request (a round trip). The status the server sent with its last reply
        # says it: a statement that failed leaves the earlier status, so an open
        # transaction is rolled back still.
        from pymysql.constants import SERVER_STATUS

        reusable = True
        if conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
            reusable = super()._can_reuse(conn)
        conn.end_lazily()
        return reusable

    def begin(self, isolation_level: str | None = None) -> None:
        """Begin a transaction; on a connection to a server without Galera, with its
        first statement (no round trip of its own, see :func:`_mysql_connection_class`).

        If that statement finds the connection gone (its check failed, or it was
        dropped), the transaction is begun again on a new connection
        (:meth:`_SafeReconnectMixin.execute_sql`), as a ``BEGIN`` that failed is.
        """
        conn = self.connection()
        if isolation_level or conn.galera:
            super().begin(isolation_level)
        else:
            conn.begin_lazily()

    def _begins_transaction(self) -> bool:
        conn = self._state.conn
        return conn is not None and not conn.autocommit_wanted and not conn.began

    def _reopen_transaction(self) -> None:
        carried = self._state.conn.deferred  # sent, not answered: they go again
        self._reopen()
        conn = self._state.conn  # a new connection: no check needed
        if conn.galera:
            _SafeReconnectMixin.begin(self)
        else:
            conn.begin_lazily()
        conn.deferred = carried
        conn.must_match = any(sent.one_row for _, sent in carried)

    def defer(self, sql: str, params: tuple | list, one_row: bool = False) -> Sent:
        """Run the write ``sql`` as part of the open transaction, sent with the next
        statement (no round trip of its own); outside a transaction, now.

        Its answer is read with the next statement's, at the latest before ``COMMIT``
        (:meth:`flush_deferred`): an error of it is raised there, the transaction is
        lost (the connection is closed, the server rolls it back). ``one_row``: the
        deferred writes go before the next statement, in a round trip of their own,
        and :class:`WriteMissed` is raised, the statement not sent, unless it matched
        one row.

        Only in a transaction begun with autocommit off (:meth:`begin` without Galera):
        one begun by ``BEGIN`` on a connection in autocommit mode (Galera, an isolation
        level) ends when a statement of it fails with a deadlock (1213, Galera's
        brute-force abort too), and the statements sent behind it then run and commit
        one by one (seen on MariaDB: a deferred INSERT behind an UPDATE chosen as the
        deadlock's victim stayed committed after the connection was closed). There it
        runs now.
        """
        conn = self._state.conn
        if conn is None or not self.in_transaction() or conn.autocommit_wanted:
            return Sent.answered(self.execute_sql(sql, params).rowcount, one_row)
        with __exception_wrapper__:
            text = conn.bind(sql, params)
        if len(text) > _DEFERRED_MAX_BYTES:  # one packet each (pymysql splits larger ones)
            self.flush_deferred()
            return Sent.answered(self.execute_sql(sql, params).rowcount, one_row)
        sent = Sent(self, one_row=one_row)
        conn.defer(text, sent)
        return sent

    def flush_deferred(self) -> None:
        """Send the deferred statements now (if any) and read their answers."""
        conn = self._state.conn
        if conn is None or not conn.deferred:
            return
        first = self._begins_transaction()
        try:
            with __exception_wrapper__:
                conn.flush()
        except (OperationalError, InterfaceError) as exc:
            if not (self._connection_lost(exc) or cluster.node_unusable(exc)):
                raise
            self._leave_host(exc)
            if not first:
                raise
            self._reopen_transaction()  # nothing of it was answered: all of it again
            with __exception_wrapper__:
                self._state.conn.flush()

    def commit(self) -> None:
        self.flush_deferred()  # answered before COMMIT: a deferred write that failed is not committed past
        conn = self._state.conn
        if conn is None or conn.autocommit_wanted:  # begun with BEGIN, or by the driver
            self._send_commit()
            return
        if conn.began:  # else nothing of it reached the server: nothing to commit
            self._send_commit()
        conn.end_lazily()  # not after a failed COMMIT: the ROLLBACK that follows is sent as it is

    def _send_commit(self) -> None:
        """``COMMIT``, as peewee's ``commit`` sends it, through the driver's own ``commit``:
        the same statement, its OK read without a cursor and a result around it."""
        if self.is_closed():
            super().commit()  # raises peewee's InterfaceError
            return
        with __exception_wrapper__:
            self._state.conn.commit()

    def rollback(self) -> None:
        conn = self._state.conn
        if conn is not None:
            conn.deferred, conn.must_match = (), False  # never answered, so never applied
        if conn is None or conn._sock is None:  # noqa: SLF001 - pymysql has no public "closed"
            # The connection is gone, and the transaction with it. (Sending ROLLBACK
            # raised an InterfaceError (0, '') in place of the error that ended it.)
            if conn is not None:
                conn.end_lazily()
            return
        try:
            if conn.autocommit_wanted or conn.began:  # else nothing of it reached the server
                super().rollback()
        finally:
            conn.end_lazily()


class _HostsPostgresqlDatabase(_HostTracking, PostgresqlDatabase):
    """Postgres on one of several hosts: libpq tries them in order (``host=h1,h2``,
    ``port=p1,p2``, with ``target_session_attrs`` and the URL's other options as given),
    those that are up first; the host it chose is noted, and those it passed over are
    down until a probe reaches them (:class:`~api.db.cluster.HostList`)."""

    def _open_on(self, index: int):  # noqa: ANN202 - a driver connection
        host, port = self.host_list.hosts[index]
        return self._adapter.connect(self, **{**self.connect_params, "host": host, "port": str(port)})

    def _connect(self):  # noqa: ANN202 - peewee's signature
        # libpq tries the hosts in the order given: those that are up first.
        hosts = self.host_list
        order = hosts.candidates()
        params = {
            **self.connect_params,
            "host": ",".join(hosts.hosts[i][0] for i in order),
            "port": ",".join(str(hosts.hosts[i][1]) for i in order),
        }
        conn = self._adapter.connect(self, **params)
        from api.db import pgtext  # psycopg only when Postgres is used

        pgtext.use_text_encoding(conn)  # text holding NUL is stored as sent
        if self._isolation_level:
            conn.set_isolation_level(self._isolation_level)
        conn.autocommit = True
        info = conn.info
        index = next((i for i in order if hosts.hosts[i] == (info.host, info.port)), order[0])
        for earlier in order[: order.index(index)]:
            hosts.mark_down(earlier, "libpq passed it over")
        self._track(conn, index)
        return conn


class ReconnectingPooledPostgresqlDatabase(
    _SafeReconnectMixin, _LetGoOnCloseAll, PooledPostgresqlDatabase, _HostsPostgresqlDatabase
):
    """Pooled PostgreSQL through psycopg 3 on one of several hosts, reconnecting dropped connections."""

    # The models' LONGTEXT and LONGBLOB (for MySQL) are TEXT and BYTEA here: both unbounded.
    field_types = {**PooledPostgresqlDatabase.field_types, "LONGTEXT": "TEXT", "LONGBLOB": "BYTEA"}

    def begin(self, isolation_level=None):  # noqa: ANN001, ANN201 - peewee's signature
        """``BEGIN``, held back until the transaction's first statement (given no isolation
        level, with a libpq that has pipeline mode): it goes in the same round trip as
        the writes sent first (:meth:`defer`), or just before any other statement; a
        transaction that reaches the server with nothing costs no round trip at all."""
        self._state.deferred = None  # a new transaction holds nothing of an earlier one
        if isolation_level is not None or self._isolation_level or not _pipeline_supported():
            self._state.begin_held = False
            return super().begin(isolation_level)
        if self.is_closed():
            self.connect()
        self._state.begin_held = True
        return None

    def defer(self, sql: str, params: tuple | list, one_row: bool = False) -> Sent:
        """Run the write ``sql`` as part of the open transaction, sent with the other writes
        deferred after it in one round trip (psycopg's pipeline mode) when its answer, or
        another statement, is wanted; outside a transaction (or where libpq has no
        pipeline mode), now.

        They go before the transaction's next statement (:meth:`execute_sql`), when a
        ``Sent.rowcount`` is read, and at the latest with ``COMMIT``, in the same round
        trip (:meth:`commit`), after the held ``BEGIN`` if the transaction has sent
        nothing yet: an error of one is raised there and the transaction is lost, as if
        it had been run at once. ``one_row``: the server fails the transaction unless
        the write matched one row (:func:`one_row_checked`), raised as
        :class:`WriteMissed`. A turn's end (``BEGIN``, the session's checked ``UPDATE``,
        its state, its messages, ``COMMIT``) so costs one round trip instead of five.
        """
        conn = self._state.conn
        if conn is None or not self.in_transaction() or not _pipeline_supported():
            return Sent.answered(self.execute_sql(sql, params).rowcount, one_row)
        held = getattr(self._state, "deferred", None)
        if held is None or held[0] is not conn:  # none yet, or of a connection since let go
            held = self._state.deferred = (conn, [])
        sent = Sent(self)  # checked by the server
        held[1].append((one_row_checked(sql) if one_row else sql, params, sent))
        return sent

    def flush_deferred(self, commit: bool = False) -> bool:
        """Send the held ``BEGIN`` and the deferred writes now (if any), in one round trip,
        and read their answers; with ``commit``, the ``COMMIT`` too, if there was a
        write to send. Whether the ``COMMIT`` went.

        A connection found gone in that round trip, when it held the ``BEGIN`` and no
        ``COMMIT``, lost nothing answered: the transaction is sent again, whole, on a
        new connection (as a ``BEGIN`` that failed is, :meth:`_SafeReconnectMixin.begin`).
        With the ``COMMIT``, whether the server committed is not known: the error is
        raised (a turn reads its outcome back, ``TurnService._outcome_after_failed_commit``)."""
        state = self._state
        held, begin = getattr(state, "deferred", None), getattr(state, "begin_held", False)
        if not held and not begin:
            return False
        state.deferred, state.begin_held = None, False
        writes = held[1] if held and held[0] is state.conn else []  # else gone with their connection
        if not writes:
            if begin:
                super().begin()  # on its own, before a statement that is not a sent write
            return False
        try:
            self._send_in_pipeline(begin, writes, commit)
        except (OperationalError, InterfaceError) as exc:
            if commit or not begin or not (self._connection_lost(exc) or cluster.node_unusable(exc)):
                raise
            self._leave_host(exc)
            self._reopen()
            self._send_in_pipeline(begin, writes, commit)
        return commit

    def _send_in_pipeline(self, begin: bool, writes: list[tuple[str, Any, Sent]], commit: bool) -> None:
        conn = self._state.conn
        cursors = []
        with __exception_wrapper__:
            try:
                with conn.pipeline():
                    if begin:
                        conn.cursor().execute("BEGIN")
                    for sql, params, sent in writes:
                        cursor = conn.cursor()
                        cursor.execute(sql, params)
                        cursors.append((cursor, sent))
                    if commit:
                        conn.cursor().execute("COMMIT")
            except Exception as exc:
                # psycopg (3.3.9) holds a statement prepared once it has sent its Parse
                # (the 5th time it runs, prepare_threshold); where an earlier statement
                # of the pipeline failed, the server skipped that Parse, and every later
                # use of the statement on this connection would fail ("prepared
                # statement "_pg3_2" does not exist"). So this connection prepares
                # nothing more, and is closed when given back (_can_reuse).
                conn.prepare_threshold = None
                _PREPARED_UNSURE.add(conn)
                missed = _missed_on_server(exc)
                if missed is not None:
                    raise missed from exc
                raise
        for cursor, sent in cursors:
            sent.rowcount = cursor.rowcount

    def execute_sql(self, sql, params=None):  # noqa: ANN001 - peewee's signature
        state = self._state
        if getattr(state, "deferred", None) or getattr(state, "begin_held", False):
            self.flush_deferred()  # the transaction's BEGIN and writes, in order, before what follows
        return super().execute_sql(sql, params)

    def commit(self) -> None:
        state = self._state
        if getattr(state, "begin_held", False) and not getattr(state, "deferred", None):
            state.begin_held = False  # nothing of the transaction reached the server
            return None
        if self.flush_deferred(commit=True):  # the writes and COMMIT in one round trip
            return None  # (a write that fails fails the COMMIT after it: the server skips it)
        return super().commit()

    def rollback(self) -> None:
        state = self._state
        state.deferred = None  # never sent, so never applied
        if getattr(state, "begin_held", False):
            state.begin_held = False  # nor was the BEGIN
            return None
        return super().rollback()

    def _can_reuse(self, conn) -> bool:  # noqa: ANN001 - a psycopg connection
        # Not one whose prepared statements psycopg may have wrong (_send_in_pipeline).
        return conn not in _PREPARED_UNSURE and super()._can_reuse(conn)

    def _is_closed(self, conn) -> bool:  # noqa: ANN001 - a psycopg connection
        # peewee checks an idle pooled connection with SELECT 1, a round trip per
        # request. A connection the server ended (restart, crash, pg_terminate_backend)
        # has that end waiting in its socket: it is readable while nothing was asked.
        # So the socket is looked at without waiting, and only a readable one is asked.
        # (A frozen server is not found either way: libpq has no read timeout.)
        from psycopg.pq import TransactionStatus

        if conn.closed or conn.pgconn.transaction_status != TransactionStatus.IDLE:
            return super()._is_closed(conn)
        try:
            poll = select.poll()
            poll.register(conn.pgconn.socket, select.POLLIN)
            said_something = bool(poll.poll(0))
        except Exception:  # noqa: BLE001 - no socket to look at (psycopg's OperationalError, OSError)
            return True
        return super()._is_closed(conn) if said_something else False


#: Postgres connections whose prepared statements psycopg may have wrong, closed when
#: given back to the pool (ReconnectingPooledPostgresqlDatabase._send_in_pipeline).
_PREPARED_UNSURE: weakref.WeakSet = weakref.WeakSet()


@functools.cache
def _pipeline_supported() -> bool:
    """Whether the libpq psycopg uses has pipeline mode (14 and later)."""
    import psycopg

    return psycopg.Pipeline.is_supported()


#: This process's id, kept up to date by a fork handler: os.getpid() is a system call,
#: and the writer lock asks for it twice a transaction.
_PID = os.getpid()


def _forked() -> None:
    global _PID
    _PID = os.getpid()
    for lock in list(_WRITER_LOCKS):
        lock._forked()


#: Every write lock of this process, each made anew in a forked child (_WriterLock._forked).
_WRITER_LOCKS: weakref.WeakSet[_WriterLock] = weakref.WeakSet()
os.register_at_fork(after_in_child=_forked)


class _WriterLock:
    """The write lock of one SQLite database for the threads of this process **and** the
    other processes on this machine (gunicorn's workers): a thread lock, then an
    exclusive ``flock`` on a file beside the database, taken by the outermost holder.

    SQLite's own lock is no queue: a connection that finds it taken sleeps 1, 2, 5, 10...
    up to 100 ms between looks (its busy handler), whatever the holder needs (~0.1 ms for
    a turn's commit); with two workers at 16 clients, 17% of BEGIN IMMEDIATE waited over
    0.5 ms, 18 ms at the 99th percentile, about 2 s of each worker's 5 s, and the sleeper
    held its process's lock meanwhile. A blocked ``flock`` is woken when the lock is let
    go. Where the file cannot be made (a read-only folder) the thread lock alone remains,
    as before. The file's descriptor is opened per process (a forked worker opens its own:
    one shared across a fork would make the lock one holder's for all).
    """

    def __init__(self, path: str):
        self._thread_lock = threading.RLock()
        self._path = f"{path}-writer"
        self._depth = 0
        self._fd: int | None = None
        self._pid = 0
        _WRITER_LOCKS.add(self)

    def _forked(self) -> None:
        """In a forked child: a lock another thread of the parent held (the checkpoint
        thread's, a writer's) is free, as that thread is not in the child to let it go."""
        if not self._thread_lock._is_owned():  # type: ignore[attr-defined] - RLock's own check
            self._thread_lock = threading.RLock()
            self._depth = 0

    def _file(self) -> int | None:
        if self._pid != _PID:
            self._pid, self._fd = _PID, None
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                self._fd = None
        return self._fd

    def __enter__(self) -> None:
        self.acquire()

    def acquire(self, timeout: float = -1) -> bool:
        """Take the lock (as ``with``); false, not taken, when this process's threads
        held it past ``timeout`` seconds (another process's holder is waited for)."""
        if not self._thread_lock.acquire(timeout=timeout):
            return False
        if self._depth == 0:
            fd = self._file()
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except OSError:
                    pass  # no lock between processes: SQLite's busy handler still serialises
        self._depth += 1
        return True

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None and self._pid == _PID:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            except OSError:
                pass  # closed meanwhile: the lock went with it
        self._thread_lock.release()

    def close(self) -> None:
        """Close the file (opened again by the next writer), unless a writer holds it."""
        with self._thread_lock:
            if self._depth == 0 and self._fd is not None and self._pid == _PID:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd, self._pid = None, 0

    def __del__(self) -> None:
        if self._fd is not None and self._pid == _PID:
            with contextlib.suppress(OSError):
                os.close(self._fd)


#: Write transactions a process commits on a SQLite database before it has the WAL
#: checkpointed (:class:`_Checkpointer`): about SQLite's own 1000 pages at ~10 a turn.
CHECKPOINT_EVERY = 100
#: SQLite's own checkpoint, by the connection that commits, only where the WAL has grown
#: past this many pages all the same (writes not counted, a checkpointer falling behind).
WAL_AUTOCHECKPOINT = 10000


class _Checkpointer:
    """Checkpoints SQLite databases' WALs in a thread of its own, one per process.

    SQLite checkpoints the WAL in the connection that commits, once it holds 1000 pages:
    copies them into the database and syncs both files. That one commit in about a
    hundred turns waited 2-20 ms, 60% of the time all commits took (bench: 150 us a
    commit on average, the median commit taking 70). Here the committer only counts
    (:meth:`WalSqliteDatabase.committed`) and this thread runs the same ``PASSIVE``
    checkpoint, which waits for no reader or writer, on a connection of its own (a
    database that has gone is not made again: ``mode=rw``). The fsyncs and the
    durability are SQLite's, as before (``synchronous=NORMAL``: a commit is durable once
    a later WAL sync or checkpoint has run).

    The thread keeps its connection to a database open from one checkpoint to the next
    (up to :data:`CHECKPOINT_CONNECTIONS` databases, the one unused longest closed
    first): a connection opened for each checkpoint (the schema read for the pragma, the
    folder synced with its first sync of the WAL, the files closed again) made the
    checkpoint's CPU time, user and system, about 1.5 ms instead of 0.85 (30 against
    17 us a pause+resume turn). The checkpoints and their syncs are the same. One whose
    file has gone or was replaced (another inode), or whose checkpoint failed, is closed
    (and opened anew on the current file); :meth:`forget` closes one at once
    (:meth:`WalSqliteDatabase.close_all`: nothing of the database stays open).

    Where each commit syncs the WAL (``synchronous=FULL``: ``?synchronous=full`` in the
    URL), a checkpoint that leaves frames behind (commits landed while it copied, as
    they do under steady writes) is finished at once holding the database's write lock
    (:class:`_WriterLock`: every process's writers wait): it copies only those frames, so
    the next commit starts the WAL file over from its beginning. Otherwise no checkpoint
    ever catches up, and the WAL grows to :data:`WAL_AUTOCHECKPOINT` pages (40 MB) before
    it starts over, each commit making the file longer, whose sync must then also write
    the file's new size to the file system's journal: 0.36 ms a commit's sync, median,
    against 0.27 in a WAL started over (one thread's pause+resume turns, strace). With
    ``synchronous=NORMAL`` a commit syncs nothing, and the finishing pass's two syncs
    would be waits added to the writers (a busy disk: 0.74-0.95 ms a turn became
    1.5-2.3). The lock is not waited for past :data:`CHECKPOINT_LOCK_WAIT` (this
    process's writers holding it): the next checkpoint tries again.

    There (``synchronous=NORMAL``) the checkpoint is **followed up** instead, without
    the lock: :data:`FOLLOW_UPS` seconds after it, the thread checkpoints again what
    landed meanwhile, until the WAL has started over (it holds fewer frames than the
    last look found) or the follow-ups are spent. A commit asks for its checkpoint while
    its client's next request may already be running, and a writer starts the WAL over
    only if every frame had been copied when its transaction began: a form's pause and
    its resume sent back to back (a client's script, a test, ``bench/turns.py``) made the
    resume's commit land just after the checkpoint, every time, and the WAL never
    started over until it held :data:`WAL_AUTOCHECKPOINT` pages (40 MB), each commit
    making the file longer. Interleaved with other engines' turns (``bench/turns.py``,
    NORMAL), such a conversation's pause+resume turn took 0.45-0.56 ms, against 0.40-0.42
    for one whose WAL had reached those 40 MB and started over; followed up, all took
    0.38-0.40. A follow-up that finds nothing to copy syncs nothing; under writes that
    never pause, the follow-ups find more each time and the WAL grows as before. Only a
    database whose connection the thread still keeps is followed up (:meth:`forget`
    closed it).
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a worker starts its own thread

    def _reset(self) -> None:
        # A connection inherited from the parent is never closed here: closing it would
        # release locks and files the parent's SQLite still counts as its own.
        _INHERITED.extend(database for database, _ in getattr(self, "_open", {}).values())
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: path -> the database's write lock (None: none to finish with), or the follow-up
        #: that is due, in order of asking
        self._wanted: dict[str, _WriterLock | _FollowUp | None] = {}
        #: path -> the follow-up to run when its time (time.monotonic()) has come
        self._later: dict[str, tuple[float, _FollowUp]] = {}
        self._thread: threading.Thread | None = None
        self._busy = False
        #: path -> (its connection, the file's (st_dev, st_ino) when opened), oldest use first;
        #: used under _open_lock (the thread's checkpoint, forget)
        self._open: dict[str, tuple[SqliteDatabase, tuple[int, int]]] = {}
        self._open_lock = threading.Lock()

    def ask(self, path: str, write_lock: _WriterLock | None = None) -> None:
        """Have the WAL of the SQLite database at ``path`` checkpointed soon (finished
        holding ``write_lock`` where commits landed meanwhile)."""
        with self._lock:
            self._wanted[path] = write_lock
            self._later.pop(path, None)  # this checkpoint is followed up in its turn
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentcanvas-checkpoint", daemon=True)
                self._thread.start()
            self._wake.notify()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no checkpoint is asked for or running; false on timeout (for tests)."""
        with self._lock:
            return self._wake.wait_for(lambda: not self._wanted and not self._busy, timeout)

    def forget(self, path: str) -> None:
        """Close the connection kept to the database at ``path``, if any (after a
        checkpoint of it that is running)."""
        with self._lock:
            self._later.pop(path, None)
        with self._open_lock:
            kept = self._open.pop(path, None)
            if kept is not None:
                self._close(kept[0])

    def _run(self) -> None:
        while True:
            with self._lock:
                self._busy = False
                self._wake.notify_all()
                while not self._wanted:
                    now = time.monotonic()
                    due = [path for path, (when, _) in self._later.items() if when <= now]
                    for path in due:
                        self._wanted[path] = self._later.pop(path)[1]
                    if not due:
                        soonest = min((when for when, _ in self._later.values()), default=None)
                        self._wake.wait(None if soonest is None else soonest - now)
                wanted, self._wanted, self._busy = list(self._wanted.items()), {}, True
            for path, asked in wanted:
                with self._open_lock:
                    if isinstance(asked, _FollowUp):
                        if path in self._open:  # else forgotten (closed) since
                            self.checkpoint(path, follow_up=asked)
                    else:
                        self.checkpoint(path, asked)

    def checkpoint(
        self, path: str, write_lock: _WriterLock | None = None, follow_up: _FollowUp | None = None
    ) -> None:
        """Checkpoint the WAL of the database at ``path`` (called holding ``_open_lock``),
        then what commits added meanwhile holding ``write_lock``, if given; else have it
        followed up (``follow_up``: this is one)."""
        kept = self._open.pop(path, None)
        try:
            stat = os.stat(path)
            file = (stat.st_dev, stat.st_ino)
        except OSError:
            file = None  # gone: not made again
        if kept is not None and kept[1] != file:
            self._close(kept[0])
            kept = None
        if file is None:
            return
        if kept is None:
            # thread_safe=False: one connection for whichever thread holds _open_lock
            database = SqliteDatabase(
                f"{Path(path).absolute().as_uri()}?mode=rw",
                uri=True,
                thread_safe=False,
                check_same_thread=False,
            )
            kept = (database, file)
        try:
            _, frames, _ = kept[0].execute_sql("PRAGMA wal_checkpoint(PASSIVE)").fetchall()[0]
            if write_lock is None:
                self._follow_up(path, frames, follow_up)
            elif write_lock.acquire(CHECKPOINT_LOCK_WAIT):
                try:
                    kept[0].execute_sql("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                finally:
                    write_lock.release()
        except PeeweeException as exc:  # unreadable, locked: the next commit asks again
            log.debug("could not checkpoint the WAL of %s: %s", path, exc)
            self._close(kept[0])
            return
        self._open[path] = kept  # the most recently used last
        while len(self._open) > CHECKPOINT_CONNECTIONS:
            self._close(self._open.pop(next(iter(self._open)))[0])

    def _follow_up(self, path: str, frames: int, last: _FollowUp | None) -> None:
        """Have the checkpoint of ``path`` that found ``frames`` in the WAL followed up,
        unless the WAL has started over since ``last`` (the follow-up this one is) or the
        follow-ups are spent."""
        step = 0 if last is None else last.step + 1
        if frames <= 0 or step >= len(FOLLOW_UPS) or (last is not None and frames < last.frames):
            return
        with self._lock:
            if path not in self._wanted:  # a commit that asked meanwhile comes first
                self._later[path] = (time.monotonic() + FOLLOW_UPS[step], _FollowUp(step, frames))

    @staticmethod
    def _close(database: SqliteDatabase) -> None:
        try:
            database.close()
        except PeeweeException as exc:  # its files are closed all the same
            log.debug("could not close the checkpoint connection to %s: %s", database.database, exc)


#: Seconds the checkpoint thread waits for this process's writers to let the write lock
#: go before it leaves a checkpoint's last frames to the next one (:class:`_Checkpointer`).
CHECKPOINT_LOCK_WAIT = 1.0
#: Databases the checkpoint thread keeps a connection to (see :class:`_Checkpointer`).
CHECKPOINT_CONNECTIONS = 4
#: Seconds after a checkpoint of a WAL that commits do not sync (``synchronous=NORMAL``)
#: that the checkpoint thread looks again, and copies what landed meanwhile, until the
#: WAL has started over (see :class:`_Checkpointer`): one delay a follow-up.
FOLLOW_UPS = (0.01, 0.05, 0.25)


class _FollowUp(NamedTuple):
    """A look again at a WAL (:class:`_Checkpointer`): the ``step`` th, after a look that
    found ``frames`` frames in it."""

    step: int
    frames: int


#: Connections a forked child inherited from its parent's checkpoint thread (kept, never used).
_INHERITED: list[SqliteDatabase] = []
_CHECKPOINTER = _Checkpointer()

# Python's sqlite3 binds an exact int, float or str as it is, and asks its adapters about
# any other value: no registered adapter, it looks for ``__adapt__`` on its protocol
# class (an AttributeError made and dropped each time) and ``__conform__`` on the value,
# then binds the value itself. A turn binds about 7 such values a request (``None``,
# ``bool``, ``bytes``), ~4k instructions each. Adapters that hand back what is bound
# anyway (the same ``None`` and bytes, a bool's int) are found at once: C callables, no
# Python frame. Registered once for the process, for these exact types only.
sqlite3.register_adapter(type(None), {}.get)  # an empty dict's get(None) is None
sqlite3.register_adapter(bool, int)
sqlite3.register_adapter(bytes, bytes)  # bytes(b) is b itself


class WalSqliteDatabase(_LetGoOnCloseAll, PooledSqliteDatabase):
    """Pooled SQLite in WAL mode; write transactions take the write lock up front.

    ``write_lock`` lines up this process's writers (see :func:`write_transaction`).
    Every :data:`CHECKPOINT_EVERY` (``checkpoint_every``; 0: never) write transactions
    of this process, the WAL is checkpointed in the background (:class:`_Checkpointer`).

    SQLite opens a file it may not write read-only, and such a connection stays
    read-only after the file becomes writable again. So a connection is noted as
    read-only when it is opened on an unwritable file, and dropped at check-out once
    the file is writable: writes work again at once, not after the pool's stale
    timeout. (One ``open()`` per new connection; pooled ones cost nothing.)

    A connection a thread closes is kept at hand ("parked") for the next ``connect`` of
    any thread, the one closed last first: checking it in and out of the pool was ~60k
    instructions a request, 5% of a turn. And the connection used last has the freshest
    page cache: SQLite drops a connection's whole cache when another connection has
    written since its last transaction, so a request on another connection than the
    previous request's read its pages anew (~16 reads, ~37 us a pause+resume turn
    alone, 59 us with the requests spread over 2 or 8 threads, as a server's threads
    take them; each thread kept its own connection before). A parked connection is
    still an idle one of the pool: it is taken back for the pool when the pool has no
    other to give (:meth:`_take_back_parked`), by :meth:`close_idle` and
    :meth:`close_all`, and is checked as the pool checks one it hands out (closed,
    stale, opened read-only: then it goes back through the pool).
    """

    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003 - peewee's signature
        super().__init__(*args, **kwargs)
        self.write_lock = _WriterLock(str(self.database))
        self.checkpoint_every = CHECKPOINT_EVERY
        self._commits = 0
        self._seen: set[int] = set()
        self._opened_read_only: set[int] = set()
        #: the connections threads closed, the last closed last (put and taken by list
        #: operations, each atomic: two threads taking one never both get it)
        self._parked: list[Any] = []
        #: the file's page size, read by the first connection (api.services.history.fill_pages)
        self.file_page_size = 0

    def connect(self, reuse_if_open=False):  # noqa: ANN001, ANN201 - peewee's signature
        state = self._state
        parked = self._parked
        while state.closed and parked:
            try:
                conn = parked.pop()  # the one closed last: its page cache is the freshest
            except IndexError:
                break  # another thread took the last one meanwhile
            if self._still_usable(conn):
                state.set_connection(conn)
                return True
            self._close(conn)  # through the pool's check-in: it decides
        return super().connect(reuse_if_open)

    def _still_usable(self, conn) -> bool:  # noqa: ANN001 - a sqlite3 connection
        """Whether a parked connection is one the pool's check-out would hand out as it is."""
        held = self._in_use.get(id(conn))
        return (
            held is not None
            and held.connection is conn
            and not (self._stale_timeout and self._is_stale(held.timestamp))
            and id(conn) not in self._opened_read_only
            and not self._is_closed(conn)
        )

    def close(self):  # noqa: ANN201 - peewee's signature
        state = self._state
        conn = state.conn
        if state.closed or state.transactions or self._is_closed(conn) or conn.in_transaction:
            return super().close()  # the pool's check-in (it rolls back what was left open)
        state.reset()
        self._parked.append(conn)
        return True

    def _take_back_parked(self) -> bool:
        """Check every parked connection in (to the pool's idle ones); whether there was one."""
        taken = False
        while True:
            try:
                conn = self._parked.pop()
            except IndexError:
                return taken
            taken = True
            self._close(conn)

    def close_idle(self) -> None:
        self._take_back_parked()
        super().close_idle()

    def _connect(self):  # noqa: ANN202 - peewee's signature
        while True:
            try:
                conn = super()._connect()
            except MaxConnectionsExceeded:
                if not self._take_back_parked():
                    raise
                continue
            key = id(conn)
            if key not in self._seen:
                self._seen.add(key)
                if not self.file_page_size:
                    self.file_page_size = conn.execute("PRAGMA page_size").fetchone()[0]
                if not self._file_writable():
                    self._opened_read_only.add(key)
            if key in self._opened_read_only and self._file_writable():
                self._close(conn, close_conn=True)  # the file is writable now: open afresh
                continue
            return conn

    def close_all(self) -> None:
        """Close this thread's connection, the parked and the idle ones; let go of those
        other threads have checked out, each closed when its thread gives it back.

        peewee's closes those too, under whatever their threads are doing: a statement
        running on one then read the handle CPython's driver had freed, a segfault (in
        ``sqlite3_last_insert_rowid``, from the statement's ``execute``). One a thread
        holds and never gives back (it ended without closing it) is closed with its
        last reference, as peewee would close it here.
        """
        super().close_all()  # close_idle takes the parked ones too
        self.write_lock.close()
        _CHECKPOINTER.forget(str(self.database))

    def committed(self) -> None:
        """Count a committed write transaction (called holding ``write_lock``)."""
        self._commits += 1
        if self.checkpoint_every and self._commits >= self.checkpoint_every:
            self._commits = 0
            _CHECKPOINTER.ask(str(self.database), self.write_lock if self._syncs_commits() else None)

    def _syncs_commits(self) -> bool:
        """Whether each commit syncs the WAL (``synchronous`` FULL or EXTRA, SQLite's
        default where it is not set)."""
        value = str(dict(self._pragmas).get("synchronous", "full")).lower()
        return value not in ("normal", "off", "0", "1")

    def _close_raw(self, conn) -> None:  # noqa: ANN001 - peewee's signature
        self._seen.discard(id(conn))
        self._opened_read_only.discard(id(conn))
        super()._close_raw(conn)

    def _file_writable(self) -> bool:
        return _may_write(Path(self.database))

    # begin, commit and execute_sql are peewee's, on the open connection itself, with a
    # driver error made peewee's only once raised (_raise_as_peewee). The thread's
    # connection state is read once: each attribute of it (a threading.local) is ~1.5k
    # instructions, and a statement in peewee's "with __exception_wrapper__" ~2.8k.

    def begin(self, lock_type: str | None = None) -> None:
        conn = self._state.conn
        if conn is None:  # closed
            super().begin(lock_type)
            return
        lock_type = lock_type or self._lock_type
        try:
            conn.execute(f"BEGIN {lock_type}" if lock_type else "BEGIN")
        except Exception:  # noqa: BLE001 - made peewee's
            _raise_as_peewee()

    def commit(self) -> None:
        conn = self._state.conn
        if conn is None:  # closed
            super().commit()  # raises peewee's InterfaceError
            return
        try:
            conn.execute("COMMIT")
        except Exception:  # noqa: BLE001 - made peewee's
            _raise_as_peewee()

    def execute_sql(self, sql, params=None):  # noqa: ANN001, ANN201 - peewee's signature
        # In one call where it does nothing else: no connection to open, no query hook,
        # no debug log (its _execute_cursor, _log_query, cursor and is_closed are four
        # calls a statement, a third of a short one's cost here).
        conn = self._state.conn
        if conn is None and self.autoconnect:
            self.connect()  # as peewee's cursor() does
            conn = self._state.conn
        if conn is None or self.query_hooks or _PEEWEE_LOG.isEnabledFor(logging.DEBUG):
            return super().execute_sql(sql, params)
        try:
            cursor = conn.cursor()
            cursor.execute(sql, params or ())
        except Exception:  # noqa: BLE001 - made peewee's
            _raise_as_peewee()
        return cursor


def _raise_as_peewee() -> NoReturn:
    """Raise the driver's exception being handled as peewee's type for it (what a
    ``with __exception_wrapper__`` around the statement does; others as they are)."""
    with __exception_wrapper__:
        raise  # noqa: PLE0704 - the exception being handled by the caller


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


#: ``synchronous`` values a SQLite URL may ask for (``?synchronous=full``), as SQLite names them.
SQLITE_SYNCHRONOUS = ("normal", "full", "extra")


def _sqlite_synchronous(url: str) -> str:
    """The ``synchronous`` setting a SQLite URL asks for: ``normal`` (the default: a commit
    is durable once a later sync of the WAL has run, at the next checkpoint), ``full``
    (each commit syncs the WAL: durable when the reply goes) or ``extra``.

    Raises:
        ValueError: the URL has another option, or another value.
    """
    options = parse_qs(urlparse(url).query, keep_blank_values=True)
    unknown = sorted(set(options) - {"synchronous"})
    if unknown:
        raise ValueError(
            f"database URL option {unknown[0]!r} is not known for SQLite; the one there is: synchronous"
        )
    value = (options.get("synchronous") or ["normal"])[-1].lower()
    if value not in SQLITE_SYNCHRONOUS:
        raise ValueError(
            f"database URL option synchronous={value!r} is not one of {', '.join(SQLITE_SYNCHRONOUS)}"
        )
    return value


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
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("sqlite", "sqlite+pool"):
        return WalSqliteDatabase(
            _sqlite_path(url),
            max_connections=max_connections,
            stale_timeout=600,
            timeout=30,
            check_same_thread=False,
            pragmas={
                "journal_mode": "wal",
                "synchronous": _sqlite_synchronous(url),
                "busy_timeout": 30000,
                "foreign_keys": 1,
                # Deleted content is zeroed on the pages a write changes anyway, not by
                # writing every freed page (SQLite as Debian builds it: secure_delete on).
                # A turn frees the overflow page of the snapshot it replaces: zeroing it
                # was 2.5 of the 14.6 pages a commit wrote to the WAL (and copied back at
                # the checkpoint).
                "secure_delete": "fast",
                # Checkpoints run in the background (_Checkpointer); this is the net.
                "wal_autocheckpoint": WAL_AUTOCHECKPOINT,
                # Left as SQLite has them, measured (turns interleaved in one process):
                # page_size 4096: 8192 keeps a snapshot under ~8 KB off an overflow page
                # (9.9 -> 5.9 WAL frames a commit) but writes 14-18% more WAL bytes, and a
                # turn's CPU was the same within 1-3% (7.5 and 84 KB snapshots, one thread
                # or two); it could only be set before a new file's first write anyway.
                # mmap_size 0: a connection finding its cache stale (another connection
                # wrote) unmaps it all and faults it in again, +13% CPU a turn over two
                # threads. cache_size, temp_store: a turn reads ~16 pages and sorts nothing.
            },
        )
    if scheme in ("mysql", "mysql+pool", "mariadb", "mysql+pymysql"):
        parsed = parse_server_url(url, 3306, "mysql://user:password@host:3306/agentcanvas")
        kwargs = _credentials(parsed)
        options = dict(parsed.options)
        kwargs["wsrep_sync_wait"] = _sync_wait(options.pop("wsrep_sync_wait", None), url)
        kwargs.update((key, typed_option(value)) for key, value in options.items())
        kwargs.setdefault("charset", "utf8mb4")
        kwargs.setdefault("connect_timeout", 10)
        # Report rows *matched* by an UPDATE, as SQLite does, not rows changed: a
        # conditional UPDATE that sets a value already there still counts as a hit.
        from pymysql.constants import CLIENT

        kwargs["client_flag"] = int(kwargs.get("client_flag") or 0) | CLIENT.FOUND_ROWS
        return ReconnectingPooledMySQLDatabase(
            parsed.database,
            hosts=parsed.hosts,
            max_connections=max_connections,
            stale_timeout=300,
            timeout=30,
            **kwargs,
        )
    if scheme in ("postgresql", "postgres", "postgresql+pool", "postgres+pool", "postgresql+psycopg"):
        parsed = parse_server_url(url, 5432, "postgresql://user:password@host:5432/agentcanvas")
        kwargs = _credentials(parsed)
        # libpq's own multi-host form: host=h1,h2 port=p1,p2; it tries them in order.
        kwargs["host"] = ",".join(host for host, _ in parsed.hosts)
        kwargs["port"] = ",".join(str(port) for _, port in parsed.hosts)
        kwargs.update(parsed.options)  # target_session_attrs, sslmode...: libpq reads them as text
        kwargs.setdefault("connect_timeout", 10)
        return ReconnectingPooledPostgresqlDatabase(
            parsed.database,
            hosts=parsed.hosts,
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


def _sync_wait(value: str | None, url: str) -> int:
    """The ``wsrep_sync_wait`` URL option (Galera only; default :data:`~api.db.cluster.WSREP_SYNC_WAIT`)."""
    if value is None:
        return cluster.WSREP_SYNC_WAIT
    if not value.isdigit() or int(value) > 15:
        where = url.rsplit("?", 1)[-1]
        raise ValueError(
            f"database URL option wsrep_sync_wait={value!r} (in {where!r}) is not a number from 0 to 15; "
            f"leave it out for {cluster.WSREP_SYNC_WAIT} (reads and UPDATE/DELETE wait for the cluster)"
        )
    return int(value)


def _credentials(parsed: ServerUrl) -> dict:
    kwargs: dict = {}
    if parsed.user:
        kwargs["user"] = parsed.user
    if parsed.password:
        kwargs["password"] = parsed.password
    return kwargs


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
    hosts = database.host_list
    # information_schema exists on every MySQL-compatible server: a place to stand
    # while creating the real database.
    admin = _HostsMySQLDatabase(
        "information_schema", hosts=hosts.hosts, wsrep_sync_wait=database.wsrep_sync_wait, **params
    )
    quoted = "`" + database.database.replace("`", "``") + "`"
    try:
        admin.connect()
        admin.execute_sql(f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    except (OperationalError, InterfaceError) as exc:
        raise OperationalError(
            f"cannot use MySQL database {database.database!r} at {_where(hosts)} as {params.get('user')!r}: {exc}; "
            f"check AGENTCANVAS_DATABASE_URL and that the server is running"
        ) from None
    finally:
        admin.close()
        admin.host_list.stop()


def _ensure_postgres_database(database: PooledPostgresqlDatabase) -> None:
    params = dict(database.connect_params)
    params.pop("prefer_psycopg3", None)
    # The maintenance database "postgres" exists on every server (CockroachDB and
    # YugabyteDB have it too): a place to stand while creating the real one.
    admin = _HostsPostgresqlDatabase(
        "postgres", hosts=database.host_list.hosts, prefer_psycopg3=True, **params
    )
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
        raise OperationalError(
            f"cannot use Postgres database {database.database!r} at {_where(database.host_list)} as {params.get('user')!r}: {exc}; "
            f"check AGENTCANVAS_DATABASE_URL and that the server is running"
        ) from None
    finally:
        admin.close()
        admin.host_list.stop()


def _where(hosts: cluster.HostList) -> str:
    return ", ".join(hosts.where(i) for i in range(len(hosts.hosts)))


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


class _WriteTransaction:
    """:func:`write_transaction`'s context: the database's own ``atomic`` (not the proxy's,
    whose every step looks each attribute up through it), under the write lock on SQLite.

    On SQLite at the top (no transaction open), it does what peewee's ``transaction``
    does, without it: ``BEGIN IMMEDIATE``, the transaction pushed on the thread's stack
    (where a nested ``atomic`` finds it and makes a savepoint), then ``COMMIT`` and the
    commit callbacks, or ``ROLLBACK``. peewee's object and its calls were ~20k of the
    ~50k instructions an empty write transaction cost.
    """

    __slots__ = ("_atomic", "_database", "_lock", "_top")

    def __enter__(self) -> None:
        database = self._database = db.obj
        if isinstance(database, PooledSqliteDatabase):
            lock = self._lock = database.write_lock
            lock.__enter__()
            try:
                # What atomic() makes: at the top, a transaction, nested, a savepoint.
                if database._state.transactions:  # noqa: SLF001 - peewee's transaction stack
                    self._top = False
                    atomic = self._atomic = database.atomic(lock_type="IMMEDIATE")
                    atomic.__enter__()
                else:
                    self._top = True
                    database.begin("IMMEDIATE")  # opens the thread's connection if need be
                    atomic = self._atomic = _transaction(database, lock_type="IMMEDIATE")
                    database._state.transactions.append(atomic)  # noqa: SLF001 - as it pushes itself
            except BaseException:
                lock.__exit__(None, None, None)
                raise
        else:
            self._lock = None
            atomic = self._atomic = database.atomic()
            atomic.__enter__()

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001 - the context manager protocol
        lock = self._lock
        if lock is None:
            self._atomic.__exit__(exc_type, exc, tb)
            return
        try:
            if self._top:
                self._end(exc_type is None)
            else:
                self._atomic.__exit__(exc_type, exc, tb)
            if exc_type is None:
                self._database.committed()
        finally:
            lock.__exit__(None, None, None)

    def _end(self, commit: bool) -> None:
        """peewee's ``_transaction.__exit__``, for the one :meth:`__enter__` began."""
        database = self._database
        state = database._state  # noqa: SLF001 - peewee's per-thread state
        transactions = state.transactions
        depth = len(transactions)
        transactions.pop()
        if depth != 1:  # the stack is not as it was left: peewee's does nothing either
            return
        if not commit:
            database.rollback()
            database._clear_commit_callbacks()  # noqa: SLF001 - as peewee's rollback(False)
            return
        try:
            database.commit()
        except Exception:
            database.rollback()
            database._clear_commit_callbacks()  # noqa: SLF001
            raise
        if state.commit_callbacks:
            database._run_commit_callbacks()  # noqa: SLF001 - as peewee's commit(False)


def write_transaction() -> contextlib.AbstractContextManager[None]:
    """One transaction that writes. On SQLite it takes the write lock at ``BEGIN``.

    A deferred SQLite transaction that reads first and writes later can fail with
    "database is locked" when another writer got in between; ``BEGIN IMMEDIATE``
    waits for the lock (busy timeout) instead. The threads of one process also queue
    on the database's ``write_lock`` first: a thread that finds SQLite's lock taken
    sleeps in growing steps (up to 100 ms) before it looks again, while one waiting on
    the process's lock goes on the moment the writer before it is done.
    """
    return _WriteTransaction()


def run_retrying(work: Callable[[], T]) -> T:
    """Run ``work`` (one or more whole transactions) on a connection of this thread; run
    it again, whole, when the database says it rolled it back.

    That is a write conflict (a deadlock, a Galera certification failure: 1213;
    Postgres 40001/40P01), or a node that refused a statement before running it
    (Galera's 1047: the next attempt goes to another host), up to
    :data:`~api.db.cluster.CONFLICT_RETRIES` more times, after a short random pause.
    Any other error, a lost connection included (a ``COMMIT`` may have been applied),
    goes to the caller. ``work`` must be safe to run again: it writes nothing
    outside the database before its transaction commits.
    """
    attempt = 0
    while True:
        try:
            with db.connection_context():  # on one database throughout (_Handle)
                return work()
        except (OperationalError, InterfaceError) as exc:
            rolled_back = cluster.write_conflict(exc) or cluster.refused_before_running(exc)
            if not rolled_back or attempt >= cluster.CONFLICT_RETRIES:
                raise
            attempt += 1
            cluster.pause_before_retry(attempt)


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
    flush = getattr(db.obj, "flush_deferred", None)
    if flush is not None:
        flush()  # the transaction's deferred writes first, in order (this cursor bypasses execute_sql)
    cursor = db.cursor()
    try:
        cursor.executemany(sql, rows)
    finally:
        cursor.close()
