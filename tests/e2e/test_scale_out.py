"""Two server processes on one MariaDB (or one Postgres) database serving the same sessions at once."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import SAMPLES, Client, metric, read_sse, streamed_answer

pytestmark = pytest.mark.parametrize("database_url", ["mysql", "postgres"], indirect=True)

SESSIONS = 4
#: Turns fired at each session in the concurrent phase, half through each server.
TURNS = 30
ANSWER = re.compile(r"This is message number (\d+) in this session\. You said: (.*)")


def _turn(client: Client, agent_id: str, session_id: str, query: str, stream: bool) -> int | None:
    """One turn of the counter sample: the number it counted, or ``None`` for "busy"."""
    if stream:
        resp = client.ask_stream(agent_id, session_id, query)
    else:
        resp = client.ask(agent_id, session_id, query)
    if resp.status_code == 409:
        body = resp.json()
        assert body["code"] == 106 and "busy" in body["message"], body
        return None
    assert resp.status_code == 200, resp.text
    if stream:
        frames = read_sse(resp)
        assert frames[-1] == "[DONE]" and frames[-2]["event"] == "message_end", frames
        answer = streamed_answer(frames)
    else:
        answer = resp.json()["data"]["data"]["content"]
    match = ANSWER.fullmatch(answer)
    assert match and match.group(2) == query, answer
    return int(match.group(1))


def test_concurrent_turns_on_two_servers_complete_once_or_get_409(deployment):
    token = deployment.token()
    agent_id = deployment.import_agent(SAMPLES / "counter.json")
    servers = [deployment.server(workers=2).url for _ in range(2)]
    clients = [Client(url, token) for url in servers]
    session_ids = [clients[0].create_session(agent_id) for _ in range(SESSIONS)]
    first_version = {sid: clients[1].session(agent_id, sid)["version"] for sid in session_ids}
    # number counted -> the query of that turn, per session
    counted: dict[str, dict[int, str]] = {sid: {} for sid in session_ids}

    # One after the other: each server continues what the other one committed.
    for sid in session_ids:
        for i, client in enumerate(clients + clients):
            query = f"{sid[:8]} in turn {i}"
            assert _turn(client, agent_id, sid, query, stream=i % 2 == 0) == i + 1
            counted[sid][i + 1] = query

    # Blocking turns, one after the other, alternating: each server last committed the
    # session's turn before last and kept that row, so each of these first runs on a row
    # the other server has moved past, finds it so at its commit, and runs again from a read.
    # (Kept-alive connections: each server's turns reach one of its workers, so its third
    # turn here finds what its first kept.)
    sticky = [Client(url, token, keep_alive=True) for url in servers]
    for sid in session_ids:
        for i, client in enumerate(sticky + sticky, start=4):
            query = f"{sid[:8]} in turn {i}"
            assert _turn(client, agent_id, sid, query, stream=False) == i + 1
            counted[sid][i + 1] = query
    stale = [metric(server, "agentcanvas_canvas_cache_total", outcome="stale") for server in servers]
    assert min(stale) >= SESSIONS, stale

    # At once: per session one thread per server, all released together.
    barrier = threading.Barrier(SESSIONS * 2)

    def fire(server: int, sid: str) -> list[tuple[str, int | None]]:
        client = clients[server]
        barrier.wait(60)
        out = []
        for n in range(TURNS // 2):
            query = f"{sid[:8]} via {server} #{n}"
            out.append((query, _turn(client, agent_id, sid, query, stream=n % 2 == 1)))
        return out

    with ThreadPoolExecutor(SESSIONS * 2) as pool:
        jobs = {(server, sid): pool.submit(fire, server, sid) for sid in session_ids for server in (0, 1)}
        results = {key: job.result(timeout=300) for key, job in jobs.items()}

    busy = 0
    for (_, sid), outcomes in results.items():
        for query, number in outcomes:
            if number is None:
                busy += 1
                continue
            assert number not in counted[sid], f"turn number {number} of {sid} was counted twice"
            counted[sid][number] = query
    assert busy + sum(len(c) for c in counted.values()) == SESSIONS * (8 + TURNS)

    for sid in session_ids:
        done = len(counted[sid])
        # Every successful turn counted exactly one more: no number skipped, none repeated.
        assert sorted(counted[sid]) == list(range(1, done + 1))
        queries = [counted[sid][n] for n in range(1, done + 1)]
        for client in clients:
            session = client.session(agent_id, sid)
            assert session["round"] == done
            # One committed write per successful turn, none lost, none extra.
            assert session["version"] == first_version[sid] + done
            assert session["status"] == "idle" and session["last_error"] is None
            log = session["message"][1:]  # after the prologue
            assert [m["role"] for m in log] == ["user", "assistant"] * done
            assert [m["content"] for m in log[::2]] == queries
            assert [m["content"] for m in log[1::2]] == [
                f"This is message number {n} in this session. You said: {q}"
                for n, q in enumerate(queries, start=1)
            ]
            variables = client.get(f"/agents/{agent_id}/sessions/{sid}/variables").json()["data"]
            values = {v["name"]: v["value"] for v in variables}
            assert values == {"count": done, "said": queries}
