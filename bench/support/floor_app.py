"""The floor of ``bench/http.py``: the least a durable turn over HTTP can cost.

A bare Flask app served by the same gunicorn settings as ``agentcanvas serve``
(:func:`api.cli.run_gunicorn`). Each ``POST /turn`` does one equivalent database
transaction with the same driver we use (sqlite3 / pymysql, no ORM): read the
session's snapshot row, parse it, append the exchange to its bounded history, write
it back where the version still matches, append two message rows, commit.
:class:`Store` is also the in-process floor of ``bench/turns.py``, there with one
or two commits per request (the second variant first takes a lease, as we do).

With ``--canvas`` (bench/http.py's **floor+canvas**) the same transaction runs a real
canvas in place of the history append (:func:`canvas_turn`): the snapshot loaded, the
request's question or form answers run, the canvas dumped and written back. No service
around it (no token, no cache of loaded canvases, no logs or metrics): a bare Flask
service running the canvas the plain way.

    python bench/support/floor_app.py --db URL --port P [--workers N] [--threads N] [--canvas]
    python bench/support/floor_app.py --db URL --seed SNAPSHOT_FILE --sessions N   # make the rows
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import argparse  # noqa: E402
import sqlite3  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from urllib.parse import urlparse  # noqa: E402

import orjson  # noqa: E402
from flask import Flask, jsonify, request  # noqa: E402

from agent.canvas import Canvas  # noqa: E402

SCHEMA = (
    "CREATE TABLE floor_session (id VARCHAR(32) PRIMARY KEY, snapshot LONGTEXT NOT NULL, version BIGINT NOT NULL, "
    "lease_owner VARCHAR(64), lease_expires BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE floor_message (id {autoid}, session_id VARCHAR(32) NOT NULL, role VARCHAR(16) NOT NULL, "
    "content LONGTEXT NOT NULL, create_time BIGINT NOT NULL)",
)


class Store:
    """One connection per thread to the database ``url`` names (sqlite:/// or mysql://)."""

    def __init__(self, url: str, synchronous: str = "normal"):
        self.synchronous = synchronous
        parsed = urlparse(url)
        self.sqlite = parsed.scheme == "sqlite"
        self.postgres = parsed.scheme.startswith("postgres")
        self.mark = "?" if self.sqlite else "%s"
        if self.sqlite:
            path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
            self.connect_args = {"path": path}
        else:
            self.connect_args = {
                "host": parsed.hostname or "127.0.0.1",
                "port": parsed.port or (5432 if self.postgres else 3306),
                "user": parsed.username or "root",
                "password": parsed.password or "",
                "database": parsed.path.lstrip("/"),
            }
        self._local = threading.local()

    def conn(self):  # noqa: ANN201 - a DB-API connection of either driver
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.sqlite:
                # As api.db.database opens SQLite: WAL, synchronous=NORMAL, a busy timeout.
                conn = sqlite3.connect(
                    self.connect_args["path"], isolation_level=None, check_same_thread=False, timeout=30
                )
                conn.execute("PRAGMA journal_mode=wal")
                conn.execute(f"PRAGMA synchronous={self.synchronous}")
                conn.execute("PRAGMA busy_timeout=30000")
            elif self.postgres:
                import psycopg

                args = dict(self.connect_args)
                conn = psycopg.connect(dbname=args.pop("database"), autocommit=False, **args)
            else:
                import pymysql
                from pymysql.constants import CLIENT

                conn = pymysql.connect(
                    charset="utf8mb4", autocommit=False, client_flag=CLIENT.FOUND_ROWS, **self.connect_args
                )
            self._local.conn = conn
        return conn

    def seed(self, snapshot: str, sessions: int) -> None:
        conn = self.conn()
        autoid = "INTEGER PRIMARY KEY" if self.sqlite else "BIGINT AUTO_INCREMENT PRIMARY KEY"
        if self.postgres:
            autoid = "BIGSERIAL PRIMARY KEY"
        cur = conn.cursor()
        for statement in SCHEMA:
            statement = statement.format(autoid=autoid)
            cur.execute(statement.replace("LONGTEXT", "TEXT") if self.postgres else statement)
        cur.executemany(
            f"INSERT INTO floor_session (id, snapshot, version) VALUES ({self.mark}, {self.mark}, 1)",
            [(f"s{i}", snapshot) for i in range(sessions)],
        )
        conn.commit()

    def turn(
        self,
        session_id: str,
        user: str,
        assistant: str,
        two_commits: bool = False,
        run: Callable[[str], tuple[str, str]] | None = None,
    ) -> int:
        """One request's transaction; returns the new version (0: busy or moved meanwhile).

        With ``two_commits`` it first commits a lease (a conditional UPDATE of the
        session row, as our claim does), then reads, writes and releases it. With
        ``run``, the snapshot's text goes through ``run(text)`` instead of the history
        append, inside the transaction: it returns the new text and the answer logged
        (``bench/turns.py``'s floor + canvas runs a real canvas there).
        """
        conn = self.conn()
        m = self.mark
        cur = conn.cursor()
        now = int(time.time() * 1000)
        if two_commits:
            cur.execute(
                f"UPDATE floor_session SET lease_owner={m}, lease_expires={m} "
                f"WHERE id={m} AND (lease_owner IS NULL OR lease_expires < {m})",
                ("floor", now + 30000, session_id, now),
            )
            conn.commit()
            if cur.rowcount != 1:
                return 0
        if self.sqlite:
            cur.execute("BEGIN IMMEDIATE")
        try:
            cur.execute(f"SELECT snapshot, version FROM floor_session WHERE id={m}", (session_id,))
            row = cur.fetchone()
            if row is None:
                conn.rollback()
                return -1
            version = row[1]
            if run is None:
                snapshot = orjson.loads(row[0])
                history = snapshot.setdefault("history", [])
                history.extend([["user", user], ["assistant", assistant]])
                del history[:-100]  # bounded, as our snapshot
                text = orjson.dumps(snapshot).decode()
            else:
                text, assistant = run(row[0])
            cur.execute(
                f"UPDATE floor_session SET snapshot={m}, version=version+1, lease_owner=NULL, lease_expires=0 "
                f"WHERE id={m} AND version={m}",
                (text, session_id, version),
            )
            if cur.rowcount != 1:
                conn.rollback()
                return 0
            cur.executemany(
                f"INSERT INTO floor_message (session_id, role, content, create_time) VALUES ({m}, {m}, {m}, {m})",
                [(session_id, "user", user, now), (session_id, "assistant", assistant, now)],
            )
            conn.commit()
            return version + 1
        except BaseException:
            conn.rollback()
            raise


def canvas_turn(body: dict) -> Callable[[str], tuple[str, str]]:
    """:meth:`Store.turn`'s ``run`` for one run of a real canvas: ``Canvas(text)``, run with
    ``body`` (its ``query`` or its form's ``inputs``), dumped. Returns the new text and the
    answer (empty where the run paused at a form)."""

    def run(text: str) -> tuple[str, str]:
        canvas = Canvas(text)
        answer = ""
        for event in canvas.run(trace=False, **body):
            if event["event"] == "message_end":
                answer = event["data"]["content"]
        if not answer and canvas.pending_form() is None:
            raise RuntimeError("the run neither paused at a form nor answered")
        return canvas.dump(), answer

    return run


def make_app(url: str, canvas: bool = False) -> Flask:
    """The floor's app; with ``canvas``, each turn runs the canvas (:func:`canvas_turn`)."""
    app = Flask(__name__)
    store = Store(url)

    @app.post("/turn")
    def turn():  # noqa: ANN202 - a Flask view
        body = request.get_json()
        inputs = body.get("inputs")
        user = body.get("question") or orjson.dumps(inputs or {}).decode()
        answer = "Thanks"
        if canvas:
            done = canvas_turn({"inputs": inputs} if inputs else {"query": body.get("question") or ""})

            def run(text: str) -> tuple[str, str]:
                nonlocal answer
                text, answer = done(text)
                return text, answer

            version = store.turn(body["session_id"], user, "", run=run)
        else:
            version = store.turn(body["session_id"], user, answer)
        if version <= 0:
            return jsonify({"code": 409, "message": "busy or missing"}), 409
        data = {"session_id": body["session_id"], "version": version}
        if canvas:
            data["answer"] = answer
        return jsonify({"code": 0, "data": data})

    return app


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seed", help="a file holding the snapshot every session starts from")
    parser.add_argument("--sessions", type=int, default=0)
    parser.add_argument("--canvas", action="store_true", help="run the canvas in each turn (canvas_turn)")
    args = parser.parse_args()
    if args.seed:
        with open(args.seed, encoding="utf-8") as fh:
            Store(args.db).seed(fh.read(), args.sessions)
        return 0
    from api.cli import run_gunicorn

    sys.argv = sys.argv[:1]  # gunicorn reads the command line too
    run_gunicorn(lambda: make_app(args.db, args.canvas), "127.0.0.1", args.port, args.workers, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
