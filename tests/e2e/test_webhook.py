"""The webhook trigger over real HTTP (a real server process): Begin in webhook mode,
its authentication (token, basic, none), size limit, schema, both execution modes,
and every run in ``/webhook/logs``."""

from __future__ import annotations

import requests

from tests.e2e.conftest import HTTP_TIMEOUT, Client, until


def webhook_dsl(security: dict, **params) -> dict:
    begin = {
        "mode": "Webhook",
        "methods": ["POST", "GET"],
        "security": security,
        "schema": {
            "query": {},
            "headers": {},
            "body": {
                "type": "object",
                "properties": {"order": {"type": "number"}, "note": {"type": "string"}},
                "required": ["order"],
            },
        },
        **params,
    }
    return {
        "components": {
            "begin": {
                "obj": {"component_name": "Begin", "params": begin},
                "downstream": ["Message:Out"],
                "upstream": [],
            },
            "Message:Out": {
                "obj": {
                    "component_name": "Message",
                    "params": {
                        "content": [
                            "order {begin@body.order} by {begin@method}: {begin@body.note} {begin@query.src}"
                        ]
                    },
                },
                "downstream": [],
                "upstream": ["begin"],
            },
        },
        "path": [],
        "history": [],
        "retrieval": [],
    }


TOKEN_SECURITY = {
    "auth_type": "token",
    "token": {"token_header": "X-Hook-Token", "token_value": "hook-secret"},
    "max_body_size": "1KB",
}


def test_webhook_runs_the_agent_with_its_auth_limits_and_logs(deployment):
    server = deployment.server()
    api = Client(server.url, deployment.token())
    waiting = api.create_agent("hook-wait", webhook_dsl(TOKEN_SECURITY, execution_mode="Streaming"))
    url = f"{server.url}/api/v1/agents/{waiting}/webhook"

    # Token auth: refused without it, run with it; the answer waits for the run.
    assert requests.post(url, json={"order": 1}, timeout=HTTP_TIMEOUT).status_code == 401
    resp = requests.post(
        url,
        params={"src": "shop"},
        json={"order": "42", "note": "rush"},
        headers={"X-Hook-Token": "hook-secret"},
        timeout=HTTP_TIMEOUT,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"message": "order 42 by POST: rush shop", "success": True, "code": 200}

    # Bad input is refused before anything runs: schema, size, method.
    hdr = {"X-Hook-Token": "hook-secret"}
    resp = requests.post(url, json={"note": "no order"}, headers=hdr, timeout=HTTP_TIMEOUT)
    assert resp.status_code == 400 and "body is missing required field 'order'" in resp.json()["message"]
    resp = requests.post(url, json={"order": 1, "note": "x" * 2000}, headers=hdr, timeout=HTTP_TIMEOUT)
    assert resp.status_code == 413 and "max_body_size" in resp.json()["message"]
    resp = requests.delete(url, headers=hdr, timeout=HTTP_TIMEOUT)
    assert resp.status_code == 400 and "HTTP method 'DELETE' is not allowed" in resp.json()["message"]

    # The run is in the log, with its events; the token is not.
    since = 0.0
    first = api.get(f"/agents/{waiting}/webhook/logs", params={"since_ts": since}).json()["data"]
    assert first["webhook_id"] and first["events"] == []
    run = api.get(
        f"/agents/{waiting}/webhook/logs",
        params={"since_ts": first["next_since_ts"], "webhook_id": first["webhook_id"]},
    ).json()["data"]
    assert run["finished"] is True and run["status"] == "succeeded"
    kinds = [e["event"] for e in run["events"]]
    assert kinds[0] == "workflow_started" and kinds[-1] == "finished" and "message_end" in kinds
    assert "hook-secret" not in str(run)
    recent = api.get(f"/agents/{waiting}/webhook/logs", params={"recent": "true"}).json()["data"]
    assert len(recent) == 1 and recent[0]["method"] == "POST"
    # Another tenant cannot read the log.
    stranger = Client(server.url, deployment.token("someone-else"))
    assert stranger.get(f"/agents/{waiting}/webhook/logs", params={"since_ts": 0}).status_code == 404


def test_immediate_mode_answers_at_once_and_runs_in_the_background(deployment):
    server = deployment.server(AGENTCANVAS_RATE_LIMIT_WEBHOOK="3/minute")
    api = Client(server.url, deployment.token())
    basic = {"auth_type": "basic", "basic_auth": {"username": "hook", "password": "pw"}}
    response = {"status": 202, "body_template": '{"accepted": true}'}
    agent = api.create_agent("hook-now", webhook_dsl(basic, response=response))
    url = f"{server.url}/api/v1/agents/{agent}/webhook"
    assert (
        requests.post(url, json={"order": 7}, auth=("hook", "wrong"), timeout=HTTP_TIMEOUT).status_code == 401
    )
    resp = requests.post(url, json={"order": 7, "note": "later"}, auth=("hook", "pw"), timeout=HTTP_TIMEOUT)
    assert resp.status_code == 202 and resp.json() == {"accepted": True}

    def finished_run():
        recent = api.get(f"/agents/{agent}/webhook/logs", params={"recent": "true"}).json()["data"]
        return recent if recent and recent[0]["status"] != "running" else None

    (run,) = until(finished_run, "the background webhook run to be logged")
    assert run["status"] == "succeeded"
    session = api.session(agent, run["session_id"])
    assert session["message"][-1]["content"] == "order 7 by POST: later "

    # No security object at all: refused, as RAGFlow; anonymous needs the explicit opt-in.
    open_agent = api.create_agent("hook-open", webhook_dsl({"auth_type": "none"}))
    resp = requests.post(
        f"{server.url}/api/v1/agents/{open_agent}/webhook", json={"order": 1}, timeout=HTTP_TIMEOUT
    )
    assert resp.status_code == 403 and "allow_anonymous" in resp.json()["message"]
    anon = api.create_agent(
        "hook-anon", webhook_dsl({"auth_type": "none", "allow_anonymous": True}, execution_mode="wait")
    )
    resp = requests.get(
        f"{server.url}/api/v1/agents/{anon}/webhook",
        params={"src": "q"},
        json={"order": 3},
        timeout=HTTP_TIMEOUT,
    )
    assert resp.status_code == 200 and resp.json()["message"] == "order 3 by GET:  q"
    # Rate-limited per agent (AGENTCANVAS_RATE_LIMIT_WEBHOOK=3/minute): the 4th call waits.
    codes = [
        requests.post(f"{server.url}/api/v1/agents/{anon}/webhook", json={"order": 4}, timeout=HTTP_TIMEOUT)
        for _ in range(3)
    ]
    assert [r.status_code for r in codes] == [200, 200, 429] and codes[-1].headers["Retry-After"]
    # An agent without a webhook Begin.
    dsl = webhook_dsl({})
    dsl["components"]["begin"]["obj"]["params"]["mode"] = "conversational"
    plain = api.create_agent("no-hook", dsl)
    resp = requests.post(f"{server.url}/api/v1/agents/{plain}/webhook", json={}, timeout=HTTP_TIMEOUT)
    assert resp.status_code == 400 and "set its Begin's mode to 'Webhook'" in resp.json()["message"]
