"""Rate limits are counted across the workers of a server: in the database, or in Redis."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import Client

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

LIMIT = 5


@pytest.mark.parametrize("storage", ["", "redis://127.0.0.1:6379/0"], ids=["database", "redis"])
def test_two_workers_share_one_count(deployment, storage):
    token = deployment.token()
    server = deployment.server(
        workers=2,
        AGENTCANVAS_RATE_LIMIT_API=f"{LIMIT}/minute",
        AGENTCANVAS_RATE_LIMIT_STORAGE=storage,
        AGENTCANVAS_ACCESS_LOG="1",
    )
    client = Client(server.url, token)

    def serving_workers() -> set[int]:
        lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
        return {line["pid"] for line in lines if line["logger"] == "gunicorn.access"}

    # Requests on one kept-alive connection (one worker) take turns with requests on new
    # connections, which the server gives to the worker holding fewer connections
    # (api/connection_balance.py): the other one. Go on until both workers have answered
    # some (with a count per worker, up to twice the limit would pass).
    kept = Client(server.url, token, keep_alive=True)
    statuses = []
    while len(statuses) < 2 * LIMIT or len(serving_workers()) < 2:
        assert len(statuses) < 200, "one worker answered every request"
        statuses.append((client if len(statuses) % 2 else kept).get("/agents").status_code)
    assert statuses[:LIMIT] == [200] * LIMIT and set(statuses[LIMIT:]) == {429}, statuses
    refused = client.get("/agents")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
