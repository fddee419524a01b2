"""What keeping earlier states costs a turn, and how fast the sweep removes sessions.

1. **Per-turn cost with K kept snapshots** (``session.keep_snapshots``): two sessions
   of one agent, one served by a turn service that keeps K = 10 earlier states
   (regenerate and undo), the other by one that keeps none (K = 0), their turns
   interleaved so both meet the same machine. The median turn time (blocking, in
   process: read, lease, canvas, one commit) around turn 10 and turn 1,000 of each
   conversation, and the ratio K=10 / K=0. Goal: at most 1.3×.
2. **Sweep throughput**: 10,000 sessions idle past their lifetime (one message each)
   removed by :func:`api.services.retention.sweep` in batches of 500: sessions per second.

Both on SQLite and on MariaDB (127.0.0.1:3306, root; a throwaway database).

    .venv/bin/python bench/history.py [--no-mysql] [--points 10,1000] [--sessions 10000]

Exits 1 when a K=10 / K=0 ratio is over the goal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid

from _path import ROOT  # noqa: E402, F401 - the project on the path, bench/ off it

GOAL = 1.3
WINDOW = 41  # turn pairs timed around each point; medians are reported
MYSQL = "mysql://root@127.0.0.1:3306/"
ANSWER = "Thanks, noted: {sys.query}. " + "Here is what I found about it, in a few sentences. " * 4


def chat_dsl() -> dict:
    return {
        "components": {
            "begin": {
                "obj": {"component_name": "Begin", "params": {"prologue": "Hi!"}},
                "downstream": ["Message:Out"],
                "upstream": [],
            },
            "Message:Out": {
                "obj": {"component_name": "Message", "params": {"content": [ANSWER]}},
                "downstream": [],
                "upstream": ["begin"],
            },
        },
        "path": [],
        "history": [],
        "retrieval": [],
    }


class Bench:
    """One app on one database, with a K=10 and a K=0 turn service."""

    def __init__(self, url: str):
        from api import create_app
        from api.config import canvas_limits
        from api.services import tokens
        from api.services.agents import create_agent
        from api.services.turns import TurnService

        self.app = create_app({"DATABASE_URL": url, "KEEP_SNAPSHOTS": 10, "SWEEP_INTERVAL_SECONDS": 0})
        with self.app.app_context():
            tenant = tokens.tenant_by_name(f"bench-{uuid.uuid4().hex[:6]}")
            agent = create_agent(tenant.id, "history", chat_dsl(), "", canvas_limits(self.app.config))
        self.tenant_id, self.agent_id, self.version_id = tenant.id, agent.id, agent.version_id
        self.services = {
            10: self.app.extensions["agentcanvas.turns"],
            0: TurnService({**self.app.config, "KEEP_SNAPSHOTS": 0}),
        }
        with self.app.app_context():
            self.sessions = {
                k: svc.create_session(self.tenant_id, self.agent_id)[0].id for k, svc in self.services.items()
            }

    def turn(self, keep: int, i: int) -> float:
        from api.services.turns import TurnRequest

        req = TurnRequest(
            self.tenant_id, self.agent_id, session_id=self.sessions[keep], query=f"question {i}"
        )
        with self.app.app_context():
            t0 = time.perf_counter()
            result = self.services[keep].start(req, inline=True).wait()
            elapsed = time.perf_counter() - t0
        assert result.status == "succeeded", result.error
        return elapsed

    def per_turn(self, points: list[int]) -> dict[int, dict]:
        """``{point: {K: median seconds, "ratio": median of the paired K=10/K=0 ratios}}``,
        the two conversations played turn by turn together (a busy machine slows both
        turns of a pair alike, so the paired ratio is the steadier figure)."""
        out: dict[int, dict] = {}
        done = 0
        for point in points:
            times: dict[int, list[float]] = {10: [], 0: []}
            start = max(1, point - WINDOW // 2)
            while done < start - 1:
                done += 1
                for keep in (10, 0):
                    self.turn(keep, done)
            for _ in range(WINDOW):
                done += 1
                # Alternate who goes first, so neither always meets a warm cache.
                for keep in (10, 0) if done % 2 else (0, 10):
                    times[keep].append(self.turn(keep, done))
            out[point] = {k: statistics.median(v) for k, v in times.items()}
            out[point]["ratio"] = statistics.median(a / b for a, b in zip(times[10], times[0], strict=True))
        return out

    def sweep_rate(self, count: int) -> tuple[float, int]:
        """Sessions per second removed by one sweep of ``count`` idle sessions; and its batches."""
        from api.db import db, now_ms
        from api.services.retention import RetentionSettings, sweep
        from tests.bulk import idle_sessions

        hour = 3600
        with self.app.app_context(), db.connection_context():
            idle_sessions(self.tenant_id, self.agent_id, self.version_id, count, now_ms() - 2 * hour * 1000)
            t0 = time.perf_counter()
            report = sweep(RetentionSettings(session_ttl_seconds=hour, batch=500))
            elapsed = time.perf_counter() - t0
        assert report.expired == count, report
        return count / elapsed, report.batches


def run(name: str, url: str, points: list[int], sessions: int) -> list[float]:
    bench = Bench(url)
    per_turn = bench.per_turn(points)
    ratios = []
    for point, by_k in per_turn.items():
        ratio = by_k["ratio"]
        ratios.append(ratio)
        print(
            f"{name:8} turn {point:>5}: K=10 {by_k[10] * 1000:7.2f} ms   K=0 {by_k[0] * 1000:7.2f} ms   "
            f"paired ratio {ratio:.2f}x (goal <= {GOAL}x)"
        )
    rate, batches = bench.sweep_rate(sessions)
    print(f"{name:8} sweep: {sessions} idle sessions in {batches} batches of 500: {rate:,.0f} sessions/s")
    bench.services[10].wait_idle(30)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default="10,1000")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--no-mysql", action="store_true")
    args = parser.parse_args()
    points = [int(p) for p in args.points.split(",")]
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        ratios += run("SQLite", f"sqlite:///{tmp}/history.db", points, args.sessions)
    if not args.no_mysql:
        from peewee import MySQLDatabase

        name = f"agentcanvas_bench_{uuid.uuid4().hex[:8]}"
        try:
            ratios += run("MariaDB", MYSQL + name, points, args.sessions)
        finally:
            admin = MySQLDatabase("information_schema", host="127.0.0.1", port=3306, user="root")
            with admin.connection_context():
                admin.execute_sql(f"DROP DATABASE IF EXISTS `{name}`")
    worst = max(ratios)
    print(f"worst K=10 / K=0 ratio: {worst:.2f}x (goal <= {GOAL}x): {'met' if worst <= GOAL else 'MISSED'}")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
