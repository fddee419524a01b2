"""The sessions listing of an agent with many sessions: ``GET /agents/<id>/sessions``.

An agent's sessions are listed by ``update_time`` by default (RAGFlow's order), which
every turn sets and so has no index. The listing reads them through ``update_mark``
(migration 20: ``update_time``'s 10-minute step, indexed with ``agent_id``), and counts
them on the ``agent_id`` index. Side by side on the same rows, in one run, this prints
:func:`api.services.sessions.list_sessions` against the same page read as it was read
before migration 20 (every session of the agent read and sorted; counted with the
``tenant_id`` condition, which reads every row), at 1,000, 10,000 and 100,000 sessions
of one agent whose last turns are spread over 30 days:

* page 1 and page 30 (30 a page) by ``update_time``, latest first (the default);
* page 1 by ``create_time`` (indexed before, as now).

On SQLite, MariaDB and Postgres (a throwaway database each; on Postgres the table is
vacuumed and analysed once the sessions are made, as autovacuum would soon do). Times
are medians of ``--repeat`` calls, in ms; the ratio is before / now.

    .venv/bin/python bench/listing.py [--sizes 1000,10000,100000] [--repeat 7] [--no-mysql] [--no-postgres]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid

from _path import BENCH

sys.path.insert(0, os.path.join(BENCH, "support"))

from throwaway import mysql_database, postgres_database  # noqa: E402

PAGE_SIZE = 30
DAY_MS = 86_400_000


class Listing:
    """One app on one database, one agent, its sessions made in bulk."""

    def __init__(self, url: str):
        from api import create_app
        from api.config import canvas_limits
        from api.services import tokens
        from api.services.agents import create_agent

        self.app = create_app({"DATABASE_URL": url, "SWEEP_INTERVAL_SECONDS": 0})
        with self.app.app_context():
            tenant = tokens.tenant_by_name(f"bench-{uuid.uuid4().hex[:6]}")
            dsl = {
                "components": {"begin": {"obj": {"component_name": "Begin", "params": {}}}},
                "path": [],
                "history": [],
                "retrieval": [],
            }
            agent = create_agent(tenant.id, "listing", dsl, "", canvas_limits(self.app.config))
        self.tenant_id, self.agent_id, self.version_id = tenant.id, agent.id, agent.version_id
        self.count = 0
        self.made: set[int] = set()
        self.used: set[int] = set()
        self.rnd = random.Random(20)

    def grow_to(self, count: int) -> None:
        """Add sessions until the agent has ``count``, their last turns in the last 30 days."""
        from api.db import Session, db, now_ms, update_mark
        from api.db.database import is_postgres
        from tests.bulk import insert_rows

        now = now_ms()
        with self.app.app_context(), db.connection_context():
            while self.count < count:
                part = min(5000, count - self.count)
                rows = []
                for _ in range(part):
                    made = self._unique(now - self.rnd.randrange(30 * DAY_MS), self.made)
                    used = self._unique(made + self.rnd.randrange(now - made + 1), self.used)
                    rows.append(
                        {
                            "id": uuid.uuid4().hex,
                            "tenant_id": self.tenant_id,
                            "agent_id": self.agent_id,
                            "agent_version_id": self.version_id,
                            "user_id": f"user-{self.rnd.randrange(100)}",
                            "create_time": made,
                            "update_time": used,
                            "update_mark": update_mark(used),
                            "expiry_mark": made,
                        }
                    )
                insert_rows(Session, rows)
                self.count += part
            if is_postgres(db.obj):
                # What autovacuum does soon after on a live server (the statistics, the
                # visibility map that lets a count read the index alone), done at once.
                db.obj.execute_sql("VACUUM ANALYZE session")

    @staticmethod
    def _unique(when: int, taken: set[int]) -> int:
        """``when``, or the first free ms before it: no ties, so both reads order alike."""
        while when in taken:
            when -= 1
        taken.add(when)
        return when

    def now(self, page: int, orderby: str) -> list[str]:
        from api.services.sessions import list_sessions

        rows, _ = list_sessions(self.tenant_id, self.agent_id, page, PAGE_SIZE, orderby, True)
        return [r.id for r in rows]

    def before(self, page: int, orderby: str) -> list[str]:
        """The page as read before migration 20: all the agent's sessions sorted, counted
        with the tenant_id condition."""
        from api.db import Session
        from api.services.agents import get_agent
        from api.services.sessions import _select

        get_agent(self.tenant_id, self.agent_id)
        query = _select(False).where(
            (Session.agent_id == self.agent_id) & (Session.tenant_id == self.tenant_id)
        )
        query.count()
        column = getattr(Session, orderby)
        return [r.id for r in query.order_by(column.desc(), Session.id).paginate(page, PAGE_SIZE)]

    def timed(self, repeat: int) -> list[tuple[str, float, float]]:
        """``(what, ms before, ms now)`` for each read, the two interleaved call by call."""
        out = []
        for what, page, orderby in (
            ("page 1 by update_time", 1, "update_time"),
            ("page 30 by update_time", 30, "update_time"),
            ("page 1 by create_time", 1, "create_time"),
        ):
            times: dict[str, list[float]] = {"before": [], "now": []}
            with self.app.app_context():
                for i in range(repeat):
                    for name in ("before", "now") if i % 2 else ("now", "before"):
                        t0 = time.perf_counter()
                        ids = getattr(self, name)(page, orderby)
                        times[name].append(time.perf_counter() - t0)
                        assert len(ids) == PAGE_SIZE
                assert self.now(page, orderby) == self.before(page, orderby), what  # the same page
            out.append(
                (what, statistics.median(times["before"]) * 1e3, statistics.median(times["now"]) * 1e3)
            )
        return out

    def close(self) -> None:
        from api import stop_background
        from api.db import db

        stop_background(self.app)
        db.obj.close_all()


def run(name: str, url: str, sizes: list[int], repeat: int) -> None:
    listing = Listing(url)
    try:
        for size in sizes:
            listing.grow_to(size)
            for what, before, now in listing.timed(repeat):
                print(
                    f"{name:8} {size:>7,} sessions  {what:24}  before {before:8.2f} ms   now {now:7.2f} ms"
                    f"   before/now {before / now:6.1f}x",
                    flush=True,
                )
    finally:
        listing.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-mysql", action="store_true")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        run("SQLite", f"sqlite:///{tmp}/listing.db", sizes, args.repeat)
    for name, make, skip in (
        ("MariaDB", mysql_database, args.no_mysql),
        ("Postgres", postgres_database, args.no_postgres),
    ):
        if not skip:
            url, drop = make()
            try:
                run(name, url, sizes, args.repeat)
            finally:
                drop()


if __name__ == "__main__":
    main()
