"""The storage layer: URLs, idempotent schema set-up, reconnecting after a dropped connection."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time

import pymysql
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from peewee import IntegrityError, InterfaceError, OperationalError
from pymysql.converters import escape_string

from api import create_app
from api.db import (
    MessageLog,
    SchemaVersion,
    Tenant,
    db,
    init_database,
    open_database,
    setup_schema,
    write_transaction,
)
from api.db.database import _CHECKPOINTER, WriteMissed, ensure_server_database, escape_mysql_text
from api.db.migrations import MIGRATIONS
from api.db.prepared import Prepared
from tests.api.conftest import Api, echo_dsl, make_token


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
        (
            "mysql://root:secret@h1:3306,,h3/db",
            "'mysql://root:\\*\\*\\*@h1:3306,,h3/db' has an empty entry in its host list",
        ),
        ("mysql://root@h1:3306,h2:33x6/db", "port '33x6' of host 'h2' is not a number from 1 to 65535"),
        ("mysql://root@h1:3306,h2:70000/db", "port '70000' of host 'h2'"),
        ("mysql://root@h1:3306,h2:/db", "host 'h2:' has an empty port"),
        ("postgresql://u@h1:5432,h2:5432/", "names no database"),
        ("postgresql://u@[::1:5432,h2/db", "cannot be read"),
        ("postgresql://u@h1,h2/db?sslmode=disable&sslmode=require", "gives option 'sslmode' twice"),
        (
            "mysql://u@h1,h2/db?wsrep_sync_wait=16",
            "option wsrep_sync_wait='16' .* is not a number from 0 to 15",
        ),
    ],
)
def test_bad_urls_are_explained(url: str, needle: str):
    with pytest.raises(ValueError, match=needle) as caught:
        open_database(url)
    assert "secret" not in str(caught.value)


# A port nothing listens on (connections are refused at once), and how to ask which port a
# connection reached.
_CLOSED_PORT = 1
_WHICH_PORT = {"mysql": "SELECT @@port", "postgres": "SELECT inet_server_port()"}


@pytest.mark.parametrize("server", ["mysql", "postgres"])
def test_a_url_with_several_hosts_uses_the_first_that_answers(server, request):
    url = request.getfixturevalue(f"{server}_url")
    real_port = 3306 if server == "mysql" else 5432
    hosts = f"127.0.0.1:{_CLOSED_PORT},127.0.0.1:{real_port}"
    multi = url.replace(f"127.0.0.1:{real_port}", hosts)
    if server == "postgres":  # libpq's options pass through
        multi += "?target_session_attrs=read-write&application_name=agentcanvas-multi"
    init_database(multi)
    try:
        with db.connection_context():
            assert db.execute_sql(_WHICH_PORT[server]).fetchone()[0] == real_port
            Tenant.create(name="on the second host")
            assert Tenant.select().where(Tenant.name == "on the second host").exists()
            if server == "postgres":
                assert db.execute_sql("SHOW application_name").fetchone()[0] == "agentcanvas-multi"
            Tenant.delete().execute()
    finally:
        db.obj.close_all()


@pytest.mark.parametrize(
    "url", ["mysql://root@127.0.0.1:1,127.0.0.1:2/ac", "postgresql://postgres@127.0.0.1:1,127.0.0.1:2/ac"]
)
def test_no_host_answering_names_every_host(url: str):
    with pytest.raises(OperationalError) as caught:
        init_database(url)
    message = str(caught.value)
    assert "127.0.0.1:1, 127.0.0.1:2" in message
    assert "port 2" in message or "127.0.0.1:2:" in message  # the last host's own reason


@pytest.mark.parametrize(
    "url", ["mysql://root@127.0.0.1:1/agentcanvas", "postgresql://postgres@127.0.0.1:1/ac"]
)
def test_unreachable_server_is_explained(url: str):
    with pytest.raises(OperationalError, match="127.0.0.1:1"):
        init_database(url)


#: A tenant row, by id and name: the write the tests of ``Prepared.send`` send.
_INSERT_TENANT = Prepared(lambda m: Tenant.insert(id=m("id"), name=m("name"), create_time=0))
_RENAME_TENANT = Prepared(lambda m: Tenant.update(name=m("new")).where(Tenant.name == m("old")))


def names() -> list[str]:
    """The tenants' names, sorted."""
    return sorted(t.name for t in Tenant.select())


# How to learn our connection's id, and how another connection ends it on the server.
_KILL = {
    "mysql": ("SELECT CONNECTION_ID()", "KILL {}"),
    # (with a timeout: it returns once the backend has ended, not when it was told to)
    "postgres": ("SELECT pg_backend_pid()", "SELECT pg_terminate_backend({}, 10000)"),
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


def test_a_sqlite_write_transaction_commits_whole_or_not_at_all(tmp_path):
    """On SQLite: a write transaction's writes are kept together or not at all (an error
    in it, or a COMMIT the database refuses, raised as peewee's error); one inside another
    is a savepoint that undoes only its own writes; after each, the connection is in no
    transaction and the write lock is free (another thread writes at once)."""
    init_database(f"sqlite:///{tmp_path / 'ac.db'}")

    def idle() -> bool:
        return not db.obj.in_transaction() and not db.connection().in_transaction

    try:
        with db.connection_context():
            db.execute_sql("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
            db.execute_sql(
                "CREATE TABLE child (parent_id INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
            )
            with write_transaction():
                Tenant.create(name="a1")
                with write_transaction():
                    Tenant.create(name="a2")
                with pytest.raises(IntegrityError), write_transaction():
                    Tenant.create(name="b1")
                    Tenant.create(name="a1")  # the name is taken: this savepoint only
            assert names() == ["a1", "a2"] and idle()
            with pytest.raises(ZeroDivisionError), write_transaction():
                Tenant.create(name="c1")
                raise ZeroDivisionError
            assert names() == ["a1", "a2"] and idle()
            with pytest.raises(IntegrityError, match="FOREIGN KEY"), write_transaction():
                Tenant.create(name="d1")
                db.execute_sql("INSERT INTO child VALUES (7)")  # refused only at COMMIT
            assert names() == ["a1", "a2"] and idle()
        errors: list[BaseException] = []

        def write_elsewhere() -> None:
            try:
                with db.connection_context(), write_transaction():
                    Tenant.create(name="e1")
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        thread = threading.Thread(target=write_elsewhere)
        thread.start()
        thread.join(10)
        assert not thread.is_alive() and errors == []
        with db.connection_context():
            assert names() == ["a1", "a2", "e1"]
    finally:
        db.obj.close_all()


@pytest.mark.parametrize("server", ["mysql", "postgres"])
def test_a_transaction_commits_whole_or_not_at_all_and_holds_no_snapshot_after(server, request):
    """A transaction's writes are seen together once it commits, and none of them when it
    failed or its connection dropped after its first statement; reads outside a
    transaction see what other connections committed meanwhile (no snapshot of an
    earlier transaction is left open on the pooled connection)."""
    insert = _INSERT_TENANT
    url = request.getfixturevalue(f"{server}_url")
    own, kill = _KILL[server]
    init_database(url)
    other = open_database(url)

    try:
        with db.connection_context():
            Tenant.delete().execute()
            with write_transaction():
                Tenant.create(name="a1")
                Tenant.create(name="a2")
            assert names() == ["a1", "a2"]
            with other.connection_context():
                other.execute_sql("UPDATE tenant SET name = 'a3' WHERE name = 'a2'")
            assert names() == ["a1", "a3"]

            with pytest.raises(ZeroDivisionError), write_transaction():
                Tenant.create(name="b1")
                raise ZeroDivisionError
            with pytest.raises(OperationalError), write_transaction():
                Tenant.create(name="c1")
                with other.connection_context():
                    other.execute_sql(kill.format(int(db.execute_sql(own).fetchone()[0])))
                Tenant.create(name="c2")
            assert names() == ["a1", "a3"]
            # The same with writes sent ahead (Prepared.send): the one answered before the
            # drop and the one that was to go with the COMMIT are both lost.
            with pytest.raises((OperationalError, InterfaceError)), write_transaction():
                insert.send(id="e1", name="e1")
                with other.connection_context():
                    other.execute_sql(kill.format(int(db.execute_sql(own).fetchone()[0])))
                insert.send(id="e2", name="e2")
            assert names() == ["a1", "a3"]
        with db.connection_context(), write_transaction():
            Tenant.create(name="d1")
        with other.connection_context():
            other.execute_sql("DELETE FROM tenant WHERE name = 'a1'")
        with db.connection_context():
            assert names() == ["a3", "d1"]
            Tenant.delete().execute()
    finally:
        other.close_all()
        db.obj.close_all()


@pytest.mark.parametrize("server", ["mysql", "postgres"])
def test_a_transaction_begun_on_a_connection_that_then_dropped_is_sent_whole_on_another(server, request):
    """The server ends the connection after the transaction began but before anything of
    it was sent (the ``BEGIN`` goes with its first statement): its writes are sent again,
    whole, on a new connection, and saved once."""
    insert = _INSERT_TENANT
    url = request.getfixturevalue(f"{server}_url")
    own, kill = _KILL[server]
    init_database(url)
    killer = open_database(url)
    try:
        with db.connection_context():
            Tenant.delete().execute()
            own_id = int(db.execute_sql(own).fetchone()[0])
            with write_transaction():
                with killer.connection_context():
                    killer.execute_sql(kill.format(own_id))
                first = insert.send(id="a", name="sent first")
                insert.send(id="b", name="sent second")
                assert first.rowcount == 1
            assert int(db.execute_sql(own).fetchone()[0]) != own_id
            assert sorted(t.name for t in Tenant.select()) == ["sent first", "sent second"]
            Tenant.delete().execute()
    finally:
        killer.close_all()
        db.obj.close_all()


@pytest.mark.parametrize("server", ["mysql", "postgres"])
def test_a_row_locked_in_a_transaction_stays_locked_until_it_ends(server, request):
    """A read that locks (``FOR UPDATE``) as a transaction's first statement runs inside
    it: another connection cannot change the row until the transaction ends."""
    url = request.getfixturevalue(f"{server}_url")
    init_database(url)
    other = open_database(url)
    short_wait = {
        "mysql": "SET SESSION innodb_lock_wait_timeout = 1",
        "postgres": "SET lock_timeout = '300ms'",
    }
    try:
        with db.connection_context():
            Tenant.delete().execute()
            Tenant.create(id="t", name="before")
            with write_transaction():
                assert Tenant.select().where(Tenant.id == "t").for_update().get().name == "before"
                with other.connection_context():
                    other.execute_sql(short_wait[server])
                    with pytest.raises(OperationalError):
                        other.execute_sql("UPDATE tenant SET name = 'other' WHERE id = 't'")
                Tenant.update(name="ours").where(Tenant.id == "t").execute()
            with other.connection_context():
                other.execute_sql("UPDATE tenant SET name = 'other, after' WHERE id = 't'")
            assert Tenant.get_by_id("t").name == "other, after"
            Tenant.delete().execute()
    finally:
        other.close_all()
        db.obj.close_all()


@pytest.mark.parametrize("server", ["mysql", "postgres"])
def test_a_pooled_connection_the_server_ended_is_not_used_again(server, request):
    """The server ends a connection while it waits in the pool (a restart, an idle
    timeout, a kill): the next request's first statement, a write or a transaction too,
    runs once on a new connection instead of failing."""
    insert = _INSERT_TENANT
    url = request.getfixturevalue(f"{server}_url")
    own, kill = _KILL[server]
    init_database(url)
    killer = open_database(url)

    def end_the_pooled_connection() -> None:
        with db.connection_context():
            own_id = db.execute_sql(own).fetchone()[0]
        with killer.connection_context():
            killer.execute_sql(kill.format(int(own_id)))

    try:
        with db.connection_context():
            Tenant.delete().execute()
        end_the_pooled_connection()
        with db.connection_context():
            Tenant.create(name="alone")
        end_the_pooled_connection()
        with db.connection_context(), write_transaction():
            Tenant.create(name="in a transaction")
        end_the_pooled_connection()
        with db.connection_context(), write_transaction():  # writes sent with the COMMIT's turn
            insert.send(id="t3", name="sent")
            insert.send(id="t4", name="sent too")
        end_the_pooled_connection()
        with db.connection_context():
            assert sorted(t.name for t in Tenant.select()) == [
                "alone",
                "in a transaction",
                "sent",
                "sent too",
            ]
            Tenant.delete().execute()
    finally:
        killer.close_all()
        db.obj.close_all()


def test_writes_sent_with_the_next_statement_commit_with_their_transaction_or_not_at_all(database_url):
    """``Prepared.send``: a write of the open transaction goes with the next statement
    (MySQL), with the writes after it in one pipeline (Postgres) or at once (SQLite);
    either way it commits with the transaction, its rowcount is known when asked, and a
    write that fails loses the transaction whole."""
    insert, rename = _INSERT_TENANT, _RENAME_TENANT
    init_database(database_url)
    try:
        with db.connection_context():
            with write_transaction():
                insert.send(id="a", name="one")
                renamed = rename.send(old="one", new="two")
                nothing = rename.send(old="none", new="three")
                insert.send(id="b", name="four")
                assert (renamed.rowcount, nothing.rowcount) == (1, 0)
                insert.send(id="c", name="five")
            assert names() == ["five", "four", "two"]

            with pytest.raises(IntegrityError), write_transaction():
                insert.send(id="d", name="six")
                insert.send(id="e", name="two")  # taken: refused
                Tenant.select().count()
            with pytest.raises(IntegrityError), write_transaction():
                insert.send(id="f", name="seven")
                insert.send(id="g", name="four")  # refused at the latest before COMMIT
            assert names() == ["five", "four", "two"]

            assert insert.send(id="h", name="eight").rowcount == 1  # outside a transaction: now
            assert names() == ["eight", "five", "four", "two"]
            Tenant.delete().execute()
    finally:
        db.obj.close_all()


def test_a_write_sent_to_match_one_row_commits_nothing_of_its_transaction_when_it_does_not(database_url):
    """``Prepared.send(one_row=True)``, a turn's version-checked UPDATE: where it matched one
    row the transaction commits; where it matched none or several, ``WriteMissed`` is
    raised, by the COMMIT or before the next statement runs, and nothing of the
    transaction is kept: not the writes before it, nor those after. (Postgres checks it
    on the server, in the round trip that carries the COMMIT; MySQL before anything
    after it is sent; SQLite at once.)"""
    insert, rename = _INSERT_TENANT, _RENAME_TENANT
    stamp_others = Prepared(lambda m: Tenant.update(create_time=m("t")).where(Tenant.name != m("name")))
    init_database(database_url)
    try:
        with db.connection_context():
            with write_transaction():
                insert.send(id="a", name="one")
            with write_transaction():
                renamed = rename.send(old="one", new="two", one_row=True)
                insert.send(id="b", name="three")
            assert names() == ["three", "two"] and renamed.rowcount == 1

            with pytest.raises(WriteMissed, match="matched 0 rows") as missed, write_transaction():
                insert.send(id="c", name="four")
                rename.send(old="nobody", new="five", one_row=True)
                insert.send(id="d", name="six")
            assert missed.value.rowcount == 0 and names() == ["three", "two"]

            with pytest.raises(WriteMissed), write_transaction():
                rename.send(old="nobody", new="seven", one_row=True)
                Tenant.insert(id="e", name="eight", create_time=0).execute()  # not run
            with pytest.raises(WriteMissed, match="matched 2 rows") as missed, write_transaction():
                stamp_others.send(name="", t=9, one_row=True)  # both rows
            assert missed.value.rowcount == 2 and names() == ["three", "two"]
            assert {t.create_time for t in Tenant.select()} == {0}

            # The connection goes on: the next transaction commits.
            with write_transaction():
                rename.send(old="two", new="ten", one_row=True)
            assert names() == ["ten", "three"]
            Tenant.delete().execute()
    finally:
        db.obj.close_all()


def test_checked_writes_that_miss_again_and_again_leave_the_connection_working(database_url):
    """One connection, the same statements, a checked write missing every third time (a
    busy session's turns): each transaction commits or is rolled back whole, and none
    fails otherwise. (On Postgres, psycopg held a statement prepared whose Parse the
    server had skipped, after the check failed the pipeline it was in; from then on each
    use of it failed: 'prepared statement "_pg3_2" does not exist'.)"""
    insert, rename = _INSERT_TENANT, _RENAME_TENANT
    init_database(database_url)
    try:
        with db.connection_context():
            insert.execute(id="first", name="v0")
            kept, version = ["v0"], 0
            for i in range(15):
                missing = i % 3 == 0
                try:
                    with write_transaction():
                        old = "nobody" if missing else f"v{version}"
                        rename.send(old=old, new=f"v{version + 1}", one_row=True)
                        insert.send(id=f"t{i}", name=f"n{i}")
                except WriteMissed:
                    assert missing, i
                    continue
                assert not missing, i
                version += 1
                kept[0] = f"v{version}"
                kept.append(f"n{i}")
            assert names() == sorted(kept) and len(kept) == 11
            Tenant.delete().execute()
    finally:
        db.obj.close_all()


def test_writes_sent_in_a_savepoint_that_is_rolled_back_are_undone_and_those_before_it_kept(database_url):
    """A write sent before a nested transaction is applied before it begins; one sent in it
    is undone with it when the nested part fails, though it had not been answered yet;
    the outer transaction commits the rest. (A sent write that fails loses the whole
    transaction: test above.)"""
    insert = _INSERT_TENANT
    init_database(database_url)
    try:
        with db.connection_context():
            with write_transaction():
                insert.send(id="a", name="before")
                with contextlib.suppress(RuntimeError), db.atomic():
                    insert.send(id="b", name="in the savepoint")
                    raise RuntimeError("the nested part fails")
                insert.send(id="e", name="after")
            assert sorted(t.name for t in Tenant.select()) == ["after", "before"]
            Tenant.delete().execute()
    finally:
        db.obj.close_all()


class _Proxy:
    """A TCP relay on 127.0.0.1 to a real server; :meth:`cut` drops every connection and
    refuses new ones, as a database that goes away would."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept() and stops listening
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_a_reconnect_that_fails_reports_the_database_error(mysql_url):
    """The database is gone for good: the caller gets its OperationalError, and leaving the
    connection context works (it was an IndexError from an emptied context stack)."""
    proxy = _Proxy(("127.0.0.1", 3306))
    init_database(mysql_url.replace("127.0.0.1:3306", f"127.0.0.1:{proxy.port}"))
    try:
        with db.connection_context():
            assert Tenant.select().count() >= 0
            proxy.cut()
            with pytest.raises(OperationalError):
                Tenant.select().count()
    finally:
        db.obj.close_all()


def _immutable(path, on: bool) -> None:
    subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True, capture_output=True)


@pytest.fixture
def sqlite_file(tmp_path):
    """A SQLite file that :func:`_immutable` can make unwritable even for root."""
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr")
    path = tmp_path / "ac.db"
    init_database(f"sqlite:///{path}")
    db.obj.close_all()
    try:
        _immutable(path, True)
    except subprocess.CalledProcessError:
        pytest.skip("this file system has no immutable flag")
    _immutable(path, False)
    yield path
    _immutable(path, False)


def test_a_server_on_a_read_only_sqlite_file_fails_at_start(sqlite_file):
    _immutable(sqlite_file, True)
    with pytest.raises(OperationalError, match="cannot be written"):
        init_database(f"sqlite:///{sqlite_file}")


def test_writes_work_again_as_soon_as_the_sqlite_file_is_writable(sqlite_file, started_apps):
    # No parse thread: none is in the middle of a query when close_all below closes every connection.
    app = create_app(
        {
            "DATABASE_URL": f"sqlite:///{sqlite_file}",
            "SWEEP_INTERVAL_SECONDS": 0,
            "DATASETS": {"parse_threads": 0},
        }
    )
    started_apps.append(app)
    api = Api(app, make_token(app))
    assert api.post("/agents", json={"title": "before", "dsl": echo_dsl()}).status_code == 200
    _immutable(sqlite_file, True)
    db.obj.close_all()  # connections opened from now on are read-only
    refused = api.post("/agents", json={"title": "during", "dsl": echo_dsl()})
    assert refused.status_code == 503 and refused.headers["Retry-After"], refused.json
    assert "cannot be reached" in refused.json["message"] and str(sqlite_file) not in refused.json["message"]
    _immutable(sqlite_file, False)
    assert api.post("/agents", json={"title": "after", "dsl": echo_dsl()}).status_code == 200


def test_a_process_has_the_sqlite_wal_checkpointed_in_the_background(tmp_path):
    """Every ``checkpoint_every`` write transactions of a process, a thread of its own
    copies the WAL into the database file (not the commit that filled it, as SQLite would)."""
    path = tmp_path / "ac.db"
    init_database(f"sqlite:///{path}")
    database = db.obj
    try:
        database.checkpoint_every, database._commits = 3, 0
        before = path.stat().st_size
        for i in range(3):
            if i == 2:
                assert _CHECKPOINTER.wait_idle(10)
                assert path.stat().st_size == before  # the WAL holds the writes so far
            with db.connection_context(), write_transaction():
                MessageLog.create(session_id="s", role="user", content=str(i) * 200_000)
        assert _CHECKPOINTER.wait_idle(10)
        assert path.stat().st_size >= before + 600_000
    finally:
        database.close_all()


def test_under_steady_writes_the_sqlite_wal_starts_over_after_each_checkpoint(tmp_path):
    """With ``synchronous=full`` (each commit syncs the WAL), commits keep landing while
    the background checkpoint copies the WAL (two threads writing without a pause): the
    WAL file is started over all the same, so it stays the size of a few checkpoints'
    writes instead of growing with every commit (each commit's sync then writing the
    file's new size too)."""
    path = tmp_path / "ac.db"
    init_database(f"sqlite:///{path}?synchronous=full")
    database = db.obj
    commits, each = 800, "x" * 12_000  # 9.6 MB of rows (~6 WAL pages a commit, ~21 MB)
    largest = 0

    def write(n: int) -> None:
        nonlocal largest
        for i in range(n):
            with db.connection_context(), write_transaction():
                MessageLog.create(session_id="s", role="user", content=f"{i}{each}")
            largest = max(largest, os.path.getsize(f"{path}-wal"))

    try:
        database.checkpoint_every, database._commits = 10, 0
        threads = [threading.Thread(target=write, args=(commits // 2,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert _CHECKPOINTER.wait_idle(10)
        assert MessageLog.select().count() == commits
        # Every commit kept in the WAL is ~21 MB; started over after each checkpoint
        # (asked every 10 commits, more landing while it runs) it stayed under 3.1 MB.
        assert largest < commits * len(each), largest
    finally:
        database.close_all()


def test_with_requests_in_pairs_the_sqlite_wal_starts_over_under_synchronous_normal(tmp_path):
    """A client that sends its requests in pairs (a form's pause, then at once its
    resume) and then pauses: the checkpoint asked by the first commit of a pair runs
    while the second is under way, so that commit lands after it. The checkpoint thread
    looks again once the writes have paused and copies it, and the WAL file is started
    over all the same: it stays the size of a few checkpoints' writes instead of
    growing with every commit until SQLite's own checkpoint at 10,000 pages."""
    path = tmp_path / "ac.db"
    init_database(f"sqlite:///{path}?synchronous=normal")
    database = db.obj
    pairs, each = 40, "x" * 40_000  # ~10 WAL pages a commit, 3.2 MB in all
    largest = 0

    def write(i: int, work: float = 0.0) -> None:
        with db.connection_context(), write_transaction():
            time.sleep(work)  # the turn's work, its transaction begun
            MessageLog.create(session_id="s", role="user", content=f"{i}{each}")

    try:
        with db.connection_context():  # the WAL emptied of the tables' making
            db.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        # Asked every 10 commits, always by the first of a pair (the 9th commit from here).
        database.checkpoint_every, database._commits = 10, 1
        for i in range(pairs):
            write(2 * i)
            write(2 * i + 1, 0.005)  # the checkpoint asked by the first runs meanwhile
            largest = max(largest, os.path.getsize(f"{path}-wal"))
            time.sleep(0.05)  # the client reads the answer
        assert _CHECKPOINTER.wait_idle(10)
        assert MessageLog.select().count() == 2 * pairs
        # Never started over, the WAL would hold every commit: 3.2 MB.
        assert largest < pairs * len(each), largest
    finally:
        database.close_all()


def test_a_forked_worker_can_write_while_another_thread_of_its_parent_holds_the_write_lock(tmp_path):
    """gunicorn forks its workers from a process whose checkpoint thread (or any other
    writer thread) may hold a database's write lock at that moment: the worker's copy of
    the lock is free (that thread is not in the worker to let it go), and it writes."""
    path = tmp_path / "ac.db"
    init_database(f"sqlite:///{path}")
    database = db.obj
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with database.write_lock:
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the worker: write, and say so by its exit status
            code = 1
            try:
                if database.write_lock.acquire(timeout=5):
                    database.write_lock.release()
                    code = 0
            finally:
                os._exit(code)
        # The parent's holder still has the file lock too: let it go so the child's
        # flock (another open file) can be had, then see the child write.
        done.set()
        holder.join(10)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        done.set()
        holder.join(10)
        database.close_all()


def test_a_sqlite_url_may_ask_for_each_commit_to_be_synced(tmp_path):
    """``?synchronous=full`` (or ``extra``) makes each commit sync the WAL; ``normal`` is
    the default; another option or value is refused, naming it."""
    for query, level in (
        ("", 1),
        ("?synchronous=full", 2),
        ("?synchronous=EXTRA", 3),
        ("?synchronous=normal", 1),
    ):
        init_database(f"sqlite:///{tmp_path / 'ac.db'}{query}")
        try:
            with db.connection_context():
                assert db.execute_sql("PRAGMA synchronous").fetchone()[0] == level, query
        finally:
            db.obj.close_all()
    with pytest.raises(ValueError, match="synchronous='off' is not one of normal, full, extra"):
        init_database(f"sqlite:///{tmp_path / 'ac.db'}?synchronous=off")
    with pytest.raises(ValueError, match="option 'journal_mode' is not known for SQLite"):
        init_database(f"sqlite:///{tmp_path / 'ac.db'}?journal_mode=delete")


def test_sqlite_stores_none_booleans_and_bytes_as_null_integers_and_blobs(tmp_path):
    """The adapters api.db registers for them (a shortcut) store what sqlite3 stores
    without them: NULL, 1 and 0, the same bytes as a BLOB; a bytes subclass as before."""

    class Raw(bytes):
        pass

    init_database(f"sqlite:///{tmp_path / 'ac.db'}")
    try:
        with db.connection_context():
            db.execute_sql("CREATE TABLE kinds (v)")
            values = [None, True, False, b"", b"\x00\xff abc", Raw(b"raw"), 7, "text"]
            for value in values:
                db.execute_sql("INSERT INTO kinds (v) VALUES (?)", (value,))
            rows = db.execute_sql("SELECT v, typeof(v) FROM kinds ORDER BY rowid").fetchall()
    finally:
        db.obj.close_all()
    assert rows == [
        (None, "null"),
        (1, "integer"),
        (0, "integer"),
        (b"", "blob"),
        (b"\x00\xff abc", "blob"),
        (b"raw", "blob"),
        (7, "integer"),
        ("text", "text"),
    ]


def _checkpointed_write(path, content: str) -> None:
    """A write transaction on the database at ``path`` that has its WAL checkpointed."""
    init_database(f"sqlite:///{path}")
    database = db.obj
    database.checkpoint_every, database._commits = 1, 0
    with db.connection_context(), write_transaction():
        MessageLog.create(session_id="s", role="user", content=content)
    assert _CHECKPOINTER.wait_idle(10)


def test_the_wal_of_a_sqlite_file_made_anew_at_the_same_path_is_checkpointed(tmp_path):
    """The checkpoint thread keeps its connection to a database between checkpoints; a
    file made anew where the old one was is checkpointed all the same (not the old one's
    inode), and once the database is closed nothing of it stays open: its WAL is gone."""
    path = tmp_path / "ac.db"
    try:
        _checkpointed_write(path, "a" * 300_000)
        assert path.stat().st_size >= 300_000  # copied into the file
        for name in ("ac.db", "ac.db-wal", "ac.db-shm"):  # as another program might
            (tmp_path / name).unlink()
        _checkpointed_write(path, "b" * 300_000)
        with open(path, "rb") as fh:
            assert b"b" * 1000 in fh.read()  # the new file's WAL was copied into it
    finally:
        db.obj.close_all()
    assert not (tmp_path / "ac.db-wal").exists()  # the last connection took it away


def test_a_mysql_connection_parses_the_columns_of_a_result_once(mysql_url):
    """The description of a result's columns is parsed once per connection: the same
    statement again reads the same names and values, another statement its own."""
    init_database(mysql_url)
    try:
        with db.connection_context():
            conn = db.connection()
            for _ in range(2):
                cur = db.execute_sql("SELECT 1 AS n, %s AS t, CAST('x' AS BINARY) AS b, NULL AS z", ("é 𝄞",))
                assert cur.fetchall() == ((1, "é 𝄞", b"x", None),)
                assert [d[0] for d in cur.description] == ["n", "t", "b", "z"]
            known = len(conn.known_results)
            cur = db.execute_sql("SELECT %s AS m, %s AS f", (2, 0.5))
            assert cur.fetchall() == ((2, 0.5),) and [d[0] for d in cur.description] == ["m", "f"]
            assert len(conn.known_results) == known + 1
    finally:
        db.obj.close_all()


def test_a_mysql_connection_reads_rows_as_pymysql_does(mysql_url):
    """Rows of values of every length (NULL, empty, under 251 bytes, with a two- and a
    three-byte length), of several types, and many rows, read as pymysql reads them."""
    init_database(mysql_url)
    sql = (
        "SELECT seq, IF(seq %% 3 = 0, NULL, REPEAT(%s, seq * seq * 7)) AS t, CAST(seq AS DECIMAL(6, 2)) AS d, "
        "seq / 4 AS q, DATE_ADD('2026-01-01 10:00:00', INTERVAL seq DAY) AS w, '' AS e, "
        "CAST(REPEAT('b', seq) AS BINARY) AS b, JSON_OBJECT('k', seq) AS j FROM seq_0_to_120"
    )
    server, name = mysql_url.removeprefix("mysql://root@").split("/")
    host, port = server.split(":")
    plain = pymysql.connect(host=host, port=int(port), user="root", database=name, charset="utf8mb4")
    try:
        with plain.cursor() as cur:
            cur.execute(sql, ("é𝄞",))
            expected, description = cur.fetchall(), cur.description
        with db.connection_context():
            for _ in range(2):
                cur = db.execute_sql(sql, ("é𝄞",))
                assert cur.fetchall() == expected
                assert cur.description == description
        assert max(len(row[1] or "") for row in expected) > 70000  # a three-byte length
    finally:
        plain.close()
        db.obj.close_all()


def test_a_mysql_connection_returned_inside_a_transaction_does_not_carry_it_on(mysql_url):
    """A connection checked in with a transaction still open (its owner failed before
    COMMIT or ROLLBACK) is rolled back: the next user of that pooled connection does not
    commit the unfinished writes, and one checked in with none open is reused as it is."""
    init_database(mysql_url)
    try:
        with db.connection_context():
            first = db.connection()
            db.execute_sql("BEGIN")
            Tenant.create(name="half-done")
        with db.connection_context(), write_transaction():
            assert db.connection() is first  # the same pooled connection
            Tenant.create(name="done")
        with db.connection_context():
            assert db.connection() is first
            names = {t.name for t in Tenant.select()}
        assert "done" in names
        assert "half-done" not in names
    finally:
        db.obj.close_all()


ESCAPED = "quote ' double \" backslash \\ \\' newline \n return \r nul \0 ctrl-z \x1a é 𝄞 \\n"


def test_text_with_every_character_a_string_literal_escapes_is_stored_as_sent(api: Api):
    """What a turn writes (its snapshot, its messages) comes back exactly: on MySQL the
    driver sends it as an escaped string literal (api.db.database.escape_mysql_text), on
    Postgres text holding NUL is encoded (api.db.pgtext)."""
    text = ESCAPED
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    reply = api.ask(agent_id, session_id, text)
    assert reply.status_code == 200 and reply.json["data"]["data"]["content"] == f"echo: {text}"
    session = api.session(agent_id, session_id, dsl="true")
    assert [m["content"] for m in session["message"]][-2:] == [text, f"echo: {text}"]
    assert session["dsl"]["history"][-2:] == [["user", text], ["assistant", f"echo: {text}"]]


@pytest.mark.parametrize("backslash_escapes", [True, False])
def test_a_text_given_as_utf8_is_stored_as_the_text_on_mysql(mysql_url, backslash_escapes: bool):
    """A text a statement takes as UTF-8 bytes (prepared.mark_text) is stored as the text,
    sent with the transaction's next statement or at once, and with the server's
    backslash escapes off as well (then a quote is doubled instead)."""
    from api.db.prepared import Prepared, mark_text

    init_database(mysql_url)
    rename = Prepared(lambda m: Tenant.update(name=mark_text("name")).where(Tenant.id == m("id")))
    try:
        with db.connection_context():
            Tenant.delete().execute()
            Tenant.insert_many([{"id": "sent", "name": "a"}, {"id": "run", "name": "b"}]).execute()
            if not backslash_escapes:
                db.execute_sql("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
            with write_transaction():
                sent = rename.send(id="sent", name=("sent " + ESCAPED).encode())
                assert sent.rowcount == 1
            assert rename.execute(id="run", name=("run " + ESCAPED).encode()) == 1  # outside a transaction
            assert {t.id: t.name for t in Tenant.select()} == {
                "sent": "sent " + ESCAPED,
                "run": "run " + ESCAPED,
            }
    finally:
        db.obj.close_all()


_SPECIAL = st.sampled_from(list("ab\\\n\r\0\x1a\"'é𝄞 "))
_ESCAPABLE = st.text(alphabet=_SPECIAL | st.characters(), max_size=40)


@given(_ESCAPABLE)
def test_the_mysql_escape_is_pymysqls_but_for_the_double_quote(text: str):
    """A double quote needs no escape in a literal in single quotes, the only kind written."""
    assert escape_mysql_text(text) == escape_string(text).replace('\\"', '"')


@given(st.text(alphabet=_SPECIAL | st.characters(exclude_categories=("Cs",)), max_size=40))  # UTF-8 encodable
@settings(max_examples=60, deadline=None)
def test_a_mysql_literal_escaped_so_reads_back_as_the_text(mysql_url, text: str):
    server, name = mysql_url.removeprefix("mysql://root@").split("/")
    host, port = server.split(":")
    conn = pymysql.connect(host=host, port=int(port), user="root", database=name, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT '{escape_mysql_text(text)}'")
            assert cur.fetchone()[0] == text
    finally:
        conn.close()


# Texts that can be stored: a lone UTF-16 surrogate is refused where text comes in
# (api.http.json_body) and cannot be sent as UTF-8, by us or by pymysql.
_STORABLE = st.text(alphabet=_SPECIAL | st.characters(exclude_categories=("Cs",)), max_size=40)
_BOUND = st.one_of(
    _STORABLE,
    st.builds(lambda t, n: t * n, _STORABLE, st.integers(1, 40)),  # longer texts (a snapshot's)
    st.integers(-(2**63), 2**64 - 1),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
)


@given(st.lists(_BOUND, max_size=8))
@settings(max_examples=80, deadline=None)
def test_a_mysql_statement_is_bound_with_each_value_read_back_as_given(mysql_url, values: list):
    """A statement's values bound by the connection (the deferred writes': Connection.bind)
    are the literals pymysql's cursor writes (but for the double quote, see above), texts
    given as UTF-8 too, and the server reads each back as the value (a bool as 1 or 0)."""
    from api.db.database import Utf8Text

    init_database(mysql_url)
    try:
        with db.connection_context():
            conn = db.connection()
            values = [v.encode() if isinstance(v, str) and i % 2 else v for i, v in enumerate(values)]
            params = [Utf8Text(v) if isinstance(v, bytes) else v for v in values]
            sql = "SELECT " + ", ".join(["%s"] * len(params)) if params else "SELECT 0"
            bound = conn.bind(sql, params)
            literals = [conn.escape(v) for v in params]
            assert bound == (sql % tuple(literals)).encode("utf-8", "surrogateescape")
            with conn.cursor() as cur:  # no values: the statement is sent as it is
                cur.execute(bound.decode())
                row = cur.fetchone()
            texts = [v.decode() if isinstance(v, bytes) else v for v in values]
            assert list(row) == texts if texts else [0]
    finally:
        db.obj.close_all()


def test_writes_sent_ahead_in_a_transaction_begun_by_begin_never_commit_alone(mysql_url):
    """A transaction begun by BEGIN on a connection in autocommit mode (Galera's, or one
    with an isolation level) ends when one of its statements is a deadlock's victim; a
    write sent behind that statement would then run and commit on its own. So there
    ``Prepared.send`` runs each write at once: the deadlock is raised by the write it hit
    and nothing behind it reaches the server."""
    insert = _INSERT_TENANT
    rename = Prepared(lambda m: Tenant.update(name=m("new")).where(Tenant.id == m("id")))
    init_database(mysql_url)
    server, name = mysql_url.removeprefix("mysql://root@").split("/")
    host, port = server.split(":")
    other = pymysql.connect(host=host, port=int(port), user="root", database=name, autocommit=True)
    try:
        with db.connection_context():
            Tenant.delete().execute()
            Tenant.insert_many([{"id": "x", "name": "x"}, {"id": "y", "name": "y"}]).execute()
        with other.cursor() as cur:  # the other transaction: y locked, and heavier (it wins)
            cur.execute("CREATE TABLE IF NOT EXISTS weight (id INT PRIMARY KEY)")
            cur.execute("DELETE FROM weight")
            cur.execute("BEGIN")
            cur.execute("UPDATE tenant SET name = 'y by other' WHERE id = 'y'")
            cur.execute("INSERT INTO weight SELECT seq FROM seq_1_to_2000")

        def close_the_cycle() -> None:
            time.sleep(0.5)
            with other.cursor() as cur:
                cur.execute("UPDATE tenant SET name = 'x by other' WHERE id = 'x'")

        closer = threading.Thread(target=close_the_cycle)
        with db.connection_context():
            with pytest.raises(OperationalError, match="1213|Deadlock"):
                with db.atomic(isolation_level="REPEATABLE READ"):
                    rename.execute(id="x", new="x by us")
                    closer.start()
                    rename.send(id="y", new="y by us")  # waits for the other, then is its victim
                    insert.send(id="z", name="behind it")
                    Tenant.select().count()
            closer.join()
            other.rollback()
            assert sorted(t.name for t in Tenant.select()) == ["x", "y"]
            Tenant.delete().execute()
    finally:
        other.close()
        db.obj.close_all()


def _count_up(url: str, times: int) -> None:
    init_database(url)
    with db.connection_context():
        for _ in range(times):
            with write_transaction():
                row = Tenant.get(Tenant.id == "counter")
                Tenant.update(name=str(int(row.name) + 1)).where(Tenant.id == "counter").execute()
    db.obj.close_all()


def test_writers_of_several_processes_line_up_on_one_sqlite_database(tmp_path):
    """The workers of a server (processes) queue for SQLite's write lock on a lock file
    beside the database (a waiter is woken when it is let go, where SQLite's own lock
    makes it sleep 1 to 100 ms between looks): every read-modify-write of each counts."""
    import multiprocessing

    url = f"sqlite:///{tmp_path / 'agentcanvas.db'}"
    init_database(url)
    with db.connection_context():
        Tenant.create(id="counter", name="0")
    db.obj.close_all()
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_count_up, args=(url, 50)) for _ in range(3)]
    for worker in workers:
        worker.start()
    _count_up(url, 50)
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    init_database(url)
    with db.connection_context():
        assert Tenant.get(Tenant.id == "counter").name == "200"
    db.obj.close_all()
    assert (tmp_path / "agentcanvas.db-writer").exists()


def test_a_thread_inside_a_connection_context_while_the_handle_moves_leaves_it_cleanly(tmp_path):
    # A second app built in one process points the models' handle at its database while
    # a parse thread of the first is inside a connection context (seen in a CI run).
    init_database(f"sqlite:///{tmp_path / 'first.db'}")
    first = db.obj
    inside, leave, errors = threading.Event(), threading.Event(), []

    def worker() -> None:
        try:
            with db.connection_context():
                inside.set()
                leave.wait(10)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(10)
    init_database(f"sqlite:///{tmp_path / 'second.db'}")
    leave.set()
    thread.join(10)
    assert errors == []
    assert db.obj is not first
    with first.connection_context():  # the first pool gave the thread's connection back
        assert first.execute_sql("SELECT 1").fetchone() == (1,)


def _sqlite_pool(tmp_path, max_connections: int):
    """A SQLite database of ``max_connections`` that raises at once when they are all in use."""
    database = open_database(f"sqlite:///{tmp_path / 'pool.db'}", max_connections=max_connections)
    database._wait_timeout = None  # no waiting for a connection: a test would only hang
    return database


def _open_files(path) -> int:
    """The descriptors of this process open on ``path``."""
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == str(path))


def _query_in_threads(database, count: int, stay: threading.Event | None = None) -> list:
    """Run a query in each of ``count`` threads (closing the connection after); with
    ``stay``, the threads stay alive until it is set. Returns the errors."""
    errors, done = [], threading.Barrier(count + 1)

    def work() -> None:
        try:
            with database.connection_context():
                database.execute_sql("SELECT 1").fetchone()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        done.wait(10)
        if stay is not None:
            stay.wait(10)

    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    done.wait(10)
    if stay is None:
        for thread in threads:
            thread.join(10)
    return errors


def test_a_sqlite_connection_a_thread_closed_is_no_less_the_pools(tmp_path):
    """The connection a thread closed is the next one handed out, to it or to another
    thread (its page cache is the freshest), yet no thread is refused one meanwhile,
    and one that ended leaves its connection to the others."""
    database = _sqlite_pool(tmp_path, max_connections=2)
    path = (tmp_path / "pool.db").resolve()
    try:
        with database.connection_context():
            first = database.connection()
        with database.connection_context():
            assert database.connection() is first  # the same thread: its own again
        for _ in range(4):  # one thread after another: each takes the one the last closed
            thread = threading.Thread(target=_query_in_threads, args=(database, 1))
            thread.start()
            thread.join(10)
        assert _open_files(path) == 1
        with database.connection_context():
            assert database.connection() is first
        stay = threading.Event()
        assert _query_in_threads(database, 2, stay) == []  # both alive, each holding one unused
        try:
            with database.connection_context():  # the pool has none left but those
                assert database.execute_sql("SELECT 2").fetchone() == (2,)
        finally:
            stay.set()
        for _ in range(5):  # threads that end: 10 threads, 2 connections
            assert _query_in_threads(database, 2) == []
    finally:
        database.close_all()


def test_closing_a_sqlite_pools_connections_closes_those_threads_keep(tmp_path):
    database = _sqlite_pool(tmp_path, max_connections=4)
    path = (tmp_path / "pool.db").resolve()
    try:
        stay = threading.Event()
        assert _query_in_threads(database, 2, stay) == []
        with database.connection_context():
            database.execute_sql("SELECT 1")
        assert _open_files(path) >= 1
        database.close_idle()  # as pointing the models at another database does
        assert _open_files(path) == 0
        assert _query_in_threads(database, 2) == []
        with database.connection_context():
            database.execute_sql("SELECT 1")
        database.close_all()
        assert _open_files(path) == 0
        with database.connection_context():  # this thread's, closed by close_all: a new one
            assert database.execute_sql("SELECT 3").fetchone() == (3,)
        stay.set()
    finally:
        database.close_all()


def _on_a_connection_of_its_own(database, work) -> tuple[threading.Thread, dict]:  # noqa: ANN001
    """Start ``work(seen)`` in a thread on a connection it checks out of ``database``:
    ``seen["connection"]``, and ``seen["error"]`` for what it raises."""
    seen: dict = {}

    def run() -> None:
        try:
            with database.connection_context():
                seen["connection"] = database.connection()
                work(seen)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            seen["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, seen


def test_close_all_leaves_another_threads_connection_to_it_until_given_back(tmp_path):
    """close_all while another thread has a connection checked out: that thread's work
    on it goes on, and the connection is closed when the thread gives it back. peewee's
    close_all closed it under the thread, and one whose statement was running then
    crashed the process (CPython's driver read the closed handle: a segfault in
    sqlite3_last_insert_rowid, seen when the benchmark's close_all met a parse
    thread's poll)."""
    database = _sqlite_pool(tmp_path, max_connections=4)
    checked_out, closed_all = threading.Event(), threading.Event()

    def work(seen: dict) -> None:
        database.execute_sql("CREATE TABLE kept (x INTEGER)")
        checked_out.set()
        closed_all.wait(10)
        database.execute_sql("INSERT INTO kept VALUES (1)")
        seen["rows"] = database.execute_sql("SELECT x FROM kept").fetchall()

    thread, seen = _on_a_connection_of_its_own(database, work)
    try:
        assert checked_out.wait(10)
        with database.connection_context():  # this thread's, parked
            own = database.connection()
            database.execute_sql("SELECT 1")
        database.close_all()
        assert database._is_closed(own)
        assert not database._is_closed(seen["connection"])
    finally:
        closed_all.set()
        thread.join(10)
    other = seen.pop("connection")
    assert seen == {"rows": [(1,)]}
    with database.connection_context():  # given back, parked: closed, not handed out again
        assert database.connection() not in (own, other)
        assert database.execute_sql("SELECT count(*) FROM kept").fetchone() == (1,)
    assert database._is_closed(other)
    database.close_all()
    assert _open_files((tmp_path / "pool.db").resolve()) == 0


@pytest.mark.parametrize("server", ["mysql", "postgres"])
def test_close_all_lets_a_server_connection_another_thread_uses_finish(server, request):
    """As SQLite's: close_all while another thread runs a statement on its connection (a
    one-second sleep on the server) leaves it be; the thread's statement and the next
    one answer, and the connection is closed when the thread gives it back. peewee's
    close_all closed it under the thread: on MySQL the running statement failed
    ('connection socket closed'); psycopg makes the close wait for the statement."""
    database = open_database(request.getfixturevalue(f"{server}_url"), max_connections=4)
    ensure_server_database(database)  # the test process's throwaway database
    sleep = "SELECT SLEEP(1)" if server == "mysql" else "SELECT pg_sleep(1)"
    running = threading.Event()

    def work(seen: dict) -> None:
        running.set()
        database.execute_sql(sleep).fetchall()
        seen["next"] = database.execute_sql("SELECT 7").fetchone()

    thread, seen = _on_a_connection_of_its_own(database, work)
    try:
        assert running.wait(10), seen
        time.sleep(0.2)  # the sleep is on the server now
        with database.connection_context():
            own = database.connection()
            database.execute_sql("SELECT 1")
        database.close_all()
        assert database._is_closed(own)
    finally:
        thread.join(10)
    used = seen.pop("connection")
    assert seen == {"next": (7,)}
    assert database._is_closed(used)  # given back after close_all: closed, not pooled
    with database.connection_context():
        assert database.connection() not in (own, used)
        assert database.execute_sql("SELECT 3").fetchone() == (3,)
    database.close_all()


def test_a_stale_sqlite_connection_a_thread_kept_is_replaced(tmp_path):
    database = _sqlite_pool(tmp_path, max_connections=2)
    try:
        with database.connection_context():
            first = database.connection()
        database._stale_timeout = 0.001
        time.sleep(0.01)
        with database.connection_context():
            assert database.connection() is not first
            assert database.execute_sql("SELECT 1").fetchone() == (1,)
    finally:
        database.close_all()


def _enter_when_told(lock, go, entered) -> None:
    go.wait(10)
    with lock:
        entered.set()


def test_a_forked_process_waits_for_the_sqlite_writer_lock_its_parent_holds(tmp_path):
    """A worker forked after its parent used the writer lock takes it on a descriptor of its
    own: it waits while the parent holds it (one shared across the fork never would)."""
    import multiprocessing

    init_database(f"sqlite:///{tmp_path / 'agentcanvas.db'}")
    lock = db.obj.write_lock
    with lock:
        pass  # the parent's descriptor is open
    context = multiprocessing.get_context("fork")
    go, entered = context.Event(), context.Event()
    child = context.Process(target=_enter_when_told, args=(lock, go, entered))
    child.start()
    try:
        with lock:
            go.set()
            assert not entered.wait(1)  # the parent holds it
        assert entered.wait(10)
    finally:
        child.join(10)
        db.obj.close_all()
    assert child.exitcode == 0


def test_a_statement_given_its_values_as_one_dict_leaves_the_dict_as_it_was(tmp_path):
    """``Prepared.execute(values)``: the turn hands one dict to two statements, so the values
    a statement fixed when its SQL was built must not be added to the caller's dict."""
    from api.db.prepared import Prepared

    init_database(f"sqlite:///{tmp_path}/one-dict.db")
    insert = Prepared(lambda m: Tenant.insert(id=m("id"), name=m("name"), create_time=7))
    rename = Prepared(lambda m: Tenant.update(name=m("name"), create_time=9).where(Tenant.id == m("id")))
    values = {"id": "t1", "name": "first"}
    try:
        with db.connection_context():
            assert insert.execute(values) == 1
            assert values == {"id": "t1", "name": "first"}
            assert Tenant.get_by_id("t1").create_time == 7
            values["name"] = "renamed"
            assert rename.execute(values) == 1
            assert values == {"id": "t1", "name": "renamed"}
            row = Tenant.get_by_id("t1")
            assert (row.name, row.create_time) == ("renamed", 9)
    finally:
        db.obj.close_all()
