"""Turns on a three-node Galera cluster with 1, 2 and 3 nodes serving, against one MariaDB.

    .venv/bin/python bench/galera.py [--rounds 3] [--seconds 5] [--clients 8] [--kills 1]

Subjects, all started before the first measurement, each ``agentcanvas serve`` with
``--workers 2``:

* **single**: one server on a private ``mariadbd`` (``tests/e2e/faults.py``; the shared
  MariaDB on 3306 is never touched);
* **galera-N** (N = 1, 2, 3): one server on each of N nodes of a three-node cluster
  (``.ci/galera`` through ``tests/galera.py``); server k's URL names all three nodes,
  node k first.

The load is ``tests/e2e/galera_load.py``: ``--clients`` threads, each on its own counter
session, through the subject's servers in turn (client i through server i mod N),
blocking turns back to back. Measurement is interleaved: each round runs every subject
for ``--seconds`` (after a second of warm-up), and the figures are medians over the
rounds: turns/s acknowledged, p50/p99 of a turn's latency, and the replies that were not
a 200. A ratio is of two subjects measured in the same round.

Then the price of read-your-writes: on node 1 of the idle cluster, a primary-key
``SELECT`` and a conditional ``UPDATE`` (what a lease claim is) with ``wsrep_sync_wait``
0 and 3 (what the backend sets, ``api/db/cluster.py``), statement by statement in turn
(which goes first alternating), the median microseconds of each.

Then the failover: with galera-3 under the same load, node 2 is SIGKILLed; printed are
the seconds from the kill to the first 200 on the server whose URL names node 2 first
(the affected server) for a turn sent after the kill, the longest pause of the other
servers (Galera holds every commit until it has evicted the dead node), and the
replies after the kill that were not a 200; node 2 is started again before the next
kill.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import _path  # noqa: F401 - the project root on sys.path
import pymysql

from tests.e2e.conftest import SAMPLES, Client, Deployment
from tests.e2e.faults import PrivateMariaDB
from tests.e2e.galera_load import CounterLoad
from tests.galera import GaleraCluster

WARMUP = 1.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Subject:
    """Servers on one database, a tenant token, the counter agent and one session per client."""

    def __init__(self, name: str, deployment: Deployment, urls: list[str], clients: int):
        self.name = name
        token = deployment.token()
        self.agent_id = deployment.import_agent(SAMPLES / "counter.json")
        self.clients = [
            Client(deployment.server(workers=2, AGENTCANVAS_DATABASE_URL=url).url, token) for url in urls
        ]
        self.sessions = [self.clients[0].create_session(self.agent_id) for _ in range(clients)]

    def load(self, clients: list[Client] | None = None) -> CounterLoad:
        return CounterLoad(
            clients or self.clients,
            self.agent_id,
            self.sessions,
            len(self.sessions),
            read_back=False,
            rotate=False,
        )


def measure(load: CounterLoad, seconds: float) -> dict:
    load.start()
    time.sleep(WARMUP)
    begin = time.monotonic()
    time.sleep(seconds)
    end = time.monotonic()
    load.stop()
    window = [r for r in load.replies if begin <= r.at < end]
    ok = [r.seconds for r in window if r.kind == "ok"]
    return {
        "turns/s": len(ok) / (end - begin),
        "p50": percentile(ok, 0.50) * 1000,
        "p99": percentile(ok, 0.99) * 1000,
        "not 200": len(window) - len(ok),
    }


def failover(subject: Subject, cluster: GaleraCluster, seconds_before: float = 3.0) -> dict:
    """Kill node 2 under load; the seconds to the affected server's first 200, and more."""
    load = subject.load().start()
    time.sleep(seconds_before)
    cluster.kill_node(2)
    killed = time.monotonic()  # once it is dead: a turn sent before may still have used node 2
    affected = 1  # server index 1: its URL names node 2 first
    deadline = killed + 120
    while time.monotonic() < deadline and not load.count(
        lambda r: r.server == affected and r.kind == "ok" and r.sent > killed
    ):
        time.sleep(0.05)
    time.sleep(2.0)
    load.stop()
    first = min(
        (r.at for r in load.replies if r.server == affected and r.kind == "ok" and r.sent > killed),
        default=None,
    )
    others = sorted(r.at for r in load.replies if r.server != affected and r.kind == "ok")
    pause = max((b - a for a, b in zip(others, others[1:], strict=False) if b > killed), default=float("nan"))
    after = [r for r in load.replies if r.at > killed]
    cluster.start_node(2)
    return {
        "first_ok": None if first is None else first - killed,
        "pause": pause,
        "replies": Counter(f"{r.status}" for r in after if r.kind != "ok"),
    }


def sync_wait_cost(cluster: GaleraCluster, database: str, statements: int = 2000) -> dict:
    """Median microseconds of one SELECT and one conditional UPDATE on node 1, by
    ``wsrep_sync_wait``: two connections (0 and 3) taking turns statement by statement,
    so that the machine's drift slows both alike."""
    cluster.query(
        1, "CREATE TABLE IF NOT EXISTS bench_sync_wait (id INT PRIMARY KEY, v INT)", database=database
    )
    cluster.query(1, "REPLACE INTO bench_sync_wait VALUES (1, 0)", database=database)
    conns = {
        level: pymysql.connect(
            host="127.0.0.1", port=cluster.ports[1], user="root", database=database, autocommit=True
        )
        for level in (0, 3)
    }
    timings: dict[tuple[int, str], list[float]] = {}
    try:
        cursors = {level: conn.cursor() for level, conn in conns.items()}
        for level, cur in cursors.items():
            cur.execute(f"SET SESSION wsrep_sync_wait = {level}")
        for n in range(statements):
            for kind, sql in (
                ("select", "SELECT v FROM bench_sync_wait WHERE id = 1"),
                ("update", "UPDATE bench_sync_wait SET v = v + 1 WHERE id = 1 AND v >= 0"),
            ):
                # Which goes first alternates: the statement right after an UPDATE pays for it.
                for level in (0, 3) if n % 2 else (3, 0):
                    cur = cursors[level]
                    begin = time.perf_counter()
                    cur.execute(sql)
                    cur.fetchall()
                    timings.setdefault((level, kind), []).append((time.perf_counter() - begin) * 1e6)
    finally:
        for conn in conns.values():
            conn.close()
    return {key: statistics.median(values) for key, values in timings.items()}


def median_row(rows: list[dict]) -> dict:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def spread(rows: list[dict], key: str) -> str:
    values = [row[key] for row in rows]
    return f"{min(values):.0f}-{max(values):.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--kills", type=int, default=1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="agentcanvas-bench-galera-") as folder:
        work = Path(folder)
        single_db = PrivateMariaDB(work / "single")
        cluster = GaleraCluster()
        deployments: list[Deployment] = []
        try:
            single_db.install().start()
            cluster.start()
            (work / "single-servers").mkdir()
            (work / "galera-servers").mkdir()
            single = Deployment(
                single_db.url.replace("agentcanvas_faults", "agentcanvas_bench"), work / "single-servers"
            )
            database = "agentcanvas_bench"
            galera = Deployment(cluster.url(database), work / "galera-servers")
            deployments += [single, galera]
            subjects = {"single": Subject("single", single, [single.database_url], args.clients)}
            on_galera = Subject(
                "galera", galera, [cluster.url(database, first=n) for n in (1, 2, 3)], args.clients
            )
            plan = [("single", subjects["single"], None)] + [
                (f"galera-{n}", on_galera, on_galera.clients[:n]) for n in (1, 2, 3)
            ]
            results: dict[str, list[dict]] = {name: [] for name, _, _ in plan}
            ratios: dict[str, list[float]] = {name: [] for name, _, _ in plan[1:]}
            for r in range(args.rounds):
                by_name = {}
                for name, subject, clients in plan:
                    by_name[name] = measure(subject.load(clients), args.seconds)
                    results[name].append(by_name[name])
                for name in ratios:
                    ratios[name].append(by_name[name]["turns/s"] / by_name["single"]["turns/s"])
                print(
                    f"round {r + 1}: " + ", ".join(f"{n} {v['turns/s']:.0f}/s" for n, v in by_name.items()),
                    flush=True,
                )

            print(
                f"\n{args.clients} clients, each on its own counter session; one server (2 workers) per node serving"
            )
            print(f"medians of {args.rounds} interleaved rounds of {args.seconds:g} s (min-max of turns/s)\n")
            print(
                f"{'subject':<10} {'turns/s':>8} {'(spread)':>10} {'p50 ms':>8} {'p99 ms':>8} {'not 200':>8}"
            )
            for name, rows in results.items():
                m = median_row(rows)
                print(
                    f"{name:<10} {m['turns/s']:8.0f} {spread(rows, 'turns/s'):>10} {m['p50']:8.1f} {m['p99']:8.1f}"
                    f" {m['not 200']:8.0f}"
                )
            print(
                "\nturns/s against single, same round (median): "
                + ", ".join(f"{name} {statistics.median(values):.2f}" for name, values in ratios.items())
            )

            cost = sync_wait_cost(cluster, database)
            print("\nwsrep_sync_wait on node 1, idle cluster (median microseconds per statement):")
            for kind in ("select", "update"):
                print(
                    f"  {kind:<6}  0: {cost[(0, kind)]:6.0f}   3: {cost[(3, kind)]:6.0f}"
                    f"   ratio {cost[(3, kind)] / cost[(0, kind)]:.2f}"
                )

            print("\nfailover: node 2 SIGKILLed under load (galera-3, the same clients)")
            for k in range(args.kills):
                f = failover(on_galera, cluster)
                first = "never" if f["first_ok"] is None else f"{f['first_ok']:.1f} s"
                print(
                    f"  kill {k + 1}: first 200 on the affected server after {first}; the other servers paused"
                    f" {f['pause']:.1f} s at most; replies after the kill that were not 200: "
                    f"{dict(f['replies']) or 'none'}"
                )
        finally:
            for deployment in deployments:
                deployment.close()
            cluster.stop()
            single_db.kill()


if __name__ == "__main__":
    main()
