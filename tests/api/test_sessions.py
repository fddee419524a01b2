"""Sessions over REST: creation with the prologue, pinning to a version, list, get, delete."""

from __future__ import annotations

from tests.api.conftest import Api, echo_dsl, sample


def test_new_session_carries_the_prologue_and_agent_id(api: Api):
    agent_id = api.create_agent(sample("greeting"))
    resp = api.post(f"/agents/{agent_id}/sessions", json={"name": "chat 1", "user_id": "u-7"})
    data = resp.json["data"]
    assert resp.json["code"] == 0
    assert data["agent_id"] == agent_id and data["id"]
    assert data["message"] == [
        {
            "role": "assistant",
            "content": sample("greeting")["components"]["begin"]["obj"]["params"]["prologue"],
        }
    ]
    assert data["name"] == "chat 1" and data["user_id"] == "u-7"
    assert data["status"] == "idle" and data["round"] == 0


def test_sessions_stay_on_the_version_they_started_with(api: Api):
    agent_id = api.create_agent(echo_dsl("old: {sys.query}"))
    old_session = api.create_session(agent_id)
    api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl("new: {sys.query}")})
    new_session = api.create_session(agent_id)

    assert api.ask(agent_id, old_session, "a").json["data"]["data"]["content"] == "old: a"
    assert api.ask(agent_id, new_session, "b").json["data"]["data"]["content"] == "new: b"
    # ...and a turn later still.
    assert api.ask(agent_id, old_session, "c").json["data"]["data"]["content"] == "old: c"

    versions = api.get(f"/agents/{agent_id}/versions").json["data"]
    assert api.session(agent_id, old_session)["agent_version_id"] == versions[1]["id"]
    assert api.session(agent_id, new_session)["agent_version_id"] == versions[0]["id"]


def test_get_session_has_the_transcript(api: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    api.ask(agent_id, session_id, "one")
    api.ask(agent_id, session_id, "two")
    data = api.session(agent_id, session_id)
    assert [(m["role"], m["content"]) for m in data["message"]] == [
        ("assistant", "Hi!"),
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
        ("assistant", "echo: two"),
    ]
    assert data["round"] == 2 and data["version"] == 3
    assert "dsl" not in data
    with_dsl = api.session(agent_id, session_id, dsl="true")
    assert with_dsl["dsl"]["history"][-1] == ["assistant", "echo: two"]


def test_list_sessions(api: Api):
    agent_id = api.create_agent(echo_dsl())
    first = api.create_session(agent_id, user_id="alice")
    second = api.create_session(agent_id, user_id="bob")
    listed = api.get(
        f"/agents/{agent_id}/sessions", query_string={"orderby": "create_time", "desc": "False"}
    ).json
    assert listed["code"] == 0 and listed["total"] == 2
    assert [s["id"] for s in listed["data"]] == [first, second]
    assert all(s["agent_id"] == agent_id and "dsl" not in s for s in listed["data"])
    only_bob = api.get(f"/agents/{agent_id}/sessions", query_string={"user_id": "bob"}).json["data"]
    assert [s["id"] for s in only_bob] == [second]
    by_id = api.get(f"/agents/{agent_id}/sessions", query_string={"id": first, "dsl": "True"}).json["data"]
    assert [s["id"] for s in by_id] == [first] and "components" in by_id[0]["dsl"]
    with_messages = api.get(f"/agents/{agent_id}/sessions", query_string={"messages": "true"}).json["data"]
    assert all(s["message"][0]["content"] == "Hi!" for s in with_messages)


def test_delete_sessions_reports_each_bad_id(api: Api):
    agent_id = api.create_agent(echo_dsl())
    keep, drop1, drop2 = (api.create_session(agent_id) for _ in range(3))
    api.ask(agent_id, drop1, "hello")

    resp = api.delete(f"/agents/{agent_id}/sessions", json={"ids": [drop1, "nope", drop2]})
    assert resp.json["code"] == 0
    assert resp.json["data"]["success_count"] == 2
    assert any("'nope'" in e for e in resp.json["data"]["errors"])
    remaining = [s["id"] for s in api.get(f"/agents/{agent_id}/sessions").json["data"]]
    assert remaining == [keep]
    assert api.get(f"/agents/{agent_id}/sessions/{drop1}").status_code == 404

    resp = api.delete(f"/agents/{agent_id}/sessions", json={"ids": ["nope"]})
    assert resp.status_code == 404 and resp.json["code"] == 102
    resp = api.delete(f"/agents/{agent_id}/sessions", json={"ids": "nope"})
    assert resp.status_code == 400 and "ids" in resp.json["message"]
    resp = api.delete(f"/agents/{agent_id}/sessions", json={})
    assert resp.status_code == 400


def test_session_routes_refuse_bad_input(api: Api):
    agent_id = api.create_agent(echo_dsl())
    resp = api.post(f"/agents/{agent_id}/sessions", json={"name": 5})
    assert resp.status_code == 400 and "'name'" in resp.json["message"]
    resp = api.post(f"/agents/{agent_id}/sessions", json={"user_id": "u" * 256})
    assert resp.status_code == 400 and "'user_id'" in resp.json["message"] and "255" in resp.json["message"]
    resp = api.put(f"/agents/{agent_id}/sessions", json={})
    assert resp.status_code == 405 and "DELETE" in resp.json["message"]
    resp = api.post(f"/agents/{agent_id}/sessions", data="{", content_type="application/json")
    assert resp.status_code == 400 and "JSON" in resp.json["message"]
    resp = api.post("/agents/nope/sessions", json={})
    assert resp.status_code == 404 and resp.json["code"] == 102
    assert api.get(f"/agents/{agent_id}/sessions").json["data"] == []
    resp = api.get(f"/agents/{agent_id}/sessions/nope")
    assert resp.status_code == 404 and resp.json["code"] == 102


def test_deleting_the_agent_deletes_its_sessions(api: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    api.delete(f"/agents/{agent_id}")
    assert api.get(f"/agents/{agent_id}/sessions/{session_id}").status_code == 404
    from api.db import MessageLog, Session
    from api.services.retention import RetentionSettings, sweep

    with api.app.app_context():
        assert Session.select().where(Session.id == session_id).count() == 0
        # Its messages go with the sweep.
        assert sweep(RetentionSettings()).purged == 1
        assert MessageLog.select().where(MessageLog.session_id == session_id).count() == 0
