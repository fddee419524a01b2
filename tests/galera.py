"""A three-node MariaDB Galera cluster of this process alone, run by ``.ci/galera``.

Used by ``tests/e2e/test_galera.py`` (which asserts) and ``bench/galera.py`` (which
measures). The nodes are real ``mariadbd`` processes on free loopback ports, in a
temporary folder under ``/tmp`` (the nodes run as the ``mysql`` user when we are root,
so their folder must be reachable by it; pytest's ``tmp_path`` is not). The shared
MariaDB on port 3306 is never touched.

    cluster = GaleraCluster().start()
    url = cluster.url("agentcanvas_x", first=2)  # node 2 first, then 1 and 3
    cluster.kill_node(2)    # SIGKILL that node's mariadbd
    cluster.start_node(2)   # it rejoins; returns once it is Synced
    cluster.stop()
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pymysql

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "galera"
NODES = (1, 2, 3)
#: Starts of a cluster whose node lost one of its ports to another process (GaleraCluster.start).
START_ATTEMPTS = 3


class GaleraCluster:
    """Three Galera nodes under ``folder`` (a new temporary folder unless given).

    Nodes are numbered 1, 2, 3 as in ``.ci/galera``; ``ports[n]`` is node n's MySQL port.
    """

    def __init__(self, folder: Path | None = None):
        self._own_folder = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="agentcanvas-galera-")) if folder is None else folder
        self.ports: dict[int, int] = {}

    def _run(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run(
            [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            raise RuntimeError(
                f".ci/galera {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    def start(self) -> GaleraCluster:
        """Bootstrap node 1, join 2 and 3; returns once all three are Synced.

        ``.ci/galera`` picks free ports and lets them go before the nodes bind them, so
        another process (a test's server on a free port) may take one meanwhile: a node
        then fails with "Address already in use". In a folder of its own the cluster is
        then started again, on other ports, up to :data:`START_ATTEMPTS` times."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                out = self._run("start", str(self.folder))
                break
            except BaseException as exc:
                self.stop()
                if not (
                    self._own_folder and attempt < START_ATTEMPTS and "Address already in use" in str(exc)
                ):
                    raise
                self.folder = Path(tempfile.mkdtemp(prefix="agentcanvas-galera-"))
        for line in out.splitlines():
            name, port = line.split()
            self.ports[int(name.removeprefix("node"))] = int(port)
        assert sorted(self.ports) == list(NODES), out
        return self

    def stop(self) -> None:
        """Stop every node and, if the folder was ours, remove it."""
        try:
            self._run("stop", str(self.folder))
        finally:
            if self._own_folder:
                shutil.rmtree(self.folder, ignore_errors=True)

    def kill_node(self, node: int) -> None:
        """SIGKILL node ``node``'s ``mariadbd`` (a crash: its peers drop it a few seconds later)."""
        self._run("kill-node", str(self.folder), str(node))

    def start_node(self, node: int) -> None:
        """Start node ``node`` again: it rejoins (state transfer) and is Synced on return."""
        self._run("start-node", str(self.folder), str(node))

    def status(self) -> str:
        return self._run("status", str(self.folder))

    def hosts(self, first: int = 1) -> list[str]:
        """``127.0.0.1:<port>`` of every node, node ``first`` first, then the others in order."""
        order = [first] + [n for n in NODES if n != first]
        return [f"127.0.0.1:{self.ports[n]}" for n in order]

    def url(self, database: str, first: int = 1) -> str:
        """A URL naming all three nodes (``mysql://root@h1:p1,h2:p2,h3:p3/<database>``), ``first`` first."""
        return f"mysql://root@{','.join(self.hosts(first))}/{database}"

    def node_url(self, node: int, database: str) -> str:
        """A URL naming node ``node`` alone."""
        return f"mysql://root@127.0.0.1:{self.ports[node]}/{database}"

    def query(self, node: int, sql: str, *args: Any, database: str | None = None) -> list[tuple]:
        """Run one statement on node ``node`` (read-your-writes across nodes: wsrep_sync_wait=1)."""
        conn = pymysql.connect(
            host="127.0.0.1",
            port=self.ports[node],
            user="root",
            database=database,
            charset="utf8mb4",
            autocommit=True,
        )
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION wsrep_sync_wait = 1")
                cur.execute(sql, args or None)
                return list(cur.fetchall())
        finally:
            conn.close()

    def wsrep(self, node: int) -> dict[str, str]:
        """Node ``node``'s ``wsrep_%`` status variables."""
        return dict(self.query(node, "SHOW STATUS LIKE 'wsrep_%'"))
