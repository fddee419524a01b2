"""Deadlines in a real server process: a dripping endpoint cannot hold a turn (issue 8).

The endpoint sends one byte every half second (minutes for a whole answer); the turn
must end at its component timeout, at its ``max_seconds``, or at a cancel sent through
the API — and hang up on the endpoint.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.conftest import dsl_of
from tests.drip_server import DripServer
from tests.e2e.conftest import Client, read_sse, until

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
STOPPED_WITHIN = 10


@pytest.fixture
def drip(deployment):
    with DripServer(interval=0.5) as server:
        yield server


def _dsl(url: str, **params) -> dict:
    return dsl_of(
        {
            "Invoke:Drip": ("Invoke", {"url": url, "method": "get", **params}, ["Message:Out"]),
            "Message:Out": ("Message", {"content": ["got {Invoke:Drip@result}"]}, []),
        }
    )


def test_timeout_and_max_seconds_end_a_dripping_call(deployment, drip):
    client = Client(deployment.server(AGENTCANVAS_LIMITS_MAX_SECONDS="2").url, deployment.token())
    for params, expected in (
        ({"timeout": 1}, "'127.0.0.1' did not answer within 1 s (timeout)"),
        ({"timeout": 60}, "the turn ran longer than 2 s (limit max_seconds)"),
    ):
        agent_id = client.create_agent(f"drip {params}", _dsl(drip.url, **params))
        started = time.monotonic()
        resp = client.ask(agent_id, None, "go")
        assert time.monotonic() - started < STOPPED_WITHIN
        assert resp.status_code == 500, resp.text
        assert expected in resp.json()["message"]
    drip.wait_closed(2)


def test_a_cancel_through_the_api_stops_a_dripping_call(deployment, drip):
    client = Client(deployment.server().url, deployment.token())
    agent_id = client.create_agent("drip", _dsl(drip.url, timeout=120))
    session_id = client.create_session(agent_id)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(client.ask_stream, agent_id, session_id, "go")
        drip.wait_connections(1)
        task_id = until(lambda: client.session(agent_id, session_id)["task_id"], "the task id")
        cancelled_at = time.monotonic()
        assert client.post(f"/tasks/{task_id}/cancel").json()["data"]["cancelled"] is True
        frames = read_sse(running.result(timeout=60))
    assert time.monotonic() - cancelled_at < STOPPED_WITHIN
    assert frames[-2]["data"]["status"] == "cancelled"
    drip.wait_closed(1)
    # The session is free at once for the next turn.
    assert client.session(agent_id, session_id)["status"] == "idle"
