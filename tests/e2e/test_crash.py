"""A server killed with SIGKILL in the middle of a turn."""

from __future__ import annotations

import json

from tests.e2e.conftest import Client, slow_dsl, until

LEASE = {"AGENTCANVAS_SERVER_LEASE_SECONDS": "3"}
#: What a turn commits; the claim of a turn changes only its status, lease and task id.
COMMITTED = ("version", "round", "message", "dsl", "last_error", "pending_form", "total_tokens")


def _committed(session: dict) -> dict:
    return {key: session[key] for key in COMMITTED}


def test_killed_mid_turn_keeps_the_last_snapshot_until_the_lease_expires(deployment, slow_http):
    token = deployment.token()
    doomed = deployment.server(**LEASE)
    # Started now so that it can answer at once after the kill, while the lease lives.
    spare = Client(deployment.server(**LEASE).url, token)
    client = Client(doomed.url, token)
    agent_id = client.create_agent("slow", slow_dsl(slow_http.url))
    session_id = client.create_session(agent_id)
    first = client.ask(agent_id, session_id, "the first")
    assert first.status_code == 200, first.text
    assert first.json()["data"]["data"]["content"] == "working on the first\n\ndone 1"
    before = spare.session(agent_id, session_id, dsl=True)

    slow_http.gate.clear()
    stream = client.ask_stream(agent_id, session_id, "the doomed one")
    frame = next(line for line in stream.iter_lines(decode_unicode=True) if line)
    assert json.loads(frame[len("data:") :])["data"]["content"].startswith("working on ")
    slow_http.wait_hits(2)
    assert spare.session(agent_id, session_id)["status"] == "running"
    doomed.kill()
    stream.close()

    # The dead turn's lease still holds the session for a while: busy, not lost.
    busy = spare.ask(agent_id, session_id, "too early")
    assert busy.status_code == 409 and busy.json()["code"] == 106
    assert _committed(spare.session(agent_id, session_id, dsl=True)) == _committed(before)

    restarted = Client(deployment.server(**LEASE).url, token)
    slow_http.gate.set()

    def next_turn():
        resp = restarted.ask(agent_id, session_id, "after the crash")
        if resp.status_code == 409:
            assert resp.json()["code"] == 106, resp.text
            return None
        assert resp.status_code == 200, resp.text
        return resp.json()

    done = until(next_turn, "the dead turn's lease to expire", seconds=60, step=0.2)
    assert done["data"]["data"]["content"] == "working on after the crash\n\ndone 3"

    after = restarted.session(agent_id, session_id, dsl=True)
    assert after["status"] == "idle"
    assert after["version"] == before["version"] + 1
    assert after["round"] == before["round"] + 1
    assert after["message"][: len(before["message"])] == before["message"]
    added = after["message"][len(before["message"]) :]
    assert [(m["role"], m["content"]) for m in added] == [
        ("user", "after the crash"),
        ("assistant", "working on after the crash\n\ndone 3"),
    ]
    assert not any("doomed" in m["content"] for m in after["message"])
