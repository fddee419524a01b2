"""ExeSQL: run SQL against a database (RAGFlow's tool).

Params (RAGFlow's): ``db_type`` (``mysql``, ``mariadb``, ``postgres``; ours also
``sqlite``), ``host``, ``port``, ``database`` (for SQLite: the file), ``username``,
``password``, ``max_records`` (1024: rows kept per statement), ``sql`` (default
``{sys.query}``; what a model writes when ExeSQL is its tool). Ours: ``read_only``
(true), ``timeout_seconds`` (30). Connection params left empty are taken from the
settings ``tools.exesql.*`` (``host``, ``port``, ``database``, ``username``,
``password``), so a template with blank fields runs against the configured database.

``sql`` may hold several statements separated by ``;``; code fences and ``[ID:n]``
citation marks are removed (as RAGFlow does). Each statement's rows go to ``json`` (a
list per statement: the rows as objects, or ``{"content": "No record in the
database!"}``) and to ``formalized_content`` (a Markdown table per statement). A
statement that fails is reported there (``SQL Execution Failed: …``) and the next one
still runs, as in RAGFlow; a connection that cannot be made fails the component.

Safety:

* **Read-only** unless the author sets ``read_only: false``: a read-only transaction
  (MySQL/MariaDB ``START TRANSACTION READ ONLY``, Postgres ``SET TRANSACTION READ
  ONLY``), SQLite opened read-only with ``query_only``; nothing is committed. With
  ``read_only: false`` the run's statements are committed together at its end.
* **Addresses**: the host is checked by the Invoke rules (:mod:`agent.net`) and the
  connection goes to the checked address; a private or loopback database (say, one's
  own) needs ``tools.exesql.allow_hosts``. SQLite files must lie under one of
  ``tools.exesql.sqlite_dirs`` (none by default: the server's own files are never
  reachable).
* **Time and rows**: each statement gets ``timeout_seconds`` (connecting, at most
  10 s), bounded by the server (``max_statement_time`` / ``max_execution_time`` /
  ``statement_timeout``) and by the turn's deadline and cancel (the statement is
  cancelled on the server); at most ``max_records`` rows are
  fetched per statement (and at most ``tools.exesql.max_records``).
* The password is never in outputs, events, errors or logs.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import math
import os
import re
import sqlite3
import threading
from typing import Any

from agent import deadline as deadlines
from agent import net
from agent.component import register
from agent.component.tool import ToolComponent, ToolParam, markdown_table, require_text
from agent.errors import Cancelled, ComponentTimeout, DeadlineExceeded

log = logging.getLogger("agentcanvas.exesql")

DB_TYPES = ("mysql", "mariadb", "postgres", "sqlite")
# RAGFlow's other types: refused with a clear message when they run.
_UNSUPPORTED = ("mssql", "IBM DB2", "trino", "oceanbase")
NO_RECORD = "No record in the database!"
# The server's own statement limit is this much longer than the run's: the run's
# deadline cancels first (a clear error), the server's limit is the backstop.
_BACKSTOP_SECONDS = 1.0
#: The longest a connection may take to open (the turn's deadline still applies).
CONNECT_SECONDS = 10.0


class ExeSQLParam(ToolParam):
    tool_inputs = {
        "sql": {
            "type": "string",
            "description": "The SQL to execute.",
            "default": "{sys.query}",
            "required": True,
        }
    }

    def __init__(self) -> None:
        super().__init__()
        self.db_type = "mysql"
        self.database = ""
        self.username = ""
        self.host = ""
        self.port: Any = 3306
        self.password = ""
        self.max_records: Any = 1024
        self.read_only = True
        self.timeout_seconds: Any = 30

    def check(self) -> None:
        self.check_choice("db_type", DB_TYPES + _UNSUPPORTED)
        for name in ("database", "username", "host", "password"):
            if getattr(self, name) is None:
                setattr(self, name, "")
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be text, got {type(getattr(self, name)).__name__}")
        if self.port in (None, ""):
            self.port = 0
        self.check_positive_int("max_records")
        if isinstance(self.port, str) and self.port.strip().isdigit():
            self.port = int(self.port)
        self.check_nonnegative_int("port", maximum=65535)
        if not isinstance(self.read_only, bool):
            raise ValueError(f"read_only must be true or false, got {self.read_only!r}")
        self.check_number("timeout_seconds", minimum=0.001)


def clean_statements(sql: str) -> list[str]:
    """The statements of ``sql``: split on ``;``, without code fences and ``[ID:n]``."""
    sql = re.sub(r"```(?:sql)?", "", sql, flags=re.IGNORECASE)
    out = []
    for statement in sql.split(";"):
        statement = re.sub(r"\[ID:[0-9]+\]", "", statement).strip()
        if statement:
            out.append(statement)
    return out


def plain_value(value: Any) -> Any:
    """A database value as JSON data (RAGFlow: decimals as floats, NaN as null, dates as text)."""
    if isinstance(value, decimal.Decimal):
        value = float(value)
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dt.datetime):
        return (
            value.strftime("%Y-%m-%d %H:%M:%S")
            if (value.hour, value.minute, value.second) != (0, 0, 0)
            else value.strftime("%Y-%m-%d")
        )
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data.hex()
    return value


@register
class ExeSQL(ToolComponent):
    component_name = "ExeSQL"
    param_class = ExeSQLParam
    tool_name = "execute_sql"
    tool_description = "Executes SQL on the configured database and returns the rows."
    settings_name = "exesql"

    def _conn_param(self, name: str) -> Any:
        value = getattr(self._param, name)
        if value in ("", 0, None):
            value = self.settings().get(name, value)
        return value

    def run_tool(self, sql: Any = None) -> None:
        sql = require_text(self, "sql", sql)
        statements = clean_statements(sql)
        if not statements:
            raise self.fail("sql is empty; give the SQL to execute", retryable=False)
        p = self._param
        if p.db_type in _UNSUPPORTED:
            raise self.fail(
                f"db_type {p.db_type!r} is not supported here; use one of {', '.join(DB_TYPES)}",
                retryable=False,
            )
        settings = self.settings()
        cap = int(settings.get("max_records") or 1024)
        rows_cap = min(int(p.max_records or cap), cap)
        timeout = min(float(p.timeout_seconds), float(settings.get("timeout_seconds") or 30))
        session = self._open(timeout)
        results: list[Any] = []
        tables: list[str] = []
        try:
            for statement in statements:
                # Each statement has the whole timeout (the turn's deadline still bounds all).
                wait = session.wait = self._canvas.deadline.within(timeout, "ExeSQL timeout_seconds")
                wait.check()
                try:
                    columns, rows = deadlines.call(
                        wait, lambda s=statement: session.run(s, rows_cap), session.cancel
                    )
                except (Cancelled, DeadlineExceeded):
                    raise
                except ComponentTimeout:
                    raise self.fail(
                        f"the statement ran longer than {timeout:g} s and was cancelled (timeout_seconds)",
                        retryable=False,
                    ) from None
                except Exception as e:  # noqa: BLE001 - reported like RAGFlow, and the next statement runs
                    session.recover()
                    message = f"SQL Execution Failed: {statement}\n{_driver_message(e, session.secret)}"
                    results.append({"content": message})
                    tables.append(message)
                    continue
                if not rows:
                    results.append({"content": NO_RECORD})
                    tables.append(NO_RECORD)
                    continue
                values = [[plain_value(v) for v in row] for row in rows]
                results.append([dict(zip(columns, row, strict=False)) for row in values])
                tables.append(markdown_table(columns, values))
        finally:
            session.close()
        self.set_output("json", results)
        self.set_output("formalized_content", "\n\n".join(tables))

    def tool_result(self) -> str | None:
        return self.outputs.get("formalized_content")

    # -- connections --------------------------------------------------------------------
    def _open(self, timeout: float) -> _Session:
        p = self._param
        wait = self._canvas.deadline.within(CONNECT_SECONDS, "connecting")
        if p.db_type == "sqlite":
            return _SQLiteSession(self._sqlite_path(), p.read_only, wait)
        host = str(self._conn_param("host") or "")
        port = int(self._conn_param("port") or (5432 if p.db_type == "postgres" else 3306))
        database = str(self._conn_param("database") or "")
        for name, value in (("host", host), ("database", database)):
            if not value:
                raise self.fail(
                    f"{name} is empty; set it in the ExeSQL node or in tools.exesql.{name}", retryable=False
                )
        try:
            allow = net.AllowList(self.settings().get("allow_hosts") or [], "tools.exesql.allow_hosts")
            address = str(net.check_destination(host, port, allow)[0])
        except (ValueError, net.DestinationRefused) as e:
            raise self.fail(
                str(e).replace("refused to call", "refused to connect to"), retryable=False
            ) from None
        except OSError as e:
            raise self.fail(str(e)) from None
        user = str(self._conn_param("username") or "")
        password = str(self._conn_param("password") or "")
        wait.check()
        log.info("%s: connecting to %s database %r on %s:%s", self.id, p.db_type, database, host, port)
        opener = _PostgresSession if p.db_type == "postgres" else _MySQLSession
        try:
            return deadlines.call(
                wait, lambda: opener(address, port, database, user, password, p.read_only, wait, timeout)
            )
        except (Cancelled, DeadlineExceeded):
            raise
        except ComponentTimeout:
            raise self.fail(f"connecting to {host}:{port} took longer than {CONNECT_SECONDS:g} s") from None
        except Exception as e:  # noqa: BLE001 - the driver's error, without the password
            raise self.fail(f"Database Connection Failed! {_driver_message(e, password)}") from None

    def _sqlite_path(self) -> str:
        database = str(self._conn_param("database") or "")
        dirs = self.settings().get("sqlite_dirs") or []
        if isinstance(dirs, str):
            dirs = [d for d in dirs.split(os.pathsep) if d]
        path = os.path.realpath(database) if database else ""
        for root in dirs:
            root = os.path.realpath(str(root))
            if path.startswith(root.rstrip(os.sep) + os.sep):
                if not os.path.isfile(path):
                    raise self.fail(f"SQLite database {database!r} does not exist", retryable=False)
                return path
        raise self.fail(
            f"SQLite database {database!r} is not under a directory of tools.exesql.sqlite_dirs; add its directory there",
            retryable=False,
        )


def _driver_message(e: Exception, secret: str) -> str:
    text = str(e) or type(e).__name__
    if secret:
        text = text.replace(secret, "***")
    return text[:1000]


def _cursor_rows(cursor: Any, cap: int) -> tuple[list[str], list[tuple]]:
    if cursor.description is None:
        return [], []
    columns = [d[0] for d in cursor.description]
    return columns, list(cursor.fetchmany(cap))


class _Session:
    """One connection for one run: ``run`` a statement, ``cancel`` it from another
    thread, ``recover`` after a failed statement, ``close``."""

    secret = ""

    def run(self, statement: str, cap: int) -> tuple[list[str], list[tuple]]:
        raise NotImplementedError

    def cancel(self) -> None:
        pass

    def recover(self) -> None:
        pass

    def close(self) -> None:
        pass


class _MySQLSession(_Session):
    def __init__(
        self,
        address: str,
        port: int,
        database: str,
        user: str,
        password: str,
        read_only: bool,
        wait: deadlines.Deadline,
        statement_seconds: float,
    ):
        import pymysql

        self._pymysql = pymysql
        self._params = {"host": address, "port": port, "user": user, "password": password}
        self.secret = password
        # Socket timeouts only as a last resort: the deadline cancels a statement first.
        seconds = math.ceil(statement_seconds + _BACKSTOP_SECONDS) + 5
        self.conn = pymysql.connect(
            database=database,
            connect_timeout=int(CONNECT_SECONDS),
            read_timeout=seconds,
            write_timeout=seconds,
            charset="utf8mb4",
            **self._params,
        )
        self.read_only = read_only
        self.wait = wait
        with self.conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            self.mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
        self._begin()

    def _begin(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("START TRANSACTION READ ONLY" if self.read_only else "START TRANSACTION")

    def _limit_time(self, cur: Any) -> None:
        seconds = self.wait.remaining() + _BACKSTOP_SECONDS
        if seconds == math.inf:
            return
        if self.mariadb:
            cur.execute(f"SET SESSION max_statement_time = {seconds:.3f}")
        else:
            cur.execute(f"SET SESSION max_execution_time = {int(seconds * 1000)}")

    def run(self, statement: str, cap: int) -> tuple[list[str], list[tuple]]:
        with self.conn.cursor() as cur:
            self._limit_time(cur)
            cur.execute(statement)
            return _cursor_rows(cur, cap)

    def cancel(self) -> None:
        try:
            killer = self._pymysql.connect(connect_timeout=5, **self._params)
            try:
                with killer.cursor() as cur:
                    cur.execute(f"KILL QUERY {int(self.conn.thread_id())}")
            finally:
                killer.close()
        except Exception:  # noqa: BLE001 - the server-side statement time still ends it
            log.warning("could not cancel a running ExeSQL statement")

    def recover(self) -> None:
        try:
            self.conn.rollback()
            self._begin()
        except Exception:  # noqa: BLE001 - the next statement reports the broken connection
            pass

    def close(self) -> None:
        try:
            self.conn.rollback() if self.read_only else self.conn.commit()
        except Exception:  # noqa: BLE001
            pass
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


class _PostgresSession(_Session):
    def __init__(
        self,
        address: str,
        port: int,
        database: str,
        user: str,
        password: str,
        read_only: bool,
        wait: deadlines.Deadline,
        statement_seconds: float,
    ):
        import psycopg

        self.secret = password
        self.wait = wait
        self.conn = psycopg.connect(
            host=address,
            port=port,
            dbname=database,
            user=user,
            password=password,
            connect_timeout=int(CONNECT_SECONDS),
            autocommit=False,
        )
        self.conn.read_only = read_only

    def run(self, statement: str, cap: int) -> tuple[list[str], list[tuple]]:
        seconds = self.wait.remaining()
        with self.conn.cursor() as cur:
            if seconds != math.inf:
                cur.execute(f"SET LOCAL statement_timeout = {int((seconds + _BACKSTOP_SECONDS) * 1000)}")
            cur.execute(statement)
            return _cursor_rows(cur, cap)

    def cancel(self) -> None:
        try:
            self.conn.cancel()
        except Exception:  # noqa: BLE001
            log.warning("could not cancel a running ExeSQL statement")

    def recover(self) -> None:
        try:
            self.conn.rollback()
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        try:
            self.conn.rollback() if self.conn.read_only else self.conn.commit()
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


class _SQLiteSession(_Session):
    def __init__(self, path: str, read_only: bool, wait: deadlines.Deadline):
        mode = "ro" if read_only else "rw"
        self.conn = sqlite3.connect(
            f"file:{path}?mode={mode}", uri=True, check_same_thread=False, isolation_level=None
        )
        if read_only:
            self.conn.execute("PRAGMA query_only = 1")
        self.conn.execute("BEGIN")
        self.read_only = read_only
        self._stop = threading.Event()
        self.wait = wait
        # Checked every few thousand VM steps: a cancel or the deadline interrupts it.
        self.conn.set_progress_handler(self._interrupt, 10000)

    def _interrupt(self) -> int:
        return 1 if self._stop.is_set() or self.wait.remaining() <= 0 else 0

    def run(self, statement: str, cap: int) -> tuple[list[str], list[tuple]]:
        cur = self.conn.execute(statement)
        return _cursor_rows(cur, cap)

    def cancel(self) -> None:
        self._stop.set()

    def close(self) -> None:
        try:
            self.conn.execute("ROLLBACK" if self.read_only else "COMMIT")
        except sqlite3.Error:
            pass
        self.conn.close()
