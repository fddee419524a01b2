"""API test set-up: every test runs on SQLite, on the real MariaDB and on the real Postgres.

SQLite: a fresh file per test. MariaDB (127.0.0.1:3306, root, no password) and
Postgres (127.0.0.1:5432, postgres, trust): one throwaway database per test process
(``agentcanvas_test_<random>``), emptied before each test and dropped at the end. If
a server does not answer, its part of the suite fails with a message saying so; it is
never skipped (``make services`` starts both).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from peewee import MySQLDatabase, OperationalError, PostgresqlDatabase

import tests.api.components  # noqa: F401 - registers the test-only component types
from api import create_app, stop_background
from api.db import ALL_MODELS, SchemaVersion, db, init_database
from api.services import tokens

ROOT = Path(__file__).resolve().parents[2]
MYSQL = {"host": "127.0.0.1", "port": 3306, "user": "root"}
POSTGRES = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


def _admin() -> MySQLDatabase:
    return MySQLDatabase("information_schema", **MYSQL)


def _postgres_admin() -> PostgresqlDatabase:
    return PostgresqlDatabase("postgres", prefer_psycopg3=True, **POSTGRES)


# server -> (admin connection, what to call it, its URL for a database name, the DROP)
_SERVERS = {
    "mysql": (
        _admin,
        "MariaDB at 127.0.0.1:3306 as root",
        "mysql://root@127.0.0.1:3306/{}",
        "DROP DATABASE IF EXISTS `{}`",
    ),
    "postgres": (
        _postgres_admin,
        "Postgres at 127.0.0.1:5432 as postgres",
        "postgresql://postgres@127.0.0.1:5432/{}",
        'DROP DATABASE IF EXISTS "{}" WITH (FORCE)',
    ),
}


def throwaway_database(server: str, prefix: str) -> Iterator[str]:
    """Yield the URL of a new database ``<prefix>_<random>`` on ``server``; drop it afterwards.

    The database itself is made by whoever opens the URL first (``init_database``). A
    server that does not answer fails the test with a message saying how to start it.
    """
    admin_of, where, url, drop = _SERVERS[server]
    admin = admin_of()
    try:
        admin.connect()
    except OperationalError as exc:
        pytest.fail(f"{where} is not reachable ({exc}); these tests need it: start it with `make services`")
    admin.close()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    yield url.format(name)
    close_idle_connections()
    with admin.connection_context():
        admin.execute_sql(drop.format(name))


@pytest.fixture(scope="session")
def mysql_url():
    yield from throwaway_database("mysql", "agentcanvas_test")


@pytest.fixture(scope="session")
def postgres_url():
    yield from throwaway_database("postgres", "agentcanvas_test")


@pytest.fixture(params=["sqlite", "mysql", "postgres"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def database_url(backend, tmp_path, request) -> str:
    """This test's empty database: a new SQLite file, or the emptied MariaDB or Postgres database."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'agentcanvas.db'}"
    url = request.getfixturevalue(f"{backend}_url")
    init_database(url, max_connections=4)
    with db.connection_context(), db.atomic():
        for table in ALL_MODELS:
            if table is not SchemaVersion:
                table.delete().execute()
    close_idle_connections()
    return url


def close_idle_connections() -> None:
    """Close this thread's database connection and the pool's idle ones.

    Never ``close_all``: it also closes the connections other threads are in the middle
    of a query on, and SQLite's driver then crashes the process (a segfault that hung
    the whole xdist run). A connection still in use is left to its thread.
    """
    database = db.obj
    if database is None:
        return
    if not database.is_closed():
        database.close()
    database.close_idle()
    hosts = getattr(database, "host_list", None)
    if hosts is not None:
        hosts.stop()  # probing hosts that are down starts again when the pool is used


def stop_apps(apps: list, timeout: float = 30.0) -> None:
    """Stop what the apps started in the background (:func:`api.stop_background`: turns
    finish, parse threads, the sweeper and the lease keepers end), then close the idle
    connections. Fails naming what still runs after ``timeout`` seconds: left running,
    it would use the next test's database through the shared ``db`` handle."""
    running = []
    for app in apps:
        gate = (app.config.get("SERVICES") or {}).get("gate")
        if gate is not None:
            gate.set()  # turns held by the test components (tests/api/components.py) go on
        running += stop_background(app, timeout)
    close_idle_connections()
    if running:
        pytest.fail(f"still running {timeout:g} s after the test: {', '.join(running)}")


@pytest.fixture
def started_apps() -> Iterator[list]:
    """The apps this test built, stopped at its end (:func:`stop_apps`); a test that
    calls ``create_app`` itself appends the app to this list."""
    apps: list = []
    yield apps
    stop_apps(apps)


@pytest.fixture
def app_factory(database_url, started_apps):
    """Build apps on this test's database (``make(**config)``); all share the database
    and are stopped at the end of the test."""

    def make(**config):
        settings = {
            "DATABASE_URL": database_url,
            "CANCEL_POLL_SECONDS": 0.02,
            # No background sweep: a test sweeps when it means to (tests/api/test_retention.py).
            "SWEEP_INTERVAL_SECONDS": 0,
            "PARSE_POLL_SECONDS": 0.05,
            "SERVICES": {"gate": threading.Event()},
        }
        settings.update(config)
        app = create_app(settings)
        started_apps.append(app)
        return app

    return make


@pytest.fixture
def app(app_factory):
    return app_factory()


def make_token(app, tenant: str = "tenant-a", kind: str = "api") -> str:
    with app.app_context():
        plain, _ = tokens.create_token(tokens.tenant_by_name(tenant).id, kind)
    return plain


class Api:
    """A test client speaking for one tenant."""

    def __init__(self, app, token: str):
        self.app = app
        self.client = app.test_client()
        self.token = token

    def headers(self, extra: dict | None = None) -> dict:
        return {"Authorization": f"Bearer {self.token}", **(extra or {})}

    def call(self, method: str, path: str, **kw):
        kw["headers"] = self.headers(kw.get("headers"))
        return self.client.open(f"/api/v1{path}", method=method, **kw)

    def get(self, path: str, **kw):
        return self.call("GET", path, **kw)

    def post(self, path: str, **kw):
        return self.call("POST", path, **kw)

    def put(self, path: str, **kw):
        return self.call("PUT", path, **kw)

    def delete(self, path: str, **kw):
        return self.call("DELETE", path, **kw)

    def patch(self, path: str, **kw):
        return self.call("PATCH", path, **kw)

    def create_agent(self, dsl: dict, title: str | None = None) -> str:
        resp = self.post("/agents", json={"title": title or f"agent-{uuid.uuid4().hex[:8]}", "dsl": dsl})
        assert resp.status_code == 200, resp.json
        return resp.json["data"]["id"]

    def create_session(self, agent_id: str, **body) -> str:
        resp = self.post(f"/agents/{agent_id}/sessions", json=body)
        assert resp.status_code == 200, resp.json
        return resp.json["data"]["id"]

    def ask(self, agent_id: str, session_id: str | None, question: str = "", **body):
        """A blocking completion; returns the response."""
        payload = {"question": question, "stream": False, **body}
        if session_id is not None:
            payload["session_id"] = session_id
        return self.post(f"/agents/{agent_id}/completions", json=payload)

    def ask_stream(self, agent_id: str, session_id: str | None, question: str = "", **body) -> list:
        """A streamed completion read to the end; returns the frames (events, then ``"[DONE]"``)."""
        payload = {"question": question, "stream": True, "session_id": session_id, **body}
        resp = self.post(f"/agents/{agent_id}/completions", json=payload)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return parse_sse(resp.get_data(as_text=True))

    def session(self, agent_id: str, session_id: str, **params) -> dict:
        resp = self.get(f"/agents/{agent_id}/sessions/{session_id}", query_string=params)
        assert resp.status_code == 200, resp.json
        return resp.json["data"]


def parse_sse(text: str) -> list:
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data:"), block
        body = block[len("data:") :]
        frames.append(body if body == "[DONE]" else json.loads(body))
    return frames


@pytest.fixture
def api(app) -> Api:
    return Api(app, make_token(app, "tenant-a"))


@pytest.fixture
def other(app) -> Api:
    """A second tenant."""
    return Api(app, make_token(app, "tenant-b"))


def sample(name: str) -> dict:
    """A sample agent's DSL (samples/<name>.json is a RAGFlow-style export)."""
    return json.loads((ROOT / "samples" / f"{name}.json").read_text())["dsl"]


def dsl_of(components: dict, variables: dict | None = None, prologue: str = "Hi!") -> dict:
    """A DSL from ``{id: (component_name, params, downstream)}``; ``begin`` is added."""
    first = next(iter(components), None)
    comps = {
        "begin": {
            "obj": {"component_name": "Begin", "params": {"prologue": prologue, "inputs": {}}},
            "downstream": [first] if first else [],
            "upstream": [],
        }
    }
    for cid, (name, params, downstream) in components.items():
        comps[cid] = {
            "obj": {"component_name": name, "params": params},
            "downstream": list(downstream),
            "upstream": [],
        }
    return {
        "components": comps,
        "path": [],
        "history": [],
        "retrieval": [],
        "globals": {},
        "variables": variables or {},
    }


def echo_dsl(text: str = "echo: {sys.query}") -> dict:
    return dsl_of({"Message:Echo": ("Message", {"content": [text]}, [])})
