"""The storage layer: URLs, idempotent schema set-up, reconnecting after a dropped connection."""

from __future__ import annotations

import pytest
from peewee import OperationalError

from api.db import SchemaVersion, Tenant, db, init_database, open_database, setup_schema, write_transaction
from api.db.migrations import MIGRATIONS


def test_schema_setup_is_idempotent(database_url):
    init_database(database_url)
    with db.connection_context():
        setup_schema()
        setup_schema()
        assert sorted(r.version for r in SchemaVersion.select()) == [v for v, _, _ in MIGRATIONS]
        Tenant.create(name="kept")
    init_database(database_url)  # a second process starting on the same database
    with db.connection_context():
        assert [t.name for t in Tenant.select()] == ["kept"]
    db.obj.close_all()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("oracle://host/db", "unsupported scheme 'oracle'"),
        ("postgresql://127.0.0.1:5432/", "names no database"),
        ("agentcanvas.db", "is not a URL"),
        ("sqlite://", "names no file"),
        ("mysql://127.0.0.1:3306/", "names no database"),
    ],
)
def test_bad_urls_are_explained(url: str, needle: str):
    with pytest.raises(ValueError, match=needle):
        open_database(url)


@pytest.mark.parametrize(
    "url", ["mysql://root@127.0.0.1:1/agentcanvas", "postgresql://postgres@127.0.0.1:1/ac"]
)
def test_unreachable_server_is_explained(url: str):
    with pytest.raises(OperationalError, match="127.0.0.1:1"):
        init_database(url)


# How to learn our connection's id, and how another connection ends it on the server.
_KILL = {
    "mysql": ("SELECT CONNECTION_ID()", "KILL {}"),
    "postgres": ("SELECT pg_backend_pid()", "SELECT pg_terminate_backend({})"),
}


@pytest.mark.parametrize("server", ["mysql", "postgres"])
def test_dropped_connection_reconnects_for_reads_not_for_writes(server, request):
    url = request.getfixturevalue(f"{server}_url")
    own, kill = _KILL[server]
    init_database(url)
    try:
        with db.connection_context():
            Tenant.delete().execute()
            Tenant.create(name="t1")
            killer = open_database(url)
            with killer.connection_context():
                # Drop our connection from the server side, as a restart or timeout would.
                own_id = db.execute_sql(own).fetchone()[0]
                killer.execute_sql(kill.format(int(own_id)))
                # A read is retried on a fresh connection.
                assert [t.name for t in Tenant.select()] == ["t1"]

                own_id = db.execute_sql(own).fetchone()[0]
                killer.execute_sql(kill.format(int(own_id)))
            # A write is not retried (it may have been applied): the caller sees the error...
            with pytest.raises(OperationalError):
                Tenant.create(name="t2")
            # ...and the next statement runs on a fresh connection.
            Tenant.create(name="t3")
            assert sorted(t.name for t in Tenant.select()) == ["t1", "t3"]

            # A transaction that had not begun yet starts on a fresh connection.
            with killer.connection_context():
                own_id = db.execute_sql(own).fetchone()[0]
                killer.execute_sql(kill.format(int(own_id)))
            with write_transaction():
                Tenant.create(name="t4")
            assert Tenant.select().where(Tenant.name == "t4").exists()
            Tenant.delete().execute()
    finally:
        db.obj.close_all()
