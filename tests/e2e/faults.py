"""A database outage under load: a private MariaDB killed and restarted while clients run turns.

Used by ``tests/e2e/test_faults.py`` (which asserts) and ``bench/faults.py`` (which
prints the figures). Never touches the shared MariaDB on port 3306: the database here
is a private ``mariadbd`` in a temporary folder, on its own port and socket.

The scenario: one ``agentcanvas serve`` with 2 workers on the private database; 8
clients, each on its own session of the counter sample, send blocking turns with a
unique question each. Mid-run the database is SIGKILLed, left down a moment, and
started again. A client acts as a careful one would: on "not saved" (or a 503 before
the turn ran) it sends the same question again; on "outcome unknown" it does not.
Then every session is read straight from the database and compared with what its
client was told. A ninth client sends first messages only (no session id: each reply
makes a new session, written in the turn's first transaction): every one acknowledged
must be stored in the session its reply names, and none answered "not saved" may be.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import requests

from tests.api.conftest import sample
from tests.e2e.conftest import Client, Deployment, free_port

#: A session's state (api.services.history): the row of its ring its row points at.
STATE_SQL = (
    "SELECT k.packed FROM session s JOIN kept_state k ON k.session_id = s.id AND k.slot = s.state_slot"
    " WHERE s.id = %s"
)

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), Path("/usr/bin"))


class PrivateServer:
    """A throwaway database server of this test alone (data in ``folder``), killed at the end.

    A subclass says how its data folder is made (:meth:`install_command`), how the server
    is started (:meth:`start_command`) and how to connect (:meth:`connect`).
    """

    #: what the server is called in messages, and its log file's name
    name = "server"
    #: the driver's error while the server does not answer yet
    not_answering: type[Exception] = Exception

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        #: Popen's user/group when the server must not run as root
        self.run_as: dict[str, Any] = {}

    def install_command(self) -> list[str]:
        raise NotImplementedError

    def start_command(self) -> list[str]:
        raise NotImplementedError

    def connect(self, database: str | None = "agentcanvas_faults") -> Any:
        raise NotImplementedError

    def install(self) -> PrivateServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            self.install_command(), capture_output=True, text=True, timeout=120, **self.run_as
        )
        assert done.returncode == 0, (
            f"installing the private {self.name} failed:\n{done.stdout}\n{done.stderr}"
        )
        return self

    def start(self) -> None:
        log = open(self.folder / f"{self.name}.log", "a", encoding="utf-8")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(
            self.start_command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **self.run_as
        )
        self.wait_ready()

    def wait_ready(self, seconds: float = 60) -> None:
        end = time.monotonic() + seconds
        while True:
            try:
                self.connect(None).close()
                return
            except self.not_answering:
                assert self.proc is not None and self.proc.poll() is None, f"the private {self.name} exited"
                assert time.monotonic() < end, f"the private {self.name} did not start"
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash would (the server recovers at the next start)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def remove(self) -> None:
        """Kill it; a subclass also deletes a folder it made itself."""
        self.kill()

    def freeze(self) -> None:
        """SIGSTOP, as a hung machine: the server keeps its connections and answers
        nothing. Returns once every thread of it has stopped. The kernel stops a
        process's threads one by one after ``kill`` returns; on a busy machine a thread
        could still answer a query sent just after (seen in CI)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        end = time.monotonic() + 30
        while not _stopped(self.proc.pid):
            assert time.monotonic() < end, f"the private {self.name} did not stop"
            time.sleep(0.001)

    def thaw(self) -> None:
        """SIGCONT: the frozen server runs again."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def query(self, sql: str, *args: Any) -> list[tuple]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()


class PrivateMariaDB(PrivateServer):
    """A private ``mariadbd`` (root without a password, grants skipped)."""

    name = "mariadbd"
    not_answering = pymysql.MySQLError

    def __init__(self, folder: Path):
        super().__init__(folder)
        self.data = folder / "data"
        self.socket = folder / "mysqld.sock"

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/agentcanvas_faults"

    def install_command(self) -> list[str]:
        return [INSTALL_DB, "--no-defaults", f"--datadir={self.data}", "--user=root", "--skip-test-db"] + [
            "--auth-root-authentication-method=normal"
        ]

    def start_command(self) -> list[str]:
        return (
            [MARIADBD, "--no-defaults", f"--datadir={self.data}", f"--socket={self.socket}"]
            + [f"--port={self.port}", "--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables"]
            + ["--skip-log-bin", "--innodb-buffer-pool-size=32M", f"--pid-file={self.folder / 'pid'}"]
        )

    def connect(self, database: str | None = "agentcanvas_faults") -> Any:
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            database=database,
            charset="utf8mb4",
            connect_timeout=2,
        )


class PrivatePostgres(PrivateServer):
    """A private ``postgres`` (user postgres, trust). Started as root, it runs as the
    ``postgres`` user (it refuses root), so its folder is a new one under /tmp handed to
    that user (pytest's tmp_path is not reachable by it); :meth:`remove` deletes it."""

    name = "postgres"
    not_answering = psycopg.OperationalError

    def __init__(self) -> None:
        super().__init__(Path(tempfile.mkdtemp(prefix="agentcanvas-pg-")))
        if os.getuid() == 0:
            shutil.chown(self.folder, "postgres")
            # Popen(user=...): the server is our own child, reaped by kill() (a runuser's was not).
            self.run_as = {"user": "postgres", "group": "postgres"}

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/agentcanvas_faults"

    def install_command(self) -> list[str]:
        return [
            str(PG_BIN / "initdb"),
            "-D",
            str(self.folder / "data"),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]

    def start_command(self) -> list[str]:
        return [str(PG_BIN / "postgres"), "-D", str(self.folder / "data"), "-p", str(self.port)] + [
            "-k",
            str(self.folder),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
        ]

    def connect(self, database: str | None = "agentcanvas_faults") -> Any:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=database or "postgres"
        )

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, as a crash of the machine
        would, and wait until none runs. Each backend makes itself a session leader, so
        the postmaster's process group alone would leave the backends running until they
        notice their parent died: a pooled connection's next query could still be answered
        (seen in CI). The postmaster is stopped first, so it starts no backend meanwhile."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.freeze()
        children = _children(self.proc.pid)
        super().kill()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 30
        while any(_running(pid) for pid in children):
            assert time.monotonic() < end, f"the private {self.name}'s processes outlived SIGKILL"
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (the kernel's list, whatever their session)."""
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
        return [int(child) for child in fh.read().split()]


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped by a signal (state ``T``) or gone."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat", encoding="ascii", errors="replace") as fh:
                states.append(fh.read().rpartition(")")[2].split()[0])
        except OSError:
            continue  # a thread that ended meanwhile
    return all(state in ("T", "Z", "X") for state in states)  # a dead thread stops too


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class Reply:
    at: float
    question: str
    status: int
    kind: str  # ok, not_saved, unknown, busy, unavailable, other
    message_id: str = ""


@dataclass
class Figures:
    acknowledged: int = 0
    persisted: int = 0
    lost: int = 0
    double_applied: int = 0
    wrong_not_saved: int = 0
    not_saved: int = 0
    unknown: int = 0
    unavailable: int = 0
    busy_after_back: float = 0.0
    #: error replies whose text names the database (host, port, driver): must be none
    driver_text: list[str] = field(default_factory=list)
    #: 503 replies without a Retry-After header: must be none
    no_retry_after: int = 0
    #: what the embed route answered while the database was down: (status, Retry-After, message)
    embed_during_outage: tuple | None = None
    first_success_after_restart: float | None = None
    turns_sent: int = 0
    per_session: dict[str, dict] = field(default_factory=dict)
    #: the first-message client: replies, acknowledged, acknowledged but not stored in the
    #: session named, "not saved" but stored, sessions named still held by a lease at the end
    first_sent: int = 0
    first_acknowledged: int = 0
    first_lost: int = 0
    first_wrong_not_saved: int = 0
    first_left_busy: int = 0

    def lines(self) -> list[str]:
        first = self.first_success_after_restart
        return [
            f"turns sent (replies)            {self.turns_sent}",
            f"acknowledged (200)              {self.acknowledged}",
            f"persisted                       {self.persisted}",
            f"lost (acknowledged, not stored) {self.lost}",
            f"double-applied                  {self.double_applied}",
            f'"not saved" replies             {self.not_saved}',
            f'wrong "not saved" (was saved)   {self.wrong_not_saved}',
            f'"outcome unknown" replies       {self.unknown}',
            f"503 before the turn ran         {self.unavailable}",
            f"longest busy after DB back (s)  {self.busy_after_back:.2f}",
            f"replies showing driver text     {len(self.driver_text)}",
            f"503 without Retry-After         {self.no_retry_after}",
            "first success after restart (s) " + ("never" if first is None else f"{first:.2f}"),
            f"first messages sent (replies)   {self.first_sent}",
            f"  acknowledged (200)            {self.first_acknowledged}",
            f"  lost (acknowledged, not stored) {self.first_lost}",
            f'  wrong "not saved"             {self.first_wrong_not_saved}',
            f"  sessions left busy            {self.first_left_busy}",
        ]


def classify_reply(resp: requests.Response) -> tuple[str, str]:
    """What a turn's reply said (ok, not_saved, unknown, busy, unavailable, other) and its message_id."""
    try:
        body = resp.json()
    except ValueError:
        return "other", ""
    data = body.get("data") or {}
    message_id = str(data.get("message_id") or "") if isinstance(data, dict) else ""
    if resp.status_code == 200:
        return "ok", message_id
    error_type = (data.get("data") or {}).get("error_type") if isinstance(data, dict) else None
    if error_type == "TurnNotSaved":
        return "not_saved", message_id
    if error_type == "TurnOutcomeUnknown":
        return "unknown", message_id
    if resp.status_code == 409 and body.get("code") == 106:
        return "busy", ""
    if resp.status_code == 503:
        return "unavailable", ""
    return "other", f"{resp.status_code} {body.get('message')}"


def session_named(resp: requests.Response) -> str:
    """The session id a completion's reply names (its ``data``, or the final event in it), if any."""
    try:
        data = resp.json().get("data")
    except ValueError:
        return ""
    return str(data.get("session_id") or "") if isinstance(data, dict) else ""


def _leaks_driver_text(text: str, port: int) -> bool:
    lowered = text.lower()
    return any(s in lowered for s in ("127.0.0.1", f":{port}", str(port), "pymysql", "mysql server", "errno"))


def run_outage(
    workdir: Path, clients: int = 8, before: float = 3.0, down: float = 2.0, after: float = 5.0
) -> Figures:
    """Run the scenario of the module docstring; the figures, measured from the database."""
    database = PrivateMariaDB(workdir / "mariadb").install()
    database.start()
    deployment = Deployment(database.url, workdir)
    try:
        token = deployment.token()
        embed_token = deployment.cli("token", "create", "--tenant", "e2e", "--embed").split()[-1]
        client = Client(deployment.server(workers=2, threads=8).url, token)
        agent_id = client.create_agent("counter", sample("counter"))
        sessions = [client.create_session(agent_id) for _ in range(clients)]
        replies: dict[str, list[Reply]] = {s: [] for s in sessions}
        stop = threading.Event()
        checks = Figures()

        def look_at(resp: requests.Response) -> None:
            if resp.status_code != 200 and _leaks_driver_text(resp.text, database.port):
                checks.driver_text.append(resp.text[:300])
            if resp.status_code == 503 and not resp.headers.get("Retry-After"):
                checks.no_retry_after += 1

        def run_client(session_id: str) -> None:
            n, retry = 0, None
            while not stop.is_set():
                question = retry or f"q{n}"
                if retry is None:
                    n += 1
                retry = None
                try:
                    resp = client.ask(agent_id, session_id, question, timeout=30)
                    look_at(resp)
                    kind, message_id = classify_reply(resp)
                    status = resp.status_code
                except requests.RequestException as exc:
                    kind, message_id, status = "other", str(exc), 0
                replies[session_id].append(Reply(time.monotonic(), question, status, kind, message_id))
                if kind in ("not_saved", "unavailable", "busy", "other"):
                    retry = question  # nothing was applied (as far as we were told): again
                    time.sleep(0.05)

        first_replies: list[tuple[Reply, str]] = []  # each with the session its reply names

        def run_first_messages() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    resp = client.ask(agent_id, None, f"first{n}", timeout=30)
                    look_at(resp)
                    (kind, message_id), named = classify_reply(resp), session_named(resp)
                    status = resp.status_code
                except requests.RequestException as exc:
                    kind, message_id, status, named = "other", str(exc), 0, ""
                first_replies.append((Reply(time.monotonic(), f"first{n}", status, kind, message_id), named))
                if kind != "ok":
                    time.sleep(0.05)

        threads = [threading.Thread(target=run_client, args=(s,), daemon=True) for s in sessions]
        threads.append(threading.Thread(target=run_first_messages, daemon=True))
        for t in threads:
            t.start()
        time.sleep(before)
        database.kill()
        time.sleep(down / 2)
        embed = requests.post(
            f"{client.base_url}/api/v1/agentbots/{agent_id}/completions",
            json={"question": "hi", "stream": False, "user_id": os.urandom(16).hex()},
            headers={"Authorization": f"Bearer {embed_token}"},
            timeout=60,
        )
        look_at(embed)
        embed_seen = (embed.status_code, embed.headers.get("Retry-After"), embed.text[:300])
        time.sleep(down / 2)
        database.start()
        back = time.monotonic()
        time.sleep(after)
        stop.set()
        for t in threads:
            t.join(60)
        figures = _figures(database, replies, back)
        _first_message_figures(figures, database, first_replies)
        figures.driver_text, figures.no_retry_after = checks.driver_text, checks.no_retry_after
        figures.embed_during_outage = embed_seen
        return figures
    finally:
        deployment.close()
        database.kill()


def _figures(database: PrivateMariaDB, replies: dict[str, list[Reply]], back: float) -> Figures:
    figures = Figures()
    first_ok = None
    for session_id, seen in replies.items():
        rows = database.query(
            "SELECT message_id, content FROM message_log WHERE session_id = %s AND role = 'user'", session_id
        )
        stored_ids = {r[0] for r in rows}
        snapshot = database.query(STATE_SQL, session_id)[0][0]
        said = json.loads(snapshot)["globals"].get("env.said") or []
        acknowledged = [r for r in seen if r.kind == "ok"]
        figures.turns_sent += len(seen)
        figures.acknowledged += len(acknowledged)
        figures.persisted += len(rows)
        figures.lost += sum(1 for r in acknowledged if r.message_id not in stored_ids)
        figures.double_applied += len(said) - len(set(said))
        not_saved = [r for r in seen if r.kind == "not_saved"]
        figures.not_saved += len(not_saved)
        figures.wrong_not_saved += sum(1 for r in not_saved if r.message_id in stored_ids)
        figures.unknown += sum(1 for r in seen if r.kind == "unknown")
        figures.unavailable += sum(1 for r in seen if r.kind == "unavailable")
        busy_after = [r.at - back for r in seen if r.kind == "busy" and r.at > back]
        figures.busy_after_back = max([figures.busy_after_back, *busy_after])
        after_ok = [r.at - back for r in acknowledged if r.at > back]
        if after_ok:
            first_ok = min(after_ok) if first_ok is None else min(first_ok, min(after_ok))
        figures.per_session[session_id] = {
            "acknowledged": len(acknowledged),
            "persisted": len(rows),
            "unknown": sum(1 for r in seen if r.kind == "unknown"),
            "other": [r.message_id for r in seen if r.kind == "other"][:3],
        }
    figures.first_success_after_restart = first_ok
    return figures


def _first_message_figures(figures: Figures, database: PrivateMariaDB, seen: list[tuple[Reply, str]]) -> None:
    """What the first-message client was told, against what the database holds."""
    figures.first_sent = len(seen)
    for reply, session_id in seen:
        stored = (
            {
                r[0]
                for r in database.query(
                    "SELECT message_id FROM message_log WHERE session_id = %s AND role = 'user'", session_id
                )
            }
            if session_id
            else set()
        )
        if reply.kind == "ok":
            figures.first_acknowledged += 1
            figures.first_lost += reply.message_id not in stored
        elif reply.kind == "not_saved":
            figures.first_wrong_not_saved += reply.message_id in stored
        if session_id and database.query(
            "SELECT 1 FROM session WHERE id = %s AND lease_owner IS NOT NULL", session_id
        ):
            figures.first_left_busy += 1
