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
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from api import create_app
from api.db import db, init_database
from tests.api.conftest import Api, echo_dsl, make_token
from tests.e2e.conftest import free_port, until
from tests.e2e.faults import PrivateMariaDB

_COPIED_TABLES = ("tenant", "api_token")
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), Path("/usr/bin"))


class PrivatePostgres:
    """A throwaway ``postgres`` of this test alone (data in a new folder under /tmp, owned
    by the ``postgres`` user when we are root: the server refuses to run as root)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="agentcanvas-pg-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        # Popen(user=...): the server is our own child, reaped by kill() (not a runuser's).
        self._as: dict[str, Any] = {"user": "postgres", "group": "postgres"} if os.getuid() == 0 else {}

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/agentcanvas_faults"

    def install(self) -> PrivatePostgres:
        if self._as:
            shutil.chown(self.folder, "postgres")
        done = subprocess.run(
            [str(PG_BIN / "initdb"), "-D", str(self.folder / "data"), "-A", "trust"]
            + ["-U", "postgres", "--no-sync"],
            capture_output=True,
            text=True,
            timeout=120,
            **self._as,
        )
        assert done.returncode == 0, f"initdb failed:\n{done.stdout}\n{done.stderr}"
        return self

    def start(self) -> None:
        log = open(self.folder / "postgres.log", "a", encoding="utf-8")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(
            [str(PG_BIN / "postgres"), "-D", str(self.folder / "data"), "-p", str(self.port)]
            + ["-k", str(self.folder), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **self._as,
        )
        end = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres").close()
                return
            except psycopg.OperationalError:
                assert self.proc.poll() is None, "the private postgres exited"
                assert time.monotonic() < end, "the private postgres did not start"
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends, as a crash of the machine would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def connect(self) -> Any:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="agentcanvas_faults")


def _connect(server: PrivateMariaDB | PrivatePostgres) -> Any:
    if isinstance(server, PrivatePostgres):
        return server.connect()
    return pymysql.connect(host="127.0.0.1", port=server.port, user="root", database="agentcanvas_faults")


def _copy_rows(source: PrivateMariaDB | PrivatePostgres, target: PrivateMariaDB | PrivatePostgres) -> None:
    reader, writer = _connect(source), _connect(target)
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
            (server.remove if isinstance(server, PrivatePostgres) else server.kill)()


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
        if app is not None:
            app.config["SERVICES"]["gate"].set()
            app.extensions["agentcanvas.parsing"].stop()
        if db.obj is not None:
            db.obj.close_all()
