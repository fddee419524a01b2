"""A database URL naming several hosts: the worker moves to the next host when its host
goes down, answers 503 with ``Retry-After`` only when none answers, and comes back to
its first host once it is up again.

Two private ``mariadbd`` processes (tests/e2e/faults.py) stand for two nodes; they do
not replicate, so each holds the same tenant and token (copied) and an agent exists
on the first one only: the agent list tells which host answered. Hosts are killed
with SIGKILL, as a crash would.
"""

from __future__ import annotations

import threading

import pymysql

from api import create_app
from api.db import db, init_database
from tests.api.conftest import Api, echo_dsl, make_token
from tests.e2e.conftest import until
from tests.e2e.faults import PrivateMariaDB

_COPIED_TABLES = ("tenant", "api_token")


def _copy_rows(source: PrivateMariaDB, target: PrivateMariaDB) -> None:
    conn = pymysql.connect(host="127.0.0.1", port=target.port, user="root", database="agentcanvas_faults")
    try:
        with conn.cursor() as cur:
            for table in _COPIED_TABLES:
                rows = source.query(f"SELECT * FROM {table}")
                marks = ", ".join(["%s"] * len(rows[0]))
                cur.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        conn.commit()
    finally:
        conn.close()


def test_a_worker_moves_to_the_next_host_and_comes_back(tmp_path, caplog):
    first = PrivateMariaDB(tmp_path / "one").install()
    second = PrivateMariaDB(tmp_path / "two").install()
    try:
        for server in (first, second):
            server.start()
            init_database(server.url)
        url = f"mysql://root@127.0.0.1:{first.port},127.0.0.1:{second.port}/agentcanvas_faults"
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
        if db.obj is not None:
            db.obj.close_all()
        first.kill()
        second.kill()
