"""Running on a database of several nodes: which node to use, and what its errors mean.

**Several hosts.** A MySQL URL may name several hosts
(``mysql://u@h1:3306,h2:3306,h3:3306/db``, see :mod:`api.db.urls`). Each pool keeps a
:class:`HostList`: a new connection goes to the first host in the URL's order that is
up. A host whose connection failed or dropped, or that answered "not ready", is down:
passed over (tried only when no other host answers) until a background probe reaches
it, every :data:`HOST_COOL_DOWN_SECONDS`. Then pooled connections on later hosts are
dropped at check-out, so a worker is back on its first host within one probe interval
of that host's return, and no request ever waits on a host that is down. Postgres URLs
with several hosts are libpq's own syntax: libpq gets the hosts that are up first and
picks (``target_session_attrs`` and the other options pass through); the rest is the
same.

**Galera.** When a MySQL server says ``wsrep_on=ON``, every new connection first checks
``wsrep_ready`` (a node that is joining, donating or cut off from the primary component
says ``OFF`` and is treated like a host that is down), then sets
``wsrep_sync_wait`` to :data:`WSREP_SYNC_WAIT`.

**Errors.** :func:`write_conflict` (MySQL 1213: an InnoDB deadlock or a Galera
certification failure; TiDB 8002, 8005, 9007; Postgres and CockroachDB 40001, 40P01): the statement or transaction was rolled
back whole, so running it again is safe. :func:`node_unusable`: the connection is gone
(2003, 2006, 2013, 2055, a closed socket) or the node refuses work (1047 "WSREP has not
yet prepared node for application use", 1180 at ``COMMIT`` "Not connected to Primary
Component"; and 1205 on a read without a table, see
:meth:`api.db.database._SafeReconnectMixin.execute_sql`): use another host.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("agentcanvas.db")

#: What every connection to a Galera node sets ``wsrep_sync_wait`` to.
#:
#: ``3`` = 1 (``SELECT``, ``SHOW``, ``BEGIN``) + 2 (``UPDATE``, ``DELETE``): before such a
#: statement runs, the node applies every write the cluster committed before it began.
#: Reads see what any node acknowledged (a client that got a 200 through one server and
#: reads through another sees its turn). Our coordination is conditional ``UPDATE``\\ s —
#: the lease claim, its renewal and release, the cancel flag, the end-of-turn save — that
#: decide on the row they find; one evaluated against a row the node has not caught up
#: with matches nothing and reads as "busy" or "lease lost" although it is free. ``1``
#: alone covers them only where a ``SELECT`` on the same node came first (the turn
#: path), not the lease keeper's renewals or a cancel. ``INSERT`` (4) is left out: a
#: duplicate key still fails at certification, and inserting needs no current view.
#: The cost is one cluster round trip per such statement. A URL may choose another value
#: (``mysql://u@h1,h2/db?wsrep_sync_wait=1``).
WSREP_SYNC_WAIT = 3

#: Seconds between two probes of a host that is down (a connection of the prober's own).
HOST_COOL_DOWN_SECONDS = 5.0

#: How many times a single statement outside a transaction is run again after a write
#: conflict (1213) before the error goes to the caller.
CONFLICT_RETRIES = 3

# MySQL client errors: the connection is gone or could not be made.
_CONNECTION_CODES = frozenset({2003, 2006, 2013, 2055})
# The node is up but refuses work (Galera: not in the primary component, not synced).
_NOT_READY_CODES = frozenset({1047})
# 1213: a deadlock, or a Galera certification failure. TiDB (its error-code reference):
# 8002 a SELECT ... FOR UPDATE transaction that met a commit conflict, 8005 and 9007
# write conflicts; each rolled back whole, "retry the transaction".
_CONFLICT_CODES = frozenset({1213, 8002, 8005, 9007})
_CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})


class NodeNotReady(Exception):
    """A Galera node that answers but is not ready for work (``wsrep_ready=OFF``).

    Raised (with MySQL's 1047 as its code, like the server's own refusal) while
    connecting, so that the host is passed over like one that is down.
    """

    def __init__(self, where: str):
        super().__init__(1047, f"the Galera node at {where} is not ready (wsrep_ready=OFF)")


def mysql_code(exc: BaseException) -> int | None:
    """The MySQL error number of ``exc`` (a driver error or peewee's wrapping of one)."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(getattr(exc, "orig", exc), "sqlstate", None)


def write_conflict(exc: BaseException) -> bool:
    """Whether the database rolled ``exc``'s statement or transaction back because it
    conflicted with a concurrent one (safe to run again, or answer "busy")."""
    return mysql_code(exc) in _CONFLICT_CODES or _sqlstate(exc) in _CONFLICT_SQLSTATES


def node_not_ready(exc: BaseException) -> bool:
    """Whether the node refused the statement because it is not ready (Galera 1047, or
    1180 when ``COMMIT`` found it cut off from the primary component)."""
    code = mysql_code(exc)
    if code in _NOT_READY_CODES:
        return True
    return code == 1180 and "primary component" in str(exc).lower()


def refused_before_running(exc: BaseException) -> bool:
    """Whether the node refused the statement without running any of it (Galera 1047):
    running it on another node is safe, a write too."""
    return mysql_code(exc) in _NOT_READY_CODES


def pause_before_retry(attempt: int) -> None:
    """Sleep a few random milliseconds, more with each ``attempt`` (1, 2, ...), so that
    two writers that just conflicted do not meet again at once."""
    time.sleep(random.uniform(0.001, 0.01) * attempt)


def connection_failed(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection could not be made or was lost (MySQL)."""
    if mysql_code(exc) in _CONNECTION_CODES:
        return True
    # pymysql on a socket the server closed: InterfaceError(0, '') or "(0, '')".
    args = getattr(exc, "args", ())
    return type(exc).__name__ == "InterfaceError" and (not args or args[0] == 0)


def node_unusable(exc: BaseException) -> bool:
    """Whether another host should be used: the connection failed or the node is not ready."""
    return connection_failed(exc) or node_not_ready(exc)


class HostList:
    """The hosts of one database URL, in preference order, and which of them are down.

    A host marked down stays down until ``probe(index)`` — a connection of its own,
    made by a background thread every ``cool_down`` seconds while some host is down —
    succeeds, or until a request's connection to it does (when no other host
    answered). So a request never waits for a host that is down to time out: on a
    network that drops packets instead of refusing them that is ``connect_timeout``
    (10 s) per attempt, and the pool makes connections under its lock. Thread-safe;
    one per pool.
    """

    def __init__(
        self,
        hosts: tuple[tuple[str, int], ...],
        cool_down: float = HOST_COOL_DOWN_SECONDS,
        probe: Callable[[int], None] | None = None,
    ):
        self.hosts = hosts
        self.cool_down = cool_down
        self._probe = probe
        #: index of each host that is down -> when it was marked so (monotonic)
        self._down: dict[int, float] = {}
        self._lock = threading.Lock()
        #: the probing thread and its stop flag, while one runs
        self._prober: tuple[threading.Thread, threading.Event] | None = None

    def candidates(self) -> list[int]:
        """Host indexes to try, in order: the hosts that are up (URL order), then those
        that are down, the longest down first (when no other answers, one of them may be
        back before its probe noticed)."""
        with self._lock:
            down = sorted(self._down, key=self._down.__getitem__)
        if down:
            self._ensure_prober()  # (again, if the pool was closed and is used again)
        return [i for i in range(len(self.hosts)) if i not in self._down] + down

    def mark_down(self, index: int, reason: object = "") -> None:
        """Pass host ``index`` over until a probe reaches it (logged when it was up until now)."""
        with self._lock:
            was_up = index not in self._down
            self._down.setdefault(index, time.monotonic())
        self._ensure_prober()
        if was_up and len(self.hosts) > 1:
            log.warning(
                "database host %s is down or not ready (%s); using the others, trying it again every %g s",
                self.where(index),
                reason or "connection lost",
                self.cool_down,
            )

    def mark_up(self, index: int) -> None:
        with self._lock:
            was_down = self._down.pop(index, None) is not None
        if was_down and len(self.hosts) > 1:
            log.warning("database host %s answers again and is used", self.where(index))

    def is_down(self, index: int) -> bool:
        return index in self._down

    def better_than(self, index: int) -> bool:
        """Whether a host before ``index`` in the URL is up."""
        return any(i not in self._down for i in range(index))

    def where(self, index: int) -> str:
        host, port = self.hosts[index]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _ensure_prober(self) -> None:
        with self._lock:
            if self._probe is None or self._prober is not None:
                return
            stop = threading.Event()
            prober = threading.Thread(
                target=self._probe_loop, args=(stop,), name="agentcanvas-db-probe", daemon=True
            )
            self._prober = (prober, stop)
        prober.start()

    def stop(self) -> None:
        """End the probing thread (the pool is closed); it starts again when needed."""
        with self._lock:
            if self._prober is not None:
                self._prober[1].set()
                self._prober = None

    def _probe_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.cool_down):
            with self._lock:
                down = sorted(self._down)
                if not down:
                    if self._prober is not None and self._prober[1] is stop:
                        self._prober = None
                    return
            for index in down:
                try:
                    self._probe(index)
                except Exception as exc:  # noqa: BLE001 - still down; said once, when it went down
                    log.debug("database host %s still down: %s", self.where(index), exc)
                else:
                    self.mark_up(index)


def prepare_mysql_connection(conn: Any, where: str, sync_wait: int = WSREP_SYNC_WAIT) -> bool:
    """Get a fresh MySQL connection ready; whether its server is a Galera node.

    On Galera (``wsrep_on=ON``): raises :class:`NodeNotReady` when ``wsrep_ready`` is
    ``OFF``, else sets ``wsrep_sync_wait`` to ``sync_wait``. Two ``SHOW``\\ s and
    a ``SET`` per new connection (pooled ones cost nothing); a server without Galera
    (MySQL, MariaDB without a provider, TiDB) answers the first with nothing or ``OFF``.
    """
    cursor = conn.cursor()
    try:
        cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
        row = cursor.fetchone()
        if not row or str(row[1]).upper() != "ON":
            return False
        cursor.execute("SHOW STATUS LIKE 'wsrep_ready'")
        row = cursor.fetchone()
        if not row or str(row[1]).upper() != "ON":
            raise NodeNotReady(where)
        cursor.execute(f"SET SESSION wsrep_sync_wait = {int(sync_wait)}")
        return True
    finally:
        cursor.close()
