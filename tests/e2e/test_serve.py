"""``agentcanvas serve`` with several workers: revoked tokens, the access log."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.conftest import echo_dsl
from tests.e2e.conftest import Client

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

#: Requests fired at once, each on its own connection, so both workers serve some.
FAN_OUT = 24


def _statuses(client: Client, agent_id: str | None = None) -> set[int]:
    """The statuses of FAN_OUT requests at once: listings, or with ``agent_id`` completions
    (answered in front of Flask: api.blueprints.completions.CompletionLane)."""

    def one(_: int) -> int:
        if agent_id is None:
            return client.get("/agents").status_code
        return client.ask(agent_id, None, "hi").status_code

    with ThreadPoolExecutor(8) as pool:
        return set(pool.map(one, range(FAN_OUT)))


def test_a_revoked_token_is_refused_by_every_worker(deployment):
    server = deployment.server(workers=2)
    admin = Client(server.url, deployment.token())
    by_api, by_cli = Client(server.url, deployment.token()), Client(server.url, deployment.token())
    agents = {c.token: c.create_agent(f"echo-{n}", echo_dsl()) for n, c in enumerate((by_api, by_cli))}
    # Every worker has just seen (and may remember) both tokens.
    for client in (by_api, by_cli):
        assert _statuses(client) == {200} and _statuses(client, agents[client.token]) == {200}

    # Revoked through the server: refused at once, whichever worker answers.
    assert admin.call("DELETE", f"/system/tokens/{by_api.token}").status_code == 200
    assert _statuses(by_api) == {401} and _statuses(by_api, agents[by_api.token]) == {401}

    # Revoked by another process (the CLI): refused by every worker within a second.
    deployment.cli("token", "revoke", by_cli.token)
    time.sleep(1.0)
    assert _statuses(by_cli) == {401} and _statuses(by_cli, agents[by_cli.token]) == {401}
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
