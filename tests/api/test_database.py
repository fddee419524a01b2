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
        assert [r.version for r in SchemaVersion.select()] == [v for v, _, _ in MIGRATIONS]
        Tenant.create(name="kept")
    init_database(database_url)  # a second process starting on the same database
    with db.connection_context():
        assert [t.name for t in Tenant.select()] == ["kept"]
    db.obj.close_all()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgres://host/db", "unsupported scheme 'postgres'"),
        ("agentcanvas.db", "is not a URL"),
        ("sqlite://", "names no file"),
        ("mysql://127.0.0.1:3306/", "names no database"),
    ],
)
def test_bad_urls_are_explained(url: str, needle: str):
    with pytest.raises(ValueError, match=needle):
        open_database(url)


def test_unreachable_mysql_is_explained():
    with pytest.raises(OperationalError, match="127.0.0.1:1"):
        init_database("mysql://root@127.0.0.1:1/agentcanvas")


def test_dropped_mysql_connection_reconnects_for_reads_not_for_writes(mysql_url):
    init_database(mysql_url)
    try:
        with db.connection_context():
            Tenant.delete().execute()
            Tenant.create(name="t1")
            killer = open_database(mysql_url)
            with killer.connection_context():
                # Drop our connection from the server side, as a restart or timeout would.
                own_id = db.execute_sql("SELECT CONNECTION_ID()").fetchone()[0]
                killer.execute_sql(f"KILL {int(own_id)}")
                # A read is retried on a fresh connection.
                assert [t.name for t in Tenant.select()] == ["t1"]

                own_id = db.execute_sql("SELECT CONNECTION_ID()").fetchone()[0]
                killer.execute_sql(f"KILL {int(own_id)}")
            # A write is not retried (it may have been applied): the caller sees the error...
            with pytest.raises(OperationalError):
                Tenant.create(name="t2")
            # ...and the next statement runs on a fresh connection.
            Tenant.create(name="t3")
            assert sorted(t.name for t in Tenant.select()) == ["t1", "t3"]

            # A transaction that had not begun yet starts on a fresh connection.
            with killer.connection_context():
                own_id = db.execute_sql("SELECT CONNECTION_ID()").fetchone()[0]
                killer.execute_sql(f"KILL {int(own_id)}")
            with write_transaction():
                Tenant.create(name="t4")
            assert Tenant.select().where(Tenant.name == "t4").exists()
            Tenant.delete().execute()
    finally:
        db.obj.close_all()
