"""Agents over REST: CRUD, versions, DSL validation, authentication."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import Api, dsl_of, echo_dsl, make_token, sample


def test_create_list_get_update_delete(api: Api):
    resp = api.post("/agents", json={"title": "Greeting", "dsl": sample("greeting"), "description": "hello"})
    assert resp.status_code == 200 and resp.json["code"] == 0
    agent_id = resp.json["data"]["id"]

    # As current RAGFlow: data is {"canvas": [agents with id, title, dsl], "total": N}.
    listed = api.get("/agents", query_string={"title": "Greeting", "desc": "True"}).json
    assert listed["code"] == 0 and listed["data"]["total"] == 1
    assert [a["id"] for a in listed["data"]["canvas"]] == [agent_id]
    assert listed["data"]["canvas"][0]["dsl"]["components"].keys() == sample("greeting")["components"].keys()

    got = api.get(f"/agents/{agent_id}").json["data"]
    assert got["title"] == "Greeting" and got["description"] == "hello"

    resp = api.put(f"/agents/{agent_id}", json={"title": "Hello agent"})
    assert resp.json["code"] == 0 and resp.json["data"]["title"] == "Hello agent"
    assert api.get("/agents", query_string={"title": "Greeting"}).json["data"]["canvas"] == []

    assert api.delete(f"/agents/{agent_id}", json={}).json["code"] == 0
    resp = api.get(f"/agents/{agent_id}")
    assert resp.status_code == 404 and resp.json["code"] == 102


def test_list_pages_and_orders(api: Api):
    ids = [api.create_agent(echo_dsl(), title=f"a{i}") for i in range(5)]
    page1 = api.get(
        "/agents", query_string={"page": 1, "page_size": 2, "orderby": "title", "desc": "false"}
    ).json
    page3 = api.get(
        "/agents", query_string={"page": 3, "page_size": 2, "orderby": "title", "desc": "false"}
    ).json
    assert [a["title"] for a in page1["data"]["canvas"]] == ["a0", "a1"]
    assert [a["title"] for a in page3["data"]["canvas"]] == ["a4"]
    assert page1["data"]["total"] == 5
    assert api.get("/agents", query_string={"id": ids[2]}).json["data"]["canvas"][0]["title"] == "a2"
    without = api.get("/agents", query_string={"dsl": "false"}).json["data"]["canvas"]
    assert all("dsl" not in a for a in without)

    resp = api.get("/agents", query_string={"orderby": "secret_column"})
    assert resp.status_code == 400 and "orderby" in resp.json["message"]
    resp = api.get("/agents", query_string={"page_size": "lots"})
    assert resp.status_code == 400 and "page_size" in resp.json["message"]
    resp = api.get("/agents", query_string={"page_size": 100000})
    assert resp.status_code == 400 and "page_size" in resp.json["message"]


def test_the_old_list_shape_is_a_setting(app_factory):
    # ragflow-sdk 0.22 iterates ``data`` as the list of agents, with ``total`` beside it.
    old = Api(app := app_factory(AGENT_LIST_SHAPE="list"), make_token(app))
    agent_id = old.create_agent(echo_dsl(), title="listed")
    listed = old.get("/agents").json
    assert [a["id"] for a in listed["data"]] == [agent_id] and listed["total"] == 1
    with pytest.raises(ValueError, match="AGENTCANVAS_AGENT_LIST_SHAPE"):
        app_factory(AGENT_LIST_SHAPE="dict")


def test_every_dsl_change_is_a_new_version(api: Api):
    agent_id = api.create_agent(echo_dsl("v1 {sys.query}"), title="versioned")
    first = api.get(f"/agents/{agent_id}").json["data"]["version_id"]
    api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl("v2 {sys.query}")})
    second = api.get(f"/agents/{agent_id}").json["data"]["version_id"]
    assert first != second

    versions = api.get(f"/agents/{agent_id}/versions").json["data"]
    assert [v["number"] for v in versions] == [2, 1]
    assert [v["id"] for v in versions] == [second, first]
    old = api.get(f"/agents/{agent_id}/versions/{first}").json["data"]
    assert old["dsl"]["components"]["Message:Echo"]["obj"]["params"]["content"] == ["v1 {sys.query}"]

    resp = api.get(f"/agents/{agent_id}/versions/nope")
    assert resp.status_code == 404 and resp.json["code"] == 102


def test_duplicate_title_is_refused(api: Api):
    api.create_agent(echo_dsl(), title="same")
    resp = api.post("/agents", json={"title": "same", "dsl": echo_dsl()})
    assert resp.status_code == 409 and "'same' already exists" in resp.json["message"]
    other_id = api.create_agent(echo_dsl(), title="other")
    resp = api.put(f"/agents/{other_id}", json={"title": "same"})
    assert resp.status_code == 409
    assert len(api.get("/agents").json["data"]["canvas"]) == 2


def test_ragflow_export_is_unwrapped(api: Api):
    export = {"title": "ignored here", "dsl": echo_dsl()}
    agent_id = api.create_agent(export, title="exported")
    assert "components" in api.get(f"/agents/{agent_id}").json["data"]["dsl"]


def test_load_warnings_come_back_with_the_agent_on_create_and_update(api: Api):
    switch = {
        "conditions": [
            {"items": [{"cpn_id": "sys.query", "operator": "=", "value": "x"}], "to": ["Message:Gone"]}
        ],
        "end_cpn_ids": ["Message:Echo"],
    }
    dsl = dsl_of(
        {
            "Switch:S": ("Switch", switch, ["Message:Echo"]),
            "Message:Echo": ("Message", {"content": ["e"]}, []),
        }
    )
    warning = "Switch:S: condition 1 routes to missing component 'Message:Gone'; the run fails if that branch is taken"
    resp = api.post("/agents", json={"title": "warned", "dsl": dsl})
    assert resp.status_code == 200 and resp.json["data"]["warnings"] == [warning]
    agent_id = resp.json["data"]["id"]
    assert api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl()}).json["data"]["warnings"] == []
    assert api.put(f"/agents/{agent_id}", json={"dsl": dsl}).json["data"]["warnings"] == [warning]
    # A turn that does not take the branch runs; one that does fails naming it.
    assert api.ask(agent_id, None, "y").json["data"]["data"]["content"] == "e"
    resp = api.ask(agent_id, None, "x")
    assert resp.status_code == 500 and "routes to missing component(s) 'Message:Gone'" in resp.json["message"]


def _refused(api: Api, body, status: int = 400, **kw) -> dict:
    resp = api.post("/agents", **({"json": body} if body is not None else {}), **kw)
    assert resp.status_code == status, resp.json
    assert resp.json["code"] != 0
    # Nothing was stored.
    assert api.get("/agents").json["data"]["canvas"] == []
    return resp.json


def test_bad_dsls_are_refused_naming_the_component(api: Api):
    unknown = dsl_of({"Teleport:Now": ("Teleporter", {}, [])})
    assert "Teleport:Now" in _refused(api, {"title": "x", "dsl": unknown})["message"]

    dangling = dsl_of({"Message:A": ("Message", {"content": ["{LLM:Gone@content}"]}, [])})
    message = _refused(api, {"title": "x", "dsl": dangling})["message"]
    assert "Message:A" in message and "LLM:Gone" in message

    wiring = dsl_of({"Message:A": ("Message", {"content": ["hi"]}, ["Message:Nowhere"])})
    message = _refused(api, {"title": "x", "dsl": wiring})["message"]
    assert "Message:A" in message and "Message:Nowhere" in message

    no_begin = echo_dsl()
    del no_begin["components"]["begin"]
    assert "begin" in _refused(api, {"title": "x", "dsl": no_begin})["message"]

    assert "'components'" in _refused(api, {"title": "x", "dsl": {"path": []}})["message"]


def test_bad_requests_are_refused_clearly(api: Api):
    assert "title" in _refused(api, {"dsl": echo_dsl()})["message"]
    assert "title" in _refused(api, {"title": 7, "dsl": echo_dsl()})["message"]
    assert "dsl" in _refused(api, {"title": "x"})["message"]
    assert "dsl" in _refused(api, {"title": "x", "dsl": [1, 2]})["message"]
    assert "description" in _refused(api, {"title": "x", "dsl": echo_dsl(), "description": 5})["message"]
    assert "JSON" in _refused(api, None, data="{not json", content_type="application/json")["message"]
    assert "object" in _refused(api, None, data="[1]", content_type="application/json")["message"]
    assert "body" in _refused(api, None)["message"]
    resp = api.put("/agents/nope", json={"title": "y"})
    assert resp.status_code == 404 and resp.json["code"] == 102
    agent_id = api.create_agent(echo_dsl(), title="keep")
    resp = api.put(f"/agents/{agent_id}", json={})
    assert resp.status_code == 400 and "nothing to update" in resp.json["message"]
    resp = api.put(f"/agents/{agent_id}", json={"dsl": dsl_of({"X:Y": ("Nope", {}, [])})})
    assert resp.status_code == 400 and "X:Y" in resp.json["message"]
    assert len(api.get(f"/agents/{agent_id}/versions").json["data"]) == 1


def test_size_limits(app_factory):
    app = app_factory(MAX_CONTENT_LENGTH=64 * 1024, LIMITS={"max_dsl_bytes": 4096, "max_components": 10})
    api = Api(app, make_token(app))
    big = echo_dsl("x" * 5000)
    message = _refused(api, {"title": "big", "dsl": big}, status=413)["message"]
    assert "max_dsl_bytes" in message and "4096" in message

    many = dsl_of({f"Message:M{i}": ("Message", {"content": ["hi"]}, []) for i in range(12)})
    assert "limit is 10" in _refused(api, {"title": "many", "dsl": many})["message"]

    body = json.dumps({"title": "huge", "dsl": echo_dsl("y" * 70000)})
    resp = api.post("/agents", data=body, content_type="application/json")
    assert resp.status_code == 413 and resp.json["code"] == 101
    assert "max_body_bytes" in resp.json["message"]
    assert api.get("/agents").json["data"]["canvas"] == []


def test_authentication(app):
    anonymous = app.test_client()
    resp = anonymous.get("/api/v1/agents")
    assert resp.status_code == 401 and resp.json["code"] == 401
    assert "Authorization: Bearer" in resp.json["message"]
    resp = anonymous.get("/api/v1/agents", headers={"Authorization": "Bearer ac-not-a-token"})
    assert resp.status_code == 401 and resp.json["code"] == 401
    embed = make_token(app, kind="embed")
    resp = anonymous.get("/api/v1/agents", headers={"Authorization": f"Bearer {embed}"})
    assert resp.status_code == 401
    resp = anonymous.get("/api/v1/nowhere")
    assert resp.status_code == 404 and resp.json["code"] == 404 and "/api/v1/nowhere" in resp.json["message"]


def test_a_template_bomb_is_refused_at_save_naming_the_component(api: Api):
    """jinja2 would fold this while compiling (30 MB per agent on every worker)."""
    bomb = dsl_of({"Message:Big": ("Message", {"content": ["{{ 'x' * 30000000 }}"]}, [])})
    message = _refused(api, {"title": "bomb", "dsl": bomb})["message"]
    assert message.startswith("Message:Big: template") and "template limits" in message
