"""The OpenAPI document: made from the schemas that validate requests, listing every route."""

from __future__ import annotations

import re

from tests.api.conftest import Api, echo_dsl


def test_the_document_is_openapi_3_1_and_lists_every_route(api: Api):
    document = api.client.get("/api/v1/openapi.json").json
    assert document["openapi"] == "3.1.0"
    documented = {(path, method.upper()) for path, ops in document["paths"].items() for method in ops}
    for rule in api.app.url_map.iter_rules():
        if rule.endpoint in ("static", "docs.api_docs") or rule.endpoint.startswith("openapi"):
            continue
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            assert (path, method) in documented, f"{method} {path} is not in the OpenAPI document"
    completion = document["paths"]["/api/v1/agents/{agent_id}/completions"]["post"]
    body = completion["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert {"question", "stream", "session_id", "inputs"} <= set(
        document["components"]["schemas"][body]["properties"]
    )


def test_a_body_that_breaks_its_schema_is_a_400_naming_the_field(api: Api):
    resp = api.post("/agents", json={"title": 5, "dsl": {}})
    assert resp.status_code == 400 and resp.json["code"] == 101
    assert resp.json["message"] == "'title' must be text, got a number"
    resp = api.put("/agents/x/embed", json={})
    assert resp.status_code == 400 and "'allowed_origins' is required" in resp.json["message"]


def test_the_page_for_people_lists_the_routes(api: Api):
    page = api.client.get("/api/v1/docs")
    assert page.status_code == 200 and page.content_type.startswith("text/html")
    text = page.get_data(as_text=True)
    assert "/api/v1/agents/{agent_id}/completions" in text and "session_id" in text


def test_a_completion_body_is_checked_in_the_same_words_however_it_is_read(api: Api):
    """The completion routes check well-formed bodies without building the schema's model;
    a body that breaks it still gets pydantic's finding, in our words."""
    agent_id = api.create_agent(echo_dsl())
    cases = [
        ({"question": 5}, "'question' must be text, got a number"),
        ({"question": True}, "'question' must be text, got a boolean"),
        ({"session_id": ["s"]}, "'session_id' must be text, got a list"),
        ({"inputs": "name=Ann"}, "'inputs' must be an object, got text"),
        ({"files": {"a": 1}}, "'files' must be a list, got an object"),
        ({"user_id": 1.5}, "'user_id' must be text, got a number"),
    ]
    for body, message in cases:
        resp = api.post(f"/agents/{agent_id}/completions", json=body)
        assert resp.status_code == 400 and resp.json["code"] == 101, (body, resp.json)
        assert resp.json["message"] == message, body
    resp = api.post("/agents/chat/completions", json={"agent_id": agent_id, "openai-compatible": [1]})
    assert resp.status_code == 400 and resp.json["message"].startswith("'openai-compatible")
    # Keys the schema does not declare are the view's business, whatever they hold.
    resp = api.post(
        f"/agents/{agent_id}/completions", json={"session_id": "nope", "anything": [1, {"a": None}]}
    )
    assert resp.status_code == 404 and resp.json["code"] == 102


def test_a_completion_body_is_checked_whatever_its_content_type_spells(api: Api):
    """``application/json`` with parameters or in other case is JSON too: checked alike."""
    agent_id = api.create_agent(echo_dsl())
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        resp = api.post(
            f"/agents/{agent_id}/completions",
            data=b'{"question": 5}',
            headers={"Content-Type": content_type},
        )
        assert resp.status_code == 400 and resp.json["message"] == "'question' must be text, got a number"


def test_a_whole_number_of_19_digits_or_more_is_read_only_within_64_bits(api: Api):
    """A body's numbers past 64 bits are refused naming the field, at 19 digits as at 30
    (orjson alone would read 2**63 and more); 19 digits within range, and digits that are
    not one number (a session id, text), are read as sent."""
    agent_id = api.create_agent(echo_dsl())
    for number in (2**63, 2**64, -(2**63) - 1, 10**29):
        resp = api.post(f"/agents/{agent_id}/completions", json={"question": "x", "user_id": number})
        assert resp.status_code == 400, number
        assert resp.json["message"] == "'user_id' is out of range: whole numbers must fit in 64 bits"
    for number in (2**63 - 1, -(2**63), 10**18):
        resp = api.post(f"/agents/{agent_id}/completions", json={"question": "x", "user_id": number})
        assert resp.json["message"] == "'user_id' must be text, got a number", number
    digits = "1234567890123456789012"
    resp = api.post(f"/agents/{agent_id}/completions", json={"question": digits, "stream": False})
    assert resp.status_code == 200 and digits in resp.get_data(as_text=True)
