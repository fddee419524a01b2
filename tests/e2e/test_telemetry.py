"""Metrics and logs of a real server with two gunicorn workers.

The metrics of every worker add up, whichever worker answers ``/metrics``; every log
line (gunicorn's access log included) is one JSON object, a turn's line carries its
``task_id`` and ``session_id``, and no API or embed token appears in any line.
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.e2e.conftest import SAMPLES, Client, metric, until

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def json_lines(log: str) -> list[dict]:
    lines = [line for line in log.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a log line is not JSON: {line!r}")
    return parsed


def test_metrics_add_up_across_two_workers_and_logs_are_json_without_tokens(deployment):
    token = deployment.token()
    embed_token = deployment.cli("token", "create", "--tenant", "e2e", "--embed").split()[-1]
    agent_id = deployment.import_agent(SAMPLES / "greeting.json")
    server = deployment.server(workers=2, AGENTCANVAS_ACCESS_LOG="1")
    client = Client(server.url, token)

    def turn_lines() -> list[dict]:
        return [line for line in json_lines(server.log()) if line["message"].startswith("turn ")]

    # Turns until both workers have served some (each worker logs the turns it ran): turns
    # on one kept-alive connection (one worker) take turns with turns on new connections,
    # which the server gives to the worker holding fewer connections: the other one.
    kept = Client(server.url, token, keep_alive=True)
    turns = 0
    while len({line["pid"] for line in turn_lines()}) < 2:
        assert turns < 200, "one worker served every turn"
        reply = (client if turns % 2 else kept).ask(agent_id, None, f"question {turns}")
        assert reply.status_code == 200, reply.text
        turns += 1
    until(lambda: len(turn_lines()) == turns, "every turn's log line")

    # Whichever worker answers, the counts are the sum over both.
    for _ in range(6):
        assert metric(server.url, "agentcanvas_turns_total", outcome="succeeded") == turns
        assert metric(server.url, "agentcanvas_turn_seconds_count", outcome="succeeded") == turns
        assert metric(server.url, "agentcanvas_leases_held") == 0

    # Requests that carry tokens where a careless log would print them.
    assert (
        requests.get(f"{server.url}/embed/agents/{agent_id}?auth={embed_token}", timeout=30).status_code
        == 200
    )
    wrong = token[:-4] + "abcd"
    assert Client(server.url, wrong).get("/agents").status_code == 401
    assert requests.get(f"{server.url}/api/v1/agents?token={token}", timeout=30).status_code == 401
    assert requests.get(f"{server.url}/healthz", timeout=30).json() == {"status": "ok"}
    server.stop()

    log = server.log()
    lines = json_lines(log)
    for line in turn_lines():
        assert len(line["task_id"]) == 32 and len(line["session_id"]) == 32, line
    assert any(line["logger"] == "gunicorn.access" for line in lines)
    for secret in (token, embed_token, wrong):
        assert secret not in log


def test_log_level_warning_leaves_out_the_turn_lines_not_the_counts(deployment):
    token = deployment.token()
    agent_id = deployment.import_agent(SAMPLES / "greeting.json")
    server = deployment.server(workers=1, AGENTCANVAS_LOG_LEVEL="warning")
    client = Client(server.url, token)
    for n in range(3):
        assert client.ask(agent_id, None, f"question {n}").status_code == 200
    assert metric(server.url, "agentcanvas_turns_total", outcome="succeeded") == 3
    lines = json_lines(server.log())
    assert not [line for line in lines if line["message"].startswith("turn ")]
    assert all(line["level"] != "info" for line in lines if line["logger"].startswith("agentcanvas"))
