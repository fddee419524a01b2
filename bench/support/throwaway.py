"""Throwaway databases on the local MariaDB and Postgres, for the bench scripts.

Each function makes a new empty database ``agentcanvas_bench_<random>`` and returns its
URL (as ``AGENTCANVAS_DATABASE_URL`` takes it) and a function that drops it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

MYSQL = {"host": "127.0.0.1", "port": 3306, "user": "root"}
POSTGRES = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


def mysql_database() -> tuple[str, Callable[[], None]]:
    import pymysql

    name = f"agentcanvas_bench_{uuid.uuid4().hex[:8]}"
    conn = pymysql.connect(**MYSQL)
    with conn.cursor() as c:
        c.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    conn.close()

    def drop() -> None:
        conn = pymysql.connect(**MYSQL)
        with conn.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()

    return f"mysql://root@127.0.0.1:3306/{name}", drop


def postgres_database() -> tuple[str, Callable[[], None]]:
    import psycopg

    name = f"agentcanvas_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **POSTGRES) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(dbname="postgres", autocommit=True, **POSTGRES) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"postgresql://postgres@127.0.0.1:5432/{name}", drop
