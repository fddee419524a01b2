"""Two servers on a three-node MariaDB Galera cluster serving the same sessions at once.

The cluster is real (``.ci/galera`` through :class:`tests.galera.GaleraCluster`: three
``mariadbd`` with Debian's galera-4 on loopback ports, started once for this module);
so are the servers (``agentcanvas serve``). Server A's database URL names node 1 first,
server B's node 2 first; both name all three nodes. 8 clients (4 per server) send
counter turns to 3 shared sessions; after every 200 the session is read through the
other server. What the database holds at the end is compared with every reply
(``tests/e2e/galera_load.py``).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import SAMPLES, Client, Deployment, until
from tests.e2e.galera_load import CounterLoad, Reply, check_sessions, stored_counter
from tests.galera import GaleraCluster

# The cluster's start alone (the module's first test) is bounded at 10 minutes (tests/galera.py).
pytestmark = pytest.mark.timeout(1200)

SESSIONS = 3
CLIENTS = 8
#: Seconds of load in the test without faults.
LOAD_SECONDS = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[GaleraCluster]:
    galera = GaleraCluster()
    galera.start()  # installs galera-4 and rsync first if they are missing
    try:
        yield galera
    finally:
        galera.stop()


class TwoServers:
    """A new database on the cluster, server A (node 1 first) and server B (node 2 first)."""

    def __init__(self, cluster: GaleraCluster, workdir: Path):
        self.cluster = cluster
        self.database = f"agentcanvas_galera_{uuid.uuid4().hex[:12]}"
        self.deployment = Deployment(cluster.url(self.database, first=1), workdir)
        token = self.deployment.token()
        self.agent_id = self.deployment.import_agent(SAMPLES / "counter.json")
        a = self.deployment.server(workers=2)
        b = self.deployment.server(workers=2, AGENTCANVAS_DATABASE_URL=cluster.url(self.database, first=2))
        self.clients = [Client(a.url, token), Client(b.url, token)]
        self.sessions = [self.clients[i % 2].create_session(self.agent_id) for i in range(SESSIONS)]

    def load(self) -> CounterLoad:
        return CounterLoad(self.clients, self.agent_id, self.sessions, workers=CLIENTS)

    def clients_on(self, node: int) -> int:
        """Connections of our servers to node ``node`` (not Galera's appliers, not this one)."""
        return self.cluster.query(
            node,
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
            " WHERE DB = %s AND USER <> 'system user' AND ID <> CONNECTION_ID()",
            self.database,
        )[0][0]

    def stored(self, node: int = 3):  # noqa: ANN201 - see galera_load.stored_counter
        return stored_counter(lambda sql, *args: self.cluster.query(node, sql, *args, database=self.database))


@pytest.fixture
def servers(cluster, tmp_path) -> Iterator[TwoServers]:
    setup = TwoServers(cluster, tmp_path)
    try:
        yield setup
    finally:
        setup.deployment.close()


def _summary(replies: list[Reply]) -> str:
    return ", ".join(
        f"{n} x {kind}/{status}" for (kind, status), n in Counter((r.kind, r.status) for r in replies).items()
    )


def assert_replies_are_answers(replies: list[Reply]) -> None:
    """0 x 500: every reply a 200, a 409 "busy", or a 503 with Retry-After."""
    wrong = [
        f"server {'AB'[r.server]}: {r.status} {r.text}"
        for r in replies
        if not (r.status in (200, 409) or (r.status == 503 and r.retry_after))
    ]
    assert not wrong, (
        f"{len(wrong)} replies neither 200, 409 nor 503 with Retry-After ({_summary(replies)}): {wrong[:5]}"
    )


def assert_database_agrees(setup: TwoServers, load: CounterLoad) -> None:
    """Acknowledged = persisted per session; nothing refused saved; nothing applied twice."""
    figures = check_sessions(load.replies, setup.stored())
    for session_id, fig in figures.items():
        assert not fig.lost, f"session {session_id}: acknowledged turns not saved: {fig.lost[:5]}"
        assert not fig.double_applied, f"session {session_id}: applied twice: {fig.double_applied[:5]}"
        assert not fig.refused_but_saved, (
            f"session {session_id}: refused, yet saved: {fig.refused_but_saved[:5]}"
        )
        assert not fig.saved_unannounced, (
            f"session {session_id}: saved after a failure reply: {fig.saved_unannounced[:5]}"
        )


def test_two_servers_on_two_nodes_lose_nothing_and_read_their_writes(servers):
    load = servers.load().start()
    time.sleep(LOAD_SECONDS)
    load.stop()

    assert_replies_are_answers(load.replies)
    acknowledged = [r for r in load.replies if r.kind == "ok"]
    assert {r.server for r in acknowledged} == {0, 1}, _summary(load.replies)
    # Nothing went wrong with the cluster: nothing to be unsure about.
    assert not [r for r in load.replies if r.kind in ("unknown", "other")], _summary(load.replies)
    assert_database_agrees(servers, load)
    figures = check_sessions(load.replies, servers.stored())
    assert all(f.persisted == f.acknowledged for f in figures.values()), figures

    # Right after a 200, the other server (on the other node) already sees that turn.
    assert load.reads, "no session was read back"
    stale = [r for r in load.reads if r.stale]
    assert not stale, (
        f"{len(stale)} of {len(load.reads)} reads through the other server missed the turn: {stale[:3]}"
    )
    failed = [r for r in load.reads if r.status != 200]
    assert not failed, f"{len(failed)} reads through the other server failed: {failed[:3]}"


def test_node_killed_mid_load_server_moves_to_another_node(servers):
    cluster = servers.cluster
    load = servers.load().start()
    until(lambda: load.count(lambda r: r.kind == "ok" and r.server == 1) >= 10, "turns through server B", 60)

    cluster.kill_node(2)
    killed = time.monotonic()  # once it is dead: a turn sent before may still have used node 2
    # Server B (node 2 first in its URL) keeps answering through node 1 or 3 while node 2 is down.
    until(
        lambda: load.count(lambda r: r.kind == "ok" and r.server == 1 and r.sent > killed) >= 10,
        "server B to answer turns through another node while node 2 is down",
        60,
    )
    down = time.monotonic()
    cluster.start_node(2)  # rejoins under load; returns once Synced
    back = time.monotonic()
    until(
        lambda: load.count(lambda r: r.kind == "ok" and r.server == 1 and r.sent > back) >= 10,
        "server B to answer turns after node 2 is back",
        60,
    )
    # ... and goes back to node 2, its first host, once that host's cool-down is over
    # (server A and the CLI name node 1 first, which stayed up: only B connects to node 2).
    until(lambda: servers.clients_on(2), "server B to use node 2 again", 60, step=0.5)
    load.stop()

    during = [r for r in load.replies if killed < r.sent and r.at < down and r.server == 1]
    assert any(r.kind == "ok" for r in during), _summary(during)
    assert_replies_are_answers(load.replies)
    assert_database_agrees(servers, load)
    # The node that was killed and rejoined holds the same sessions as the others.
    assert [servers.stored(2)(s) for s in servers.sessions] == [
        servers.stored(3)(s) for s in servers.sessions
    ]
