"""A database URL naming several hosts: the worker moves to the next host when its host
goes down, answers 503 with ``Retry-After`` only when none answers, and comes back to
its first host once it is up again.

Two private servers stand for two nodes: ``mariadbd`` processes (tests/e2e/faults.py),
or ``postgres`` ones (:class:`PrivatePostgres`, libpq's multi-host URL). They do not
replicate, so each holds the same tenant and token (copied) and an agent exists on the
first one only: the agent list tells which host answered. Servers are killed with
SIGKILL, as a crash would.
"""

from __future__ import annotations

import threading
import uuid

import pymysql
import pytest
from peewee import Database

from api import create_app
from api.db import db, init_database, open_database
from tests.api.conftest import Api, echo_dsl, make_token, stop_apps
from tests.e2e.conftest import until
from tests.e2e.faults import PrivateMariaDB, PrivatePostgres, PrivateServer

_COPIED_TABLES = ("tenant", "api_token")


def _copy_rows(source: PrivateServer, target: PrivateServer) -> None:
    reader, writer = source.connect(), target.connect()
    try:
        for table in _COPIED_TABLES:
            with reader.cursor() as cur:
                cur.execute(f"SELECT * FROM {table}")
                rows = cur.fetchall()
            marks = ", ".join(["%s"] * len(rows[0]))
            with writer.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        writer.commit()
    finally:
        reader.close()
        writer.close()


@pytest.fixture(params=["mysql", "postgres"])
def two_servers(request, tmp_path):
    if request.param == "mysql":
        servers = [PrivateMariaDB(tmp_path / name).install() for name in ("one", "two")]
    else:
        servers = [PrivatePostgres().install() for _ in range(2)]
    try:
        yield servers
    finally:
        for server in servers:
            server.remove()


def test_a_worker_moves_to_the_next_host_and_comes_back(two_servers, caplog):
    first, second = two_servers
    app = None
    try:
        for server in (first, second):
            server.start()
            init_database(server.url)
        hosts = f"127.0.0.1:{first.port},127.0.0.1:{second.port}"
        url = first.url.replace(f"127.0.0.1:{first.port}", hosts)
        app = create_app(
            {"DATABASE_URL": url, "SWEEP_INTERVAL_SECONDS": 0, "SERVICES": {"gate": threading.Event()}}
        )
        db.obj.host_list.cool_down = 0.5  # the default 5 s only makes this test wait longer
        api = Api(app, make_token(app))
        api.create_agent(echo_dsl(), title="on the first host")
        _copy_rows(first, second)

        def titles():
            reply = api.get("/agents")
            assert reply.status_code == 200, reply.get_json()
            return [agent["title"] for agent in reply.get_json()["data"]["canvas"]]

        assert titles() == ["on the first host"]

        first.kill()
        assert titles() == []  # the very next request: answered by the second host, no 503
        assert f"database host 127.0.0.1:{first.port} is down or not ready" in caplog.text

        second.kill()
        reply = api.get("/agents")
        assert reply.status_code == 503
        assert reply.headers["Retry-After"]
        assert str(first.port) not in reply.get_data(as_text=True)  # no driver text

        second.start()
        assert titles() == []  # the first host is still down: the second one serves
        first.start()
        until(lambda: titles() == ["on the first host"], "the worker to come back to its first host")
        assert f"database host 127.0.0.1:{first.port} answers again" in caplog.text
        second.kill()
        assert titles() == ["on the first host"]
    finally:
        stop_apps([app] if app is not None else [])


def test_a_frozen_host_is_passed_over_not_waited_for(tmp_path):
    """A server that takes TCP connections and never answers (SIGSTOP, as a hung machine
    or a node stuck behind a broken network): the check-out ping of its pooled
    connection and a new connection to it each fail after the connect timeout, and the
    next host answers; once it runs again, the worker is back."""
    frozen = PrivateMariaDB(tmp_path / "frozen").install()
    frozen.start()
    hosts = f"127.0.0.1:{frozen.port},127.0.0.1:3306"  # the second: the shared MariaDB
    database = open_database(f"mysql://root@{hosts}/information_schema?connect_timeout=1")
    database.host_list.cool_down = 0.5

    def port() -> int:
        with database.connection_context():
            return database.execute_sql("SELECT @@port").fetchone()[0]

    try:
        assert port() == frozen.port  # its connection stays in the pool
        frozen.freeze()
        answered: list[int] = []
        asking = threading.Thread(target=lambda: answered.append(port()), daemon=True)
        asking.start()
        asking.join(60)  # a safety net: before the fix, this waited forever
        assert answered == [3306]
        frozen.thaw()
        until(lambda: port() == frozen.port, "the worker to come back to the host that runs again")
    finally:
        frozen.thaw()
        database.close_all()
        frozen.remove()


def test_a_write_first_on_a_frozen_host_runs_once_on_the_next_host(tmp_path):
    """The first statement on a pooled connection to a frozen host is a write, or begins
    a transaction: the connection's check fails before anything is sent, so the write is
    made once, on the next host, and the frozen host, once it runs again, has nothing
    left to apply (a statement sent along with the check would wait there and be applied
    after its caller was told it failed or saw it done elsewhere)."""
    frozen = PrivateMariaDB(tmp_path / "frozen").install()
    frozen.start()
    name = f"agentcanvas_frozen_{uuid.uuid4().hex[:12]}"
    shared = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    for conn in (frozen.connect(None), shared):
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
            cur.execute(f"CREATE TABLE {name}.written (what VARCHAR(20))")
    frozen_conn = frozen.connect(name)
    url = f"mysql://root@127.0.0.1:{frozen.port},127.0.0.1:3306/{name}?connect_timeout=1"
    pools = {how: open_database(url) for how in ("alone", "in a transaction")}
    failures: list[BaseException] = []

    def write(database: Database, how: str) -> None:
        try:
            with database.connection_context():
                insert = lambda: database.execute_sql("INSERT INTO written VALUES (%s)", (how,))  # noqa: E731
                if how == "alone":
                    insert()
                else:
                    with database.atomic():
                        insert()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    try:
        for database in pools.values():  # each pool keeps a connection to the first host
            with database.connection_context():
                assert database.execute_sql("SELECT @@port").fetchone()[0] == frozen.port
        frozen.freeze()
        for how, database in pools.items():
            writing = threading.Thread(target=write, args=(database, how), daemon=True)
            writing.start()
            writing.join(60)  # a safety net
            assert not writing.is_alive() and failures == []
        frozen.thaw()
        with shared.cursor() as cur:
            cur.execute(f"SELECT what FROM {name}.written ORDER BY what")
            assert [row[0] for row in cur.fetchall()] == ["alone", "in a transaction"]

        def left_over() -> list[str]:
            # The pools' connections to it are closed: once it has noticed, it is done
            # with whatever they had sent.
            with frozen_conn.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE db = %s", (name,))
                if cur.fetchone()[0] > 1:  # this connection
                    return []
                cur.execute("SELECT what FROM written")
                return [row[0] for row in cur.fetchall()] or ["nothing"]

        assert until(left_over, "the frozen host to see its connections closed") == ["nothing"]
    finally:
        frozen.thaw()
        for database in pools.values():
            database.close_all()
        with shared.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        shared.close()
        frozen.remove()
