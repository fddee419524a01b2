"""``agentcanvas serve`` with several workers: revoked tokens, the access log."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import Client

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

#: Requests fired at once, each on its own connection, so both workers serve some.
FAN_OUT = 24


def _statuses(client: Client) -> set[int]:
    with ThreadPoolExecutor(8) as pool:
        return set(pool.map(lambda _: client.get("/agents").status_code, range(FAN_OUT)))


def test_a_revoked_token_is_refused_by_every_worker(deployment):
    server = deployment.server(workers=2)
    admin = Client(server.url, deployment.token())
    by_api, by_cli = Client(server.url, deployment.token()), Client(server.url, deployment.token())
    # Every worker has just seen (and may remember) both tokens.
    assert _statuses(by_api) == {200} and _statuses(by_cli) == {200}

    # Revoked through the server: refused at once, whichever worker answers.
    assert admin.call("DELETE", f"/system/tokens/{by_api.token}").status_code == 200
    assert _statuses(by_api) == {401}

    # Revoked by another process (the CLI): refused by every worker within a second.
    deployment.cli("token", "revoke", by_cli.token)
    time.sleep(1.0)
    assert _statuses(by_cli) == {401}
    assert _statuses(admin) == {200}


def test_the_access_log_is_off_unless_asked_for(deployment):
    quiet = deployment.server(workers=1)
    loud = deployment.server(workers=1, AGENTCANVAS_ACCESS_LOG="1")
    token = deployment.token()
    for server in (quiet, loud):
        assert Client(server.url, token).get("/agents").status_code == 200
    # (the log lines are JSON: the request line's quotes come escaped)
    assert "GET /api/v1/agents HTTP/1.1" not in quiet.log()
    assert "GET /api/v1/agents HTTP/1.1" in loud.log()
