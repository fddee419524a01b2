"""Routes current RAGFlow has (ragflow-sdk 0.27 and RAGFlow's own HTTP tests call them):
deleting one or all sessions, templates, a component's input form, unknown routes, and
the unauthenticated reply."""

from __future__ import annotations

import json

from tests.api.conftest import ROOT, Api, echo_dsl, sample


def _session_ids(api: Api, agent_id: str) -> set[str]:
    return {s["id"] for s in api.get(f"/agents/{agent_id}/sessions").json["data"]}


def test_delete_all_sessions_of_one_agent(api: Api, other: Api):
    agent_id = api.create_agent(echo_dsl(), title="many")
    kept_agent = api.create_agent(echo_dsl(), title="kept")
    made = {api.create_session(agent_id) for _ in range(3)}
    api.ask(agent_id, next(iter(made)), "a message to delete too")
    kept = api.create_session(kept_agent)
    assert _session_ids(api, agent_id) == made

    # Another tenant cannot, and learns nothing.
    resp = other.delete(f"/agents/{agent_id}/sessions", json={"delete_all": True})
    assert resp.status_code == 404 and resp.json["code"] == 102
    assert _session_ids(api, agent_id) == made

    # What ragflow-sdk 0.27 sends for delete_sessions(delete_all=True).
    resp = api.delete(f"/agents/{agent_id}/sessions", json={"ids": None, "delete_all": True})
    assert resp.status_code == 200 and resp.json["code"] == 0
    assert resp.json["data"] == {"success_count": 3}
    assert _session_ids(api, agent_id) == set()
    assert _session_ids(api, kept_agent) == {kept}
    for sid in made:
        assert api.get(f"/agents/{agent_id}/sessions/{sid}").status_code == 404
    # Again: nothing left, nothing wrong.
    resp = api.delete(f"/agents/{agent_id}/sessions", json={"delete_all": True})
    assert resp.status_code == 200 and resp.json["data"] == {"success_count": 0}


def test_delete_sessions_needs_ids_or_delete_all_and_not_both(api: Api):
    agent_id = api.create_agent(echo_dsl())
    sid = api.create_session(agent_id)
    for body in ({}, {"ids": None}, {"ids": []}, {"delete_all": False}):
        resp = api.delete(f"/agents/{agent_id}/sessions", json=body)
        assert resp.status_code == 400 and "delete_all" in resp.json["message"], body
    resp = api.delete(f"/agents/{agent_id}/sessions", json={"ids": [sid], "delete_all": True})
    assert resp.status_code == 400 and "not both" in resp.json["message"]
    resp = api.delete(f"/agents/{agent_id}/sessions", json={"delete_all": "sure"})
    assert resp.status_code == 400 and "delete_all" in resp.json["message"]
    assert _session_ids(api, agent_id) == {sid}


def test_delete_one_session_by_its_path(api: Api, other: Api):
    agent_id = api.create_agent(echo_dsl())
    gone, kept = api.create_session(agent_id), api.create_session(agent_id)
    assert other.delete(f"/agents/{agent_id}/sessions/{gone}").status_code == 404

    resp = api.delete(f"/agents/{agent_id}/sessions/{gone}")
    assert resp.status_code == 200 and resp.json == {"code": 0, "message": "success", "data": True}
    assert _session_ids(api, agent_id) == {kept}
    resp = api.delete(f"/agents/{agent_id}/sessions/{gone}")
    assert resp.status_code == 404 and resp.json["code"] == 102 and gone in resp.json["message"]
    # A session of another agent is not found through this one.
    other_agent = api.create_agent(echo_dsl())
    assert api.delete(f"/agents/{other_agent}/sessions/{kept}").status_code == 404
    assert _session_ids(api, agent_id) == {kept}


def test_templates_are_the_bundled_samples(api: Api):
    resp = api.get("/agents/templates")
    assert resp.status_code == 200 and resp.json["code"] == 0
    by_id = {t["id"]: t for t in resp.json["data"]}
    assert set(by_id) == {p.stem for p in (ROOT / "samples").glob("*.json")}
    counter = by_id["counter"]
    export = json.loads((ROOT / "samples" / "counter.json").read_text())
    assert counter["title"] == export["title"] == "Counter"
    assert counter["description"] == export["description"]
    assert counter["dsl"] == sample("counter")
    # A template is ready to use as is.
    made = api.post("/agents", json={"title": "from template", "dsl": counter["dsl"]})
    assert made.status_code == 200


def test_input_form_of_a_component(api: Api, other: Api):
    agent_id = api.create_agent(sample("intake_form"), title="intake")
    resp = api.get(f"/agents/{agent_id}/components/UserFillUp:Intake/input-form")
    assert resp.status_code == 200 and resp.json["code"] == 0
    form = resp.json["data"]
    assert list(form) == ["name", "age", "plan", "notes"]
    assert form["age"]["type"] == "integer" and form["age"]["optional"] is False
    assert form["plan"]["options"] == ["basic", "pro"]
    assert form["notes"]["optional"] is True
    # Begin declares a form too (empty here); a Message declares none.
    assert api.get(f"/agents/{agent_id}/components/begin/input-form").json["data"] == {}
    assert api.get(f"/agents/{agent_id}/components/Message:Minor/input-form").json["data"] == {}

    resp = api.get(f"/agents/{agent_id}/components/Nope:Nothing/input-form")
    assert resp.status_code == 404 and "Nope:Nothing" in resp.json["message"]
    resp = other.get(f"/agents/{agent_id}/components/UserFillUp:Intake/input-form")
    assert resp.status_code == 404 and resp.json["code"] == 102


def test_unknown_routes_answer_json_naming_the_path(api: Api):
    for method, path in (("GET", "/api/v1/agentz"), ("POST", "/nowhere/at/all"), ("GET", "/api/v2/agents")):
        resp = api.client.open(path, method=method, headers=api.headers())
        assert resp.status_code == 404 and resp.is_json, (method, path)
        assert resp.json["error"] == "Not Found" and resp.json["code"] == 404
        assert path in resp.json["message"]


def test_no_or_a_bad_token_is_body_code_401_as_current_ragflow(api: Api):
    no_token = api.client.get("/api/v1/agents")
    assert no_token.status_code == 401 and no_token.json["code"] == 401
    bad = api.client.get("/api/v1/agents", headers={"Authorization": "Bearer not-a-token"})
    assert bad.status_code == 401 and bad.json["code"] == 401 and bad.json["message"]


def test_custom_header_is_accepted_for_one_turn_and_never_stored(api: Api):
    agent_id = api.create_agent(echo_dsl())
    resp = api.ask(agent_id, None, "hi", custom_header={"Authorization": "Bearer secret-for-mcp"})
    assert resp.status_code == 200 and resp.json["data"]["data"]["content"] == "echo: hi"
    sid = resp.json["data"]["session_id"]
    stored = json.dumps(api.session(agent_id, sid, dsl="true"))
    assert "secret-for-mcp" not in stored
    for bad in ({"X-Trace": 1}, ["X-Trace: 1"], "X-Trace: 1"):
        resp = api.ask(agent_id, sid, "hi", custom_header=bad)
        assert resp.status_code == 400 and "custom_header" in resp.json["message"], bad
    assert api.session(agent_id, sid)["round"] == 1
