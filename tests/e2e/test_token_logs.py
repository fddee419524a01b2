"""Tokens never reach a log, also when a client puts one in a URL path (issue 8 point 12).

``DELETE /system/tokens/<token>`` (the old form) still revokes; the access log only
ever sees ``sha256:<hash>``. Revoking by id (from the token list) works too.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Client

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def test_revoking_by_token_or_by_id_keeps_every_token_out_of_the_logs(deployment):
    token = deployment.token()
    server = deployment.server(workers=1, AGENTCANVAS_ACCESS_LOG="1")
    client = Client(server.url, token)
    made = [client.post("/system/tokens", json={}).json()["data"] for _ in range(2)]
    by_token, by_id = made[0]["token"], made[1]
    # A secret pasted into the wrong place, in no format the log scrubber knows.
    stray = "my-database-password-do-not-log"

    assert client.call("DELETE", f"/system/tokens/{by_token}").json()["data"] is True
    assert client.call("DELETE", f"/system/tokens/{by_id['id']}").json()["data"] is True
    assert client.call("DELETE", f"/system/tokens/{stray}").status_code == 404
    for gone in (by_token, by_id["token"]):
        assert Client(server.url, gone).get("/agents").status_code == 401
    server.stop()

    log = server.log()
    assert "DELETE /api/v1/system/tokens/sha256:" in log
    for secret in (token, by_token, by_id["token"], stray):
        assert secret not in log
