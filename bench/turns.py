"""Per-turn overhead of a pause/resume form turn, side by side in one run.

One "turn" of the intake sample is what a client does for a form: a completion that
pauses at the form, then a completion that resumes it with the answers (two requests,
two committed snapshots). Measured at turns 10, 100 and 1,000 of one conversation
(median of 20 consecutive turns starting there):

* ours, HTTP excluded: the turn service in-process (read, lease claim, canvas, one
  commit per request), on SQLite and on MariaDB;
* ours, HTTP included: a real ``agentcanvas serve`` process (gunicorn) over
  loopback with keep-alive;
* the floor: one raw transaction per request writing the same snapshot bytes and
  two message rows with the same driver (sqlite3 / pymysql) — the least a durable
  turn can cost;
* LangGraph with its SQLite checkpointer (``langgraph-checkpoint-sqlite``) running
  the same three steps (greet → interrupt for the form → reply), history bounded
  like ours. Installed only for the benchmark: ``pip install -e '.[bench]'``.

    .venv/bin/python bench/turns.py [--points 10,100,1000] [--window 20] [--no-mysql]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Annotated, TypedDict

from _path import ROOT  # noqa: E402 - the project on the path, bench/ off it

ANSWERS = {"name": "Ann", "age": 41, "plan": "pro", "notes": "a short note"}
MYSQL = {"host": "127.0.0.1", "port": 3306, "user": "root"}


def intake_dsl() -> dict:
    with open(os.path.join(ROOT, "samples", "intake_form.json"), encoding="utf-8") as fh:
        return json.load(fh)["dsl"]


def timed_series(turn, points: list[int], window: int) -> dict[int, float]:
    """Play the conversation; the median turn time over ``window`` turns at each point."""
    out, done = {}, 0
    for at in points:
        while done < at - 1:
            done += 1
            turn(done)
        times = []
        for _ in range(window):
            done += 1
            t0 = time.perf_counter()
            turn(done)
            times.append(time.perf_counter() - t0)
        out[at] = statistics.median(times)
    return out


# ---------------------------------------------------------------- ours, in process
class InProcess:
    def __init__(self, url: str):
        from api import create_app
        from api.config import canvas_limits
        from api.services import tokens
        from api.services.agents import create_agent

        self.app = create_app({"DATABASE_URL": url})
        with self.app.app_context():
            tenant = tokens.tenant_by_name(f"bench-{uuid.uuid4().hex[:6]}")
            self.tenant_id = tenant.id
            agent = create_agent(
                tenant.id, f"intake-{uuid.uuid4().hex[:6]}", intake_dsl(), "", canvas_limits(self.app.config)
            )
            self.agent_id = agent.id
            svc = self.app.extensions["agentcanvas.turns"]
            row, _ = svc.create_session(self.tenant_id, self.agent_id)
            self.session_id = row.id
        self.svc = self.app.extensions["agentcanvas.turns"]

    def turn(self, i: int) -> None:
        from api.services.turns import TurnRequest

        with self.app.app_context():
            for body in ({"query": f"sign me up {i}"}, {"inputs": ANSWERS}):
                result = self.svc.start(
                    TurnRequest(self.tenant_id, self.agent_id, session_id=self.session_id, **body),
                    inline=True,
                ).wait()
                assert result.status in ("paused", "succeeded"), result

    def snapshots(self) -> tuple[str, str]:
        """The snapshot as stored after a pause and after a finished turn."""
        from api.services.turns import TurnRequest

        def stored() -> str:
            from api.db import Session, db

            with self.app.app_context(), db.connection_context():
                return Session.get_by_id(self.session_id).snapshot

        self.turn(0)
        finished = stored()
        with self.app.app_context():
            req = TurnRequest(self.tenant_id, self.agent_id, session_id=self.session_id, query="x")
            self.svc.start(req).wait()
        paused = stored()
        with self.app.app_context():
            req = TurnRequest(self.tenant_id, self.agent_id, session_id=self.session_id, inputs=ANSWERS)
            self.svc.start(req).wait()
        return paused, finished

    def close(self) -> None:
        from api.db import db

        self.svc.wait_idle(30)
        if db.obj is not None:
            db.obj.close_all() if hasattr(db.obj, "close_all") else db.obj.close()


# ---------------------------------------------------------------- ours, over HTTP
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OverHttp:
    def __init__(self, url: str):
        import requests

        env = {**os.environ, "AGENTCANVAS_DATABASE_URL": url}
        cli = os.path.join(os.path.dirname(sys.executable), "agentcanvas")
        out = subprocess.run(
            [cli, "token", "create", "--tenant", f"bench-{uuid.uuid4().hex[:6]}"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        token = out.strip().splitlines()[-1].split()[-1]
        self.port = free_port()
        self.proc = subprocess.Popen(
            [cli, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"
        self.base = f"http://127.0.0.1:{self.port}/api/v1"
        for _ in range(200):
            try:
                self.http.get(f"{self.base}/agents", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.05)
        title = f"intake-{uuid.uuid4().hex[:6]}"
        self.agent_id = self.http.post(
            f"{self.base}/agents", json={"title": title, "dsl": intake_dsl()}
        ).json()["data"]["id"]
        self.session_id = self.http.post(f"{self.base}/agents/{self.agent_id}/sessions", json={}).json()[
            "data"
        ]["id"]

    def turn(self, i: int) -> None:
        url = f"{self.base}/agents/{self.agent_id}/completions"
        for body in ({"question": f"sign me up {i}"}, {"inputs": ANSWERS}):
            resp = self.http.post(url, json={"session_id": self.session_id, "stream": False, **body})
            assert resp.status_code == 200, resp.text

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


# ---------------------------------------------------------------- the floor
class RawSqlite:
    def __init__(self, path: str, paused: str, finished: str):
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=wal")
        self.conn.execute("PRAGMA synchronous=normal")
        self.conn.execute("CREATE TABLE s (id TEXT PRIMARY KEY, snapshot TEXT, version INTEGER)")
        self.conn.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, sid TEXT, role TEXT, content TEXT)")
        self.conn.execute("INSERT INTO s VALUES ('s1', ?, 1)", (finished,))
        self.bytes = (paused, finished)
        self.version = 1

    def turn(self, i: int) -> None:
        for snapshot in self.bytes:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute(
                "UPDATE s SET snapshot=?, version=version+1 WHERE id='s1' AND version=?",
                (snapshot, self.version),
            )
            self.conn.executemany(
                "INSERT INTO m (sid, role, content) VALUES ('s1', ?, ?)",
                [("user", f"q{i}"), ("assistant", "a")],
            )
            self.conn.execute("COMMIT")
            self.version += 1

    def close(self) -> None:
        self.conn.close()


class RawMysql:
    def __init__(self, dbname: str, paused: str, finished: str):
        import pymysql

        self.conn = pymysql.connect(database=dbname, autocommit=False, **MYSQL)
        with self.conn.cursor() as c:
            c.execute("CREATE TABLE s (id VARCHAR(32) PRIMARY KEY, snapshot LONGTEXT, version BIGINT)")
            c.execute(
                "CREATE TABLE m (id BIGINT AUTO_INCREMENT PRIMARY KEY, sid VARCHAR(32), role VARCHAR(16), content LONGTEXT)"
            )
            c.execute("INSERT INTO s VALUES ('s1', %s, 1)", (finished,))
        self.conn.commit()
        self.bytes = (paused, finished)
        self.version = 1

    def turn(self, i: int) -> None:
        for snapshot in self.bytes:
            with self.conn.cursor() as c:
                c.execute(
                    "UPDATE s SET snapshot=%s, version=version+1 WHERE id='s1' AND version=%s",
                    (snapshot, self.version),
                )
                c.executemany(
                    "INSERT INTO m (sid, role, content) VALUES ('s1', %s, %s)",
                    [("user", f"q{i}"), ("assistant", "a")],
                )
            self.conn.commit()
            self.version += 1

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------- LangGraph
def _bounded(old: list, new: list) -> list:
    return (old + new)[-100:]  # the same bounded history our snapshot keeps


class _GraphState(TypedDict, total=False):
    history: Annotated[list, _bounded]
    query: str
    form: dict


class LangGraphSqlite:
    def __init__(self, path: str):
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Command, interrupt

        def greet(state):
            return {"history": [["user", state["query"]]]}

        def ask(state):
            return {"form": interrupt({"fields": ["name", "age", "plan", "notes"]})}

        def reply(state):
            return {"history": [["assistant", f"Thanks {state['form']['name']}"]]}

        graph = StateGraph(_GraphState)
        graph.add_node("greet", greet)
        graph.add_node("ask", ask)
        graph.add_node("reply", reply)
        graph.add_edge(START, "greet")
        graph.add_edge("greet", "ask")
        graph.add_edge("ask", "reply")
        graph.add_edge("reply", END)
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.app = graph.compile(checkpointer=SqliteSaver(self.conn))
        self.cfg = {"configurable": {"thread_id": "bench"}}
        self.Command = Command

    def turn(self, i: int) -> None:
        self.app.invoke({"query": f"sign me up {i}"}, self.cfg)
        self.app.invoke(self.Command(resume=ANSWERS), self.cfg)

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------- main
def mysql_database() -> tuple[str, callable]:
    import pymysql

    name = f"agentcanvas_bench_{uuid.uuid4().hex[:8]}"
    conn = pymysql.connect(**MYSQL)
    with conn.cursor() as c:
        c.execute(f"CREATE DATABASE `{name}`")
    conn.close()

    def drop() -> None:
        conn = pymysql.connect(**MYSQL)
        with conn.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()

    return name, drop


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", default="10,100,1000")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--no-mysql", action="store_true")
    args = parser.parse_args()
    points = [int(p) for p in args.points.split(",")]
    tmp = tempfile.mkdtemp(prefix="agentcanvas-bench-")
    rows: dict[str, dict[int, float]] = {}
    cleanups = []

    def run(label: str, make) -> None:
        subject = make()
        try:
            rows[label] = timed_series(subject.turn, points, args.window)
        finally:
            subject.close()
        print(f"  measured {label}", file=sys.stderr)

    backends = [("sqlite", f"sqlite:///{tmp}/ours.db")]
    if not args.no_mysql:
        name, drop = mysql_database()
        cleanups.append(drop)
        backends.append(("mariadb", f"mysql://root@127.0.0.1:3306/{name}"))
    try:
        for backend, url in backends:
            probe = InProcess(url)
            paused, finished = probe.snapshots()
            probe.close()
            run(f"ours {backend}, HTTP excluded", lambda url=url: InProcess(url))
            run(f"ours {backend}, HTTP included", lambda url=url: OverHttp(url))
            if backend == "sqlite":
                run(
                    "floor sqlite (raw sqlite3 txn)",
                    lambda p=paused, f=finished: RawSqlite(f"{tmp}/floor.db", p, f),
                )
            else:
                fname, fdrop = mysql_database()
                cleanups.append(fdrop)
                run(
                    "floor mariadb (raw pymysql txn)", lambda n=fname, p=paused, f=finished: RawMysql(n, p, f)
                )
        try:
            import langgraph.checkpoint.sqlite  # noqa: F401

            run("LangGraph + SqliteSaver", lambda: LangGraphSqlite(f"{tmp}/langgraph.db"))
        except ImportError:
            print("LangGraph not installed: pip install -e '.[bench]' to compare", file=sys.stderr)
    finally:
        for clean in cleanups:
            clean()

    head = "".join(f"{'turn ' + str(p):>12}" for p in points)
    print(f"\n{'ms per pause+resume turn':<34}{head}{'last/first':>12}")
    for label, series in rows.items():
        cells = "".join(f"{series[p] * 1000:>12.3f}" for p in points)
        print(f"{label:<34}{cells}{series[points[-1]] / series[points[0]]:>11.2f}x")

    def ratio(a: str, b: str) -> str:
        if a not in rows or b not in rows:
            return ""
        return "  ".join(f"{rows[a][p] / rows[b][p]:6.2f}x" for p in points)

    print("\nratios at each point")
    lg = "LangGraph + SqliteSaver"
    for label in [k for k in rows if k.startswith("ours")]:
        backend = "sqlite" if "sqlite" in label else "mariadb"
        floor = next((k for k in rows if k.startswith(f"floor {backend}")), None)
        if lg in rows:
            print(f"  LangGraph / {label:<28} {ratio(lg, label)}   (goal ≥ 5x)")
        if floor:
            print(f"  {label} / floor{'':<10} {ratio(label, floor)}   (goal ≤ 3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
