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

    _error(requests.get(f"{client.base_url}/api/v1/agents", timeout=30), 401, 109)
    missing = "0" * 32
    assert missing in _error(client.get(f"/agents/{missing}"), 404, 102)
    agent_id = client.create_agent("greeting", dsl)
    assert missing in _error(client.ask(agent_id, missing, "hi"), 404, 102)
    assert "'stream'" in _error(client.ask(agent_id, None, "hi", stream="maybe"), 400, 101)
    assert client.get(f"/agents/{agent_id}/sessions").json()["data"] == []
