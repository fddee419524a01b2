"""Counter turns on shared sessions through several servers, as on a Galera cluster.

Used by ``tests/e2e/test_galera.py`` (which asserts) and ``bench/galera.py`` (which
measures). Each client thread sends blocking turns of the counter sample (it counts
the turns of its session in ``env.count`` and keeps every question in ``env.said``)
with a question of its own each time, through one server, to the sessions in turn;
so every session is worked on through every server at once. After a 200, the session
may be read back through the next server: a read that does not show the turn just
acknowledged is a stale read.

Every reply is kept (:class:`Reply`), and :func:`check_sessions` compares them with
what the database holds: what was acknowledged was saved once and in its place, what
was refused was not saved, nothing was applied twice.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

from tests.e2e.conftest import Client
from tests.e2e.faults import STATE_SQL, classify_reply

ANSWER = re.compile(r"This is message number (\d+) in this session\. You said: (.*)", re.S)
#: Replies after which the turn was certainly not applied (the client may send it again).
NOT_APPLIED = ("busy", "not_saved", "unavailable")


@dataclass
class Reply:
    at: float  # time.monotonic() when the reply was in
    seconds: float  # how long it took
    server: int  # index of the server asked
    session_id: str
    question: str
    status: int  # 0: no HTTP reply at all
    kind: str  # ok, busy, not_saved, unavailable, unknown, other (faults.classify_reply)
    number: int | None = None  # for a 200: the count the turn reported
    retry_after: str | None = None
    text: str = ""  # for anything but a 200: the start of the body (or the exception)

    @property
    def sent(self) -> float:
        """time.monotonic() when the request went out."""
        return self.at - self.seconds


@dataclass
class ReadBack:
    """A read through another server right after a 200; stale if it misses that turn."""

    server: int
    session_id: str
    question: str
    number: int
    status: int
    count: int | None = None
    stale: bool = False
    text: str = ""


class CounterLoad:
    """``workers`` client threads on ``sessions`` through ``clients`` (one per server).

    Client ``i`` uses server ``i % len(clients)`` and the sessions in turn (or, if not
    ``rotate``, session ``i % len(sessions)`` only); with ``read_back`` each 200 is
    followed by a read of the session's variables through the next server.
    """

    def __init__(
        self,
        clients: list[Client],
        agent_id: str,
        sessions: list[str],
        workers: int = 8,
        read_back: bool = True,
        rotate: bool = True,
    ):
        self.clients = clients
        self.agent_id = agent_id
        self.sessions = sessions
        self.workers = workers
        self.read_back = read_back and len(clients) > 1
        self.rotate = rotate
        self.replies: list[Reply] = []
        self.reads: list[ReadBack] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> CounterLoad:
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> CounterLoad:
        self._stop.set()
        for t in self._threads:
            t.join(120)
        return self

    def count(self, accept: Callable[[Reply], bool]) -> int:
        return sum(1 for r in list(self.replies) if accept(r))

    def _run(self, worker: int) -> None:
        server = worker % len(self.clients)
        client = self.clients[server]
        n = 0
        while not self._stop.is_set():
            session_id = self.sessions[(worker + n * self.rotate) % len(self.sessions)]
            question = f"w{worker} q{n}"
            n += 1
            reply = self._turn(client, server, session_id, question)
            self.replies.append(reply)
            if reply.kind == "ok" and self.read_back:
                self._read_back(server, reply)
            elif reply.kind != "ok":
                time.sleep(0.02)  # a refused turn: a moment before the next

    def _turn(self, client: Client, server: int, session_id: str, question: str) -> Reply:
        started = time.monotonic()
        try:
            resp = client.ask(self.agent_id, session_id, question, timeout=60)
        except requests.RequestException as exc:
            now = time.monotonic()
            return Reply(now, now - started, server, session_id, question, 0, "other", text=repr(exc))
        now = time.monotonic()
        kind, _ = classify_reply(resp)
        reply = Reply(now, now - started, server, session_id, question, resp.status_code, kind)
        reply.retry_after = resp.headers.get("Retry-After")
        if kind == "ok":
            match = ANSWER.fullmatch(resp.json()["data"]["data"]["content"])
            if match is None or match.group(2) != question:
                reply.kind, reply.text = "other", f"unexpected answer {resp.text[:300]}"
            else:
                reply.number = int(match.group(1))
        else:
            reply.text = resp.text[:300]
        return reply

    def _read_back(self, server: int, reply: Reply) -> None:
        other = (server + 1) % len(self.clients)
        read = ReadBack(other, reply.session_id, reply.question, reply.number or 0, 0)
        try:
            resp = self.clients[other].get(f"/agents/{self.agent_id}/sessions/{reply.session_id}/variables")
        except requests.RequestException as exc:
            read.text = repr(exc)
            self.reads.append(read)
            return
        read.status = resp.status_code
        if resp.status_code == 200:
            values = {v["name"]: v["value"] for v in resp.json()["data"]}
            read.count = values["count"]
            read.stale = read.count < read.number or reply.question not in values["said"]
        else:
            read.text = f"{resp.status_code} {resp.headers.get('Retry-After')!r} {resp.text[:300]}"
        self.reads.append(read)


@dataclass
class SessionFigures:
    acknowledged: int = 0
    persisted: int = 0
    #: acknowledged, not in the database (or not where its count said)
    lost: list[str] = field(default_factory=list)
    #: in the database more than once, or a count that does not match the questions kept
    double_applied: list[str] = field(default_factory=list)
    #: refused (409, "not saved", 503 before the turn ran), yet in the database
    refused_but_saved: list[str] = field(default_factory=list)
    #: in the database, though its reply said neither 200 nor "outcome unknown"
    saved_unannounced: list[str] = field(default_factory=list)


def check_sessions(
    replies: list[Reply], stored: Callable[[str], tuple[dict, list[str]]]
) -> dict[str, SessionFigures]:
    """Compare the replies with the database, per session.

    ``stored(session_id)`` gives the session's snapshot globals (``env.count``,
    ``env.said``) and the contents of its user messages in the message log, read
    straight from the database.
    """
    figures: dict[str, SessionFigures] = {}
    for session_id in sorted({r.session_id for r in replies}):
        mine = [r for r in replies if r.session_id == session_id]
        globals_, logged = stored(session_id)
        said: list[str] = list(globals_.get("env.said") or [])
        fig = figures[session_id] = SessionFigures(persisted=len(said))
        ok = [r for r in mine if r.kind == "ok"]
        fig.acknowledged = len(ok)
        for r in ok:
            if r.number is None or r.number > len(said) or said[r.number - 1] != r.question:
                fig.lost.append(f"{r.question!r} (count {r.number})")
        fig.double_applied += [q for q in set(said) if said.count(q) > 1]
        if globals_.get("env.count") != len(said) or sorted(logged) != sorted(said):
            fig.double_applied.append(
                f"count {globals_.get('env.count')}, {len(said)} questions kept, {len(logged)} logged"
            )
        saved = set(said)
        fig.refused_but_saved = [r.question for r in mine if r.kind in NOT_APPLIED and r.question in saved]
        fig.saved_unannounced = [
            r.question for r in mine if r.kind not in ("ok", "unknown", *NOT_APPLIED) and r.question in saved
        ]
    return figures


def stored_counter(query: Callable[..., list[tuple]]) -> Callable[[str], tuple[dict, list[str]]]:
    """``stored`` for :func:`check_sessions` from ``query(sql, *args)`` on the database."""

    def stored(session_id: str) -> tuple[dict, list[str]]:
        snapshot = query(STATE_SQL, session_id)[0][0]
        logged = query("SELECT content FROM message_log WHERE session_id = %s AND role = 'user'", session_id)
        return json.loads(snapshot)["globals"], [row[0] for row in logged]

    return stored
