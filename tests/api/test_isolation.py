"""Tenants are isolated: another tenant's things answer exactly like missing ones."""

from __future__ import annotations

from api.db import Session
from tests.api.conftest import Api, echo_dsl, sample


def _not_found(resp) -> dict:
    assert resp.status_code == 404, resp.get_json()
    assert resp.json["code"] == 102
    return resp.json


def test_every_resource_of_another_tenant_is_not_found(api: Api, other: Api):
    agent_id = api.create_agent(sample("counter"), title="private")
    session_id = api.create_session(agent_id)
    api.ask(agent_id, session_id, "mine")
    with api.app.app_context():
        task_id = Session.get_by_id(session_id).task_id
    version_id = api.get(f"/agents/{agent_id}").json["data"]["version_id"]
    before = api.session(agent_id, session_id, dsl="true")

    # The same message as for an id that never existed: nothing tells the agent exists.
    missing = _not_found(other.get("/agents/0123456789abcdef0123456789abcdef"))
    foreign = _not_found(other.get(f"/agents/{agent_id}"))
    assert foreign["message"] == missing["message"].replace("0123456789abcdef0123456789abcdef", agent_id)

    assert other.get("/agents", query_string={"title": "private"}).json["data"]["canvas"] == []
    assert other.get("/agents", query_string={"id": agent_id}).json["data"]["canvas"] == []
    _not_found(other.put(f"/agents/{agent_id}", json={"title": "stolen"}))
    _not_found(other.delete(f"/agents/{agent_id}"))
    _not_found(other.get(f"/agents/{agent_id}/versions"))
    _not_found(other.get(f"/agents/{agent_id}/versions/{version_id}"))
    _not_found(other.post(f"/agents/{agent_id}/sessions", json={}))
    _not_found(other.get(f"/agents/{agent_id}/sessions"))
    _not_found(other.get(f"/agents/{agent_id}/sessions/{session_id}"))
    _not_found(other.delete(f"/agents/{agent_id}/sessions", json={"ids": [session_id]}))
    _not_found(other.ask(agent_id, session_id, "theirs"))
    _not_found(other.ask(agent_id, None, "theirs"))
    _not_found(other.post("/agents/chat/completions", json={"agent_id": agent_id, "session_id": session_id}))
    _not_found(other.get(f"/agents/{agent_id}/sessions/{session_id}/variables"))
    _not_found(other.put(f"/agents/{agent_id}/sessions/{session_id}/variables/count", json={"value": 99}))
    _not_found(other.post(f"/tasks/{task_id}/cancel"))

    # Their own agent with my session id is no way in either.
    theirs = other.create_agent(echo_dsl(), title="private")
    _not_found(other.ask(theirs, session_id, "sneaky"))
    _not_found(other.get(f"/agents/{theirs}/sessions/{session_id}"))
    _not_found(other.get(f"/agents/{theirs}/sessions/{session_id}/variables"))
    assert other.delete(f"/agents/{theirs}/sessions", json={"ids": [session_id]}).status_code == 404

    # Nothing of mine changed.
    after = api.session(agent_id, session_id, dsl="true")
    assert after == before
    assert api.get(f"/agents/{agent_id}").json["data"]["title"] == "private"
    assert (
        len(api.get("/agents").json["data"]["canvas"]) == 1
        and len(other.get("/agents").json["data"]["canvas"]) == 1
    )


def test_tokens_of_another_tenant(api: Api, other: Api):
    mine = api.get("/system/tokens").json["data"]
    assert len(mine) == 1
    _not_found(other.delete(f"/system/tokens/{mine[0]['id']}"))
    _not_found(other.delete(f"/system/tokens/{api.token}"))
    assert api.get("/agents").status_code == 200
    assert [t["id"] for t in other.get("/system/tokens").json["data"]] != [mine[0]["id"]]
