"""Bad requests over real HTTP (gunicorn in front): clear errors, nothing stored."""

from __future__ import annotations

import json

import pytest
import requests

from tests.api.conftest import sample
from tests.e2e.conftest import Client

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

LIMIT = 64 * 1024


@pytest.fixture
def client(deployment) -> Client:
    server = deployment.server(AGENTCANVAS_LIMITS_MAX_BODY_BYTES=str(LIMIT))
    return Client(server.url, deployment.token())


def _error(resp: requests.Response, status: int, code: int) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["code"] == code, body
    return body["message"]


def test_bad_requests_get_clear_errors_and_store_nothing(client):
    dsl = sample("greeting")
    headers = {"Content-Type": "application/json"}
    message = _error(client.post("/agents", data='{"title": "x", "dsl": ', headers=headers), 400, 101)
    assert "not valid JSON" in message
    assert "'dsl'" in _error(client.post("/agents", json={"title": "x"}), 400, 101)
    assert "'title'" in _error(client.post("/agents", json={"title": 5, "dsl": dsl}), 400, 101)

    padded = {"title": "big", "dsl": {**dsl, "graph": {"notes": "x" * LIMIT}}}
    too_large = f"larger than {LIMIT} bytes"
    assert too_large in _error(client.post("/agents", json=padded), 413, 101)
    # The same body sent chunked, without a Content-Length to refuse it by.
    raw = json.dumps(padded).encode()
    chunks = iter([raw[i : i + 8192] for i in range(0, len(raw), 8192)])
    assert too_large in _error(client.post("/agents", data=chunks, headers=headers), 413, 101)
    assert client.get("/agents").json()["data"]["canvas"] == []

    _error(requests.get(f"{client.base_url}/api/v1/agents", timeout=30), 401, 401)
    missing = "0" * 32
    assert missing in _error(client.get(f"/agents/{missing}"), 404, 102)
    agent_id = client.create_agent("greeting", dsl)
    assert missing in _error(client.ask(agent_id, missing, "hi"), 404, 102)
    assert "'stream'" in _error(client.ask(agent_id, None, "hi", stream="maybe"), 400, 101)
    assert client.get(f"/agents/{agent_id}/sessions").json()["data"] == []


def test_malformed_values_are_400s_naming_the_field_and_the_session_stays(client):
    """Deep nesting, lone surrogates and huge numbers were 500s (issue 8 point 8)."""
    headers = {"Content-Type": "application/json"}
    deep = _error(client.post("/agents", data="[" * 60000, headers=headers), 400, 101)
    assert "nested more than" in deep
    deep_inside = '{"title": "x", "dsl": ' + "[" * 5000 + "]" * 5000 + "}"
    assert "nested more than" in _error(client.post("/agents", data=deep_inside, headers=headers), 400, 101)

    agent_id = client.create_agent("greeting", sample("greeting"))
    session_id = client.create_session(agent_id)
    before = client.session(agent_id, session_id)
    lone = '{"question": "hi \\ud800", "stream": false, "session_id": "SID"}'.replace("SID", session_id)
    message = _error(client.post(f"/agents/{agent_id}/completions", data=lone, headers=headers), 400, 101)
    assert "'question'" in message and "surrogate" in message
    named = '{"name": "\\udc00 name"}'
    assert "'name'" in _error(
        client.post(f"/agents/{agent_id}/sessions", data=named, headers=headers), 400, 101
    )
    nested = '{"question": "hi", "stream": false, "inputs": {"city": {"value": "\\ud800"}}}'
    message = _error(client.post(f"/agents/{agent_id}/completions", data=nested, headers=headers), 400, 101)
    assert "'inputs.city.value'" in message
    # A valid surrogate pair (an emoji written as an escape) is fine.
    emoji = '{"question": "hi \\ud83d\\ude00", "stream": false, "session_id": "SID"}'.replace(
        "SID", session_id
    )
    assert client.post(f"/agents/{agent_id}/completions", data=emoji, headers=headers).status_code == 200
    huge = '{"question": "hi", "stream": false, "user_id": 99999999999999999999999}'
    assert "'user_id'" in _error(
        client.post(f"/agents/{agent_id}/completions", data=huge, headers=headers), 400, 101
    )
    assert "NaN" in _error(
        client.post(f"/agents/{agent_id}/completions", data='{"x": NaN}', headers=headers), 400, 101
    )

    for path in ("/agents", f"/agents/{agent_id}/sessions"):
        for param in ("page", "page_size"):
            message = _error(client.get(path, params={param: "99999999999999999999"}), 400, 101)
            assert f"{param!r}" in message
    after = client.session(agent_id, session_id)
    assert after["round"] == before["round"] + 1  # only the emoji turn ran
