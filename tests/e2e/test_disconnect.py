"""A client that goes away in the middle of a streamed turn does not lose the turn."""

from __future__ import annotations

import json

from tests.e2e.conftest import Client, slow_dsl, until


def test_a_client_gone_mid_stream_does_not_lose_the_turn(deployment, slow_http):
    client = Client(deployment.server().url, deployment.token())
    agent_id = client.create_agent("slow", slow_dsl(slow_http.url))
    session_id = client.create_session(agent_id)
    before = client.session(agent_id, session_id)

    slow_http.gate.clear()
    stream = client.ask_stream(agent_id, session_id, "walk away")
    frame = next(line for line in stream.iter_lines(decode_unicode=True) if line)
    assert json.loads(frame[len("data:") :])["data"]["content"] == "working on walk away"
    slow_http.wait_hits(1)
    stream.close()  # the client leaves while the turn waits for the slow endpoint
    slow_http.gate.set()

    def committed():
        session = client.session(agent_id, session_id)
        return session if session["round"] == 1 and session["status"] == "idle" else None

    after = until(committed, "the abandoned turn to be committed")
    assert after["version"] == before["version"] + 1 and after["last_error"] is None
    assert [(m["role"], m["content"]) for m in after["message"]] == [
        ("assistant", "Hi!"),
        ("user", "walk away"),
        ("assistant", "working on walk away\n\ndone 1"),
    ]

    # The conversation goes on from there.
    resp = client.ask(agent_id, session_id, "back again")
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"]["data"]["content"] == "working on back again\n\ndone 2"
    assert client.session(agent_id, session_id)["round"] == 2
