"""Cancelling a turn that runs in another server process (the flag lives in MariaDB)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.conftest import dsl_of
from tests.e2e.conftest import Client, read_sse, until

pytestmark = pytest.mark.parametrize("database_url", ["mysql"], indirect=True)

#: A bound for a turn that nobody cancels: 300 rounds of Invoke and Switch.
STEPS = {"AGENTCANVAS_LIMITS_MAX_STEPS": "600"}


def _looping_dsl(url: str) -> dict:
    """Calls ``url`` again and again until the query is "stop" (bounded by the step limit)."""
    again = {
        "logical_operator": "and",
        "items": [{"cpn_id": "sys.query", "operator": "≠", "value": "stop"}],
        "to": ["Invoke:Slow"],
    }
    return dsl_of(
        {
            "Invoke:Slow": ("Invoke", {"url": url, "method": "get"}, ["Switch:Again"]),
            "Switch:Again": (
                "Switch",
                {"conditions": [again], "end_cpn_ids": ["Message:Done"]},
                ["Invoke:Slow", "Message:Done"],
            ),
            "Message:Done": ("Message", {"content": ["stopped after call {Invoke:Slow@result.n}"]}, []),
        }
    )


def _running_task(client: Client, agent_id: str, session_id: str) -> str:
    def task():
        session = client.session(agent_id, session_id)
        return session["status"] == "running" and session["task_id"]

    return until(task, "the turn to run")


@pytest.mark.parametrize("stream", [False, True], ids=["blocking", "streamed"])
def test_cancel_on_another_server_ends_the_turn_and_does_not_stick(deployment, slow_http, stream):
    slow_http.delay = 0.05
    token = deployment.token()
    runner = Client(deployment.server(**STEPS).url, token)
    other = Client(deployment.server(**STEPS).url, token)
    agent_id = runner.create_agent("looping", _looping_dsl(slow_http.url))
    session_id = runner.create_session(agent_id)
    before = other.session(agent_id, session_id)

    with ThreadPoolExecutor(1) as pool:
        ask = runner.ask_stream if stream else runner.ask
        running = pool.submit(ask, agent_id, session_id, "keep going")
        slow_http.wait_hits(2, "the loop to go round")
        task_id = _running_task(other, agent_id, session_id)
        cancel = other.post(f"/tasks/{task_id}/cancel")
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["data"] == {"task_id": task_id, "session_id": session_id, "cancelled": True}
        resp = running.result(timeout=120)

    if stream:
        frames = read_sse(resp)
        assert frames[-1] == "[DONE]"
        ending = frames[-2]
    else:
        assert resp.status_code == 409 and resp.json()["code"] == 103, resp.text
        ending = resp.json()["data"]
    assert ending["event"] == "workflow_finished"
    assert ending["data"]["status"] == "cancelled" and "cancel" in ending["data"]["content"]

    cancelled = other.session(agent_id, session_id)
    assert cancelled["status"] == "idle" and "cancel" in cancelled["last_error"]
    assert cancelled["round"] == 0 and cancelled["message"] == before["message"]
    # The task is over: a second cancel finds nothing to stop, and leaves no flag behind.
    late = other.post(f"/tasks/{task_id}/cancel")
    assert late.status_code == 200 and late.json()["data"]["cancelled"] is False

    # The next turn, on the server whose turn was cancelled, runs to its end.
    calls = slow_http.hits
    done = runner.ask(agent_id, session_id, "stop")
    assert done.status_code == 200, done.text
    assert done.json()["data"]["data"]["content"] == f"stopped after call {calls + 1}"
    finished = other.session(agent_id, session_id)
    assert finished["round"] == 1 and finished["last_error"] is None
    assert [m["content"] for m in finished["message"][-2:]] == ["stop", f"stopped after call {calls + 1}"]
