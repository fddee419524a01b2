"""ExeSQL against this machine's real MariaDB and PostgreSQL (a throwaway database
each) and SQLite: RAGFlow's params and outputs, read-only by default, row and time
caps, the address rules, and the password kept secret."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid

import psycopg
import pymysql
import pytest

from agent.canvas import Canvas
from tests.agent.dsl_helpers import final, make_dsl, node, outputs_of, run

MARIADB = {"host": "127.0.0.1", "port": 3306, "user": "root"}
POSTGRES = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
ROWS = [(1, "Ann", 41.5, "2024-01-02"), (2, "Bob", 30.25, "2024-03-04"), (3, "Cy", None, "2024-05-06")]


@pytest.fixture(scope="module")
def mariadb():
    name = f"exesql_{uuid.uuid4().hex[:10]}"
    conn = pymysql.connect(**MARIADB, autocommit=True)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")
        cur.execute(
            f"CREATE TABLE `{name}`.people (id INT PRIMARY KEY, name VARCHAR(20), score DECIMAL(6,2), born DATE)"
        )
        cur.executemany(f"INSERT INTO `{name}`.people VALUES (%s, %s, %s, %s)", ROWS)
    yield name
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE `{name}`")
    conn.close()


@pytest.fixture(scope="module")
def postgres():
    name = f"exesql_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(**POSTGRES, dbname="postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(**POSTGRES, dbname=name, autocommit=True) as conn:
        conn.execute("CREATE TABLE people (id INT PRIMARY KEY, name TEXT, score NUMERIC(6,2), born DATE)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO people VALUES (%s, %s, %s, %s)", ROWS)
    yield name
    with psycopg.connect(**POSTGRES, dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def sql_canvas(params: dict, **settings) -> Canvas:
    dsl = make_dsl(
        node("ExeSQL:Q", "ExeSQL", {"sql": "{sys.query}", **params}),
        node("Message:Out", "Message", {"content": ["{ExeSQL:Q@formalized_content}"]}),
    )
    return Canvas(dsl, services={"tools": {"exesql": {"allow_hosts": ["127.0.0.1"], **settings}}})


def maria(database: str, **params) -> dict:
    return {
        "db_type": "mariadb",
        "host": "127.0.0.1",
        "port": 3306,
        "database": database,
        "username": "root",
        **params,
    }


def pg(database: str, **params) -> dict:
    return {
        "db_type": "postgres",
        "host": "127.0.0.1",
        "port": 5432,
        "database": database,
        "username": "postgres",
        **params,
    }


def servers(mariadb, postgres):
    return [maria(mariadb), pg(postgres)]


@pytest.mark.parametrize("which", [0, 1], ids=["mariadb", "postgres"])
def test_rows_come_back_as_json_and_markdown_per_statement(mariadb, postgres, which):
    params = servers(mariadb, postgres)[which]
    sql = "```sql\nSELECT id, name, score, born FROM people ORDER BY id;\nSELECT name FROM people WHERE id = 99 [ID:3];\nSELECT nope FROM people;\nSELECT COUNT(*) AS n FROM people\n```"
    events = run(sql_canvas(params), sql)
    assert final(events)["status"] == "succeeded", final(events)
    out = outputs_of(events, "ExeSQL:Q")
    people, empty, failed, count = out["json"]
    assert people == [
        {"id": 1, "name": "Ann", "score": 41.5, "born": "2024-01-02"},
        {"id": 2, "name": "Bob", "score": 30.25, "born": "2024-03-04"},
        {"id": 3, "name": "Cy", "score": None, "born": "2024-05-06"},
    ]
    assert empty == {"content": "No record in the database!"}
    assert failed["content"].startswith("SQL Execution Failed: SELECT nope FROM people\n")
    assert count == [{"n": 3}]
    tables = out["formalized_content"].split("\n\n")
    assert tables[0].splitlines()[:3] == [
        "| id | name | score | born |",
        "|:---|:---|:---|:---|",
        "| 1 | Ann | 41.5 | 2024-01-02 |",
    ]


@pytest.mark.parametrize("which", [0, 1], ids=["mariadb", "postgres"])
def test_read_only_unless_the_author_says_otherwise(mariadb, postgres, which):
    params = servers(mariadb, postgres)[which]
    events = run(
        sql_canvas(params),
        "INSERT INTO people VALUES (9, 'Eve', 1, '2024-01-01'); SELECT COUNT(*) AS n FROM people",
    )
    refused, count = outputs_of(events, "ExeSQL:Q")["json"]
    assert refused["content"].startswith("SQL Execution Failed: INSERT INTO people")
    assert "read" in refused["content"].lower() and "only" in refused["content"].lower()
    assert count == [{"n": 3}]

    writable = {**params, "read_only": False}
    run(sql_canvas(writable), "INSERT INTO people VALUES (9, 'Eve', 1, '2024-01-01')")
    events = run(sql_canvas(params), "SELECT name FROM people WHERE id = 9; DELETE FROM people WHERE id = 9")
    found, refused = outputs_of(events, "ExeSQL:Q")["json"]
    assert found == [{"name": "Eve"}] and refused["content"].startswith("SQL Execution Failed: DELETE")
    run(sql_canvas(writable), "DELETE FROM people WHERE id = 9")


def test_rows_are_capped_by_max_records_and_the_setting(mariadb):
    sql = "SELECT id FROM people ORDER BY id"
    assert outputs_of(run(sql_canvas(maria(mariadb, max_records=2)), sql), "ExeSQL:Q")["json"] == [
        [{"id": 1}, {"id": 2}]
    ]
    out = outputs_of(run(sql_canvas(maria(mariadb), max_records=1), sql), "ExeSQL:Q")["json"]
    assert out == [[{"id": 1}]]


@pytest.mark.parametrize(
    "which, slow",
    [(0, "SELECT BENCHMARK(10000000000, MD5('x'))"), (1, "SELECT pg_sleep(30)")],
    ids=["mariadb", "postgres"],
)
def test_a_long_statement_is_cancelled_on_the_server_at_the_timeout(mariadb, postgres, which, slow):
    params = {**servers(mariadb, postgres)[which], "timeout_seconds": 1}
    started = time.monotonic()
    done = final(run(sql_canvas(params), slow))
    assert done["status"] == "failed"
    assert "the statement ran longer than 1 s and was cancelled (timeout_seconds)" in done["error"]
    assert time.monotonic() - started < 5
    # The server is not left running it, and takes the next question at once.
    time.sleep(0.5)
    if which == 0:
        conn = pymysql.connect(**MARIADB)
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT BENCHMARK%'"
            )
            assert cur.fetchone()[0] == 0
        conn.close()
    else:
        with psycopg.connect(**POSTGRES, dbname="postgres") as conn:
            busy = conn.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%' AND state = 'active'"
            )
            assert busy.fetchone()[0] == 0
    assert outputs_of(run(sql_canvas(servers(mariadb, postgres)[which]), "SELECT 1 AS one"), "ExeSQL:Q")[
        "json"
    ] == [[{"one": 1}]]


def test_a_cancel_stops_a_running_statement(postgres):
    canvas = sql_canvas(pg(postgres, timeout_seconds=30))
    flag = threading.Event()
    canvas.cancel_check = flag.is_set
    threading.Timer(0.5, flag.set).start()
    started = time.monotonic()
    assert final(run(canvas, "SELECT pg_sleep(30)"))["status"] == "cancelled"
    assert time.monotonic() - started < 3


def test_the_database_address_follows_the_invoke_rules(mariadb):
    canvas = sql_canvas(maria(mariadb), allow_hosts=[])
    done = final(run(canvas, "SELECT 1"))
    assert done["status"] == "failed"
    assert (
        "refused to connect to '127.0.0.1'" in done["error"] and "tools.exesql.allow_hosts" in done["error"]
    )


def test_the_password_never_shows(mariadb, caplog):
    canvas = sql_canvas(maria(mariadb, username="nobody_here", password="s3cret-pw"))
    events = run(canvas, "SELECT 1")
    done = final(events)
    assert done["status"] == "failed" and "Database Connection Failed!" in done["error"]
    assert "s3cret-pw" not in json.dumps(events) and "s3cret-pw" not in caplog.text


def test_connection_fields_left_blank_come_from_the_settings(mariadb):
    blank = {"db_type": "mysql", "host": "", "database": "", "username": "", "password": "", "port": 3306}
    canvas = sql_canvas(blank, host="127.0.0.1", database=mariadb, username="root")
    assert outputs_of(run(canvas, "SELECT COUNT(*) AS n FROM people"), "ExeSQL:Q")["json"] == [[{"n": 3}]]
    done = final(run(sql_canvas(blank), "SELECT 1"))
    assert "host is empty; set it in the ExeSQL node or in tools.exesql.host" in done["error"]


def test_sqlite_files_only_under_the_configured_directories(tmp_path):
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (name TEXT, price REAL)")
        conn.execute("INSERT INTO items VALUES ('pen', 1.5)")
    params = {"db_type": "sqlite", "database": str(path)}
    done = final(run(sql_canvas(params), "SELECT * FROM items"))
    assert "is not under a directory of tools.exesql.sqlite_dirs" in done["error"]
    canvas = sql_canvas(params, sqlite_dirs=[str(tmp_path)])
    events = run(canvas, "SELECT * FROM items; DELETE FROM items")
    rows, refused = outputs_of(events, "ExeSQL:Q")["json"]
    assert rows == [{"name": "pen", "price": 1.5}] and "readonly" in refused["content"]
    escape = {"db_type": "sqlite", "database": str(tmp_path / ".." / "other.db")}
    assert "sqlite_dirs" in final(run(sql_canvas(escape, sqlite_dirs=[str(tmp_path)]), "SELECT 1"))["error"]
