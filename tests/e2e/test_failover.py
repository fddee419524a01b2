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

import os
import signal
import threading

import pytest

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
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        answered: list[int] = []
        asking = threading.Thread(target=lambda: answered.append(port()), daemon=True)
        asking.start()
        asking.join(60)  # a safety net: before the fix, this waited forever
        assert answered == [3306]
        os.kill(frozen.proc.pid, signal.SIGCONT)
        until(lambda: port() == frozen.port, "the worker to come back to the host that runs again")
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
        database.close_all()
        frozen.remove()
