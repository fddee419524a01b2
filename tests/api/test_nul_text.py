"""Text holding NUL (U+0000) is stored and returned as sent, on every database.

Postgres text columns refuse NUL where SQLite and MySQL store it; api.db.pgtext encodes
it on Postgres connections. Every test here runs on SQLite, MariaDB and Postgres and
sends the same text through a REST entry point, then reads it back. The text also holds
the two noncharacters the Postgres encoding uses, which must come back as sent too.
"""

from __future__ import annotations

import io
import secrets
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.db import Tenant, db, init_database
from api.db.pgtext import from_postgres, to_postgres
from tests.api.conftest import Api, close_idle_connections, dsl_of, echo_dsl, make_token, sample
from tests.mcp_server import MCPTestServer

TEXT = "nul \0 end \ufffe\uffff \uffff\0\ufffe"


def test_a_question_round_trips_through_every_completion_route(api: Api, app):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)

    blocking = api.ask(agent_id, session_id, TEXT)
    assert blocking.status_code == 200, blocking.json
    assert blocking.json["data"]["data"]["content"] == f"echo: {TEXT}"
    frames = api.ask_stream(agent_id, session_id, TEXT)
    assert frames[-2]["event"] == "message_end" and frames[-2]["data"]["content"] == f"echo: {TEXT}"
    by_body = api.post(
        "/agents/chat/completions",
        json={"agent_id": agent_id, "session_id": session_id, "query": TEXT, "stream": False},
    )
    assert by_body.status_code == 200 and by_body.json["data"]["data"]["content"] == f"echo: {TEXT}"

    session = api.session(agent_id, session_id, dsl="true")
    assert [m["content"] for m in session["message"][1:]] == [TEXT, f"echo: {TEXT}"] * 3
    assert session["round"] == 3 and session["dsl"]["history"][-1] == ["assistant", f"echo: {TEXT}"]

    openai = api.post(
        f"/agents_openai/{agent_id}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": TEXT}]},
    )
    assert openai.status_code == 200, openai.json
    assert openai.json["choices"][0]["message"]["content"] == f"echo: {TEXT}"

    embed = app.test_client()
    headers = {"Authorization": f"Bearer {make_token(app, 'tenant-a', 'embed')}"}
    user = secrets.token_hex(16)
    bot = embed.post(
        f"/api/v1/agentbots/{agent_id}/completions",
        json={"question": TEXT, "user_id": user, "stream": False},
        headers=headers,
    )
    assert bot.status_code == 200, bot.json
    history = embed.get(
        f"/api/v1/agentbots/{agent_id}/sessions/{bot.json['data']['session_id']}",
        query_string={"user_id": user},
        headers=headers,
    )
    assert [m["content"] for m in history.json["data"]["message"][1:]] == [TEXT, f"echo: {TEXT}"]


def test_form_values_and_variables_round_trip(api: Api):
    agent_id = api.create_agent(sample("intake_form"))
    session_id = api.create_session(agent_id)
    assert api.ask(agent_id, session_id, "sign me up").json["data"]["event"] == "user_inputs"
    inputs = {"name": {"value": TEXT}, "age": {"value": 30}, "plan": {"value": "pro"}}
    filled = api.ask(agent_id, session_id, "", inputs=inputs)
    assert filled.status_code == 200, filled.json
    assert TEXT in filled.json["data"]["data"]["content"]
    session = api.session(agent_id, session_id)
    assert session["status"] == "idle" and TEXT in session["message"][-1]["content"]

    dsl = echo_dsl("v={env.v}")
    dsl["variables"] = {"v": {"name": "v", "type": "string", "value": ""}}
    agent_id = api.create_agent(dsl)
    session_id = api.create_session(agent_id)
    put = api.put(f"/agents/{agent_id}/sessions/{session_id}/variables/v", json={"value": TEXT})
    assert put.status_code == 200 and put.json["data"]["value"] == TEXT
    listed = api.get(f"/agents/{agent_id}/sessions/{session_id}/variables").json["data"]
    assert [v["value"] for v in listed if v["name"] == "v"] == [TEXT]
    assert api.ask(agent_id, session_id, "q").json["data"]["data"]["content"] == f"v={TEXT}"


def test_agent_titles_descriptions_and_dsl_text_round_trip(api: Api):
    made = api.post(
        "/agents", json={"title": TEXT, "description": TEXT, "dsl": echo_dsl(f"{TEXT}{{sys.query}}")}
    )
    assert made.status_code == 200, made.json
    agent_id = made.json["data"]["id"]
    assert made.json["data"]["title"] == TEXT and made.json["data"]["description"] == TEXT
    assert api.ask(agent_id, None, "!").json["data"]["data"]["content"] == f"{TEXT}!"
    listed = api.get("/agents", query_string={"title": TEXT}).json["data"]
    assert [a["id"] for a in listed["canvas"]] == [agent_id]

    updated = api.put(
        f"/agents/{agent_id}", json={"title": f"{TEXT} 2", "dsl": echo_dsl(f"{{sys.query}}{TEXT}")}
    )
    assert updated.status_code == 200, updated.json
    agent = api.get(f"/agents/{agent_id}").json["data"]
    assert agent["title"] == f"{TEXT} 2" and agent["description"] == TEXT
    assert api.ask(agent_id, None, "!").json["data"]["data"]["content"] == f"!{TEXT}"


def test_session_names_and_user_ids_round_trip(api: Api):
    agent_id = api.create_agent(echo_dsl())
    made = api.post(f"/agents/{agent_id}/sessions", json={"name": TEXT, "user_id": TEXT})
    assert made.status_code == 200, made.json
    session_id = made.json["data"]["id"]
    session = api.session(agent_id, session_id)
    assert session["name"] == TEXT and session["user_id"] == TEXT
    api.create_session(agent_id, user_id="someone else")
    listed = api.get(f"/agents/{agent_id}/sessions", query_string={"user_id": TEXT}).json["data"]
    assert [s["id"] for s in listed] == [session_id]


def test_dataset_document_and_chunk_text_round_trips(api: Api):
    made = api.post("/datasets", json={"name": TEXT, "description": TEXT})
    assert made.status_code == 200, made.json
    ds = made.json["data"]["id"]
    assert made.json["data"]["name"] == TEXT and made.json["data"]["description"] == TEXT
    assert [d["name"] for d in api.get("/datasets", query_string={"name": TEXT}).json["data"]] == [TEXT]

    files = {"file": [(io.BytesIO(b"plain words"), f"{TEXT}.txt")]}
    uploaded = api.post(f"/datasets/{ds}/documents", data=files, content_type="multipart/form-data")
    assert uploaded.status_code == 200, uploaded.json
    doc = uploaded.json["data"][0]["id"]
    assert uploaded.json["data"][0]["name"] == f"{TEXT}.txt"
    renamed = api.put(f"/datasets/{ds}/documents/{doc}", json={"name": f"{TEXT} 2.txt"})
    assert renamed.status_code == 200 and renamed.json["data"]["name"] == f"{TEXT} 2.txt"

    chunk = api.post(f"/datasets/{ds}/documents/{doc}/chunks", json={"content": f"zebra {TEXT}"})
    assert chunk.status_code == 200, chunk.json
    found = api.post("/retrieval", json={"dataset_ids": [ds], "question": "zebra"}).json["data"]["chunks"]
    assert [c["content"] for c in found] == [f"zebra {TEXT}"]
    listed = api.get(f"/datasets/{ds}/documents/{doc}/chunks").json["data"]
    assert [c["content"] for c in listed["chunks"]] == [f"zebra {TEXT}"]
    assert listed["doc"]["name"] == f"{TEXT} 2.txt"


def test_memory_names_and_messages_round_trip(api: Api):
    made = api.post("/memories", json={"name": TEXT, "memory_type": ["raw"], "embd_id": "", "llm_id": ""})
    assert made.status_code == 200, made.json
    memory_id = made.json["data"]["id"]
    assert made.json["data"]["name"] == TEXT
    changed = api.put(f"/memories/{memory_id}", json={"description": TEXT, "system_prompt": TEXT})
    assert changed.status_code == 200, changed.json
    assert api.get(f"/memories/{memory_id}/config").json["data"]["description"] == TEXT

    body = {
        "memory_id": [memory_id],
        "agent_id": "a",
        "session_id": "s",
        "user_input": TEXT,
        "agent_response": TEXT,
    }
    assert api.post("/messages", json=body).status_code == 200
    messages = api.get(f"/memories/{memory_id}").json["data"]["messages"]["message_list"]
    assert [m["content"] for m in messages] == [f"User Input: {TEXT}\nAgent Response: {TEXT}"]


def test_uploaded_file_names_round_trip(api: Api):
    agent_id = api.create_agent(echo_dsl())
    files = {"file": [(io.BytesIO(b"hello"), f"{TEXT}.txt")]}
    uploaded = api.post(f"/agents/{agent_id}/upload", data=files, content_type="multipart/form-data")
    assert uploaded.status_code == 200, uploaded.json
    assert uploaded.json["data"]["name"] == f"{TEXT}.txt"


def test_a_webhook_body_round_trips(api: Api):
    begin = {
        "mode": "Webhook",
        "methods": ["POST"],
        "security": {"auth_type": "none", "allow_anonymous": True},
    }
    dsl = dsl_of({"Message:Out": ("Message", {"content": ["got {begin@body.note}"]}, [])})
    dsl["components"]["begin"]["obj"]["params"] = {**begin, "execution_mode": "Streaming"}
    agent_id = api.create_agent(dsl)
    resp = api.client.post(f"/api/v1/agents/{agent_id}/webhook", json={"note": TEXT})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.json["message"] == f"got {TEXT}"


def test_ids_and_filters_holding_nul_find_nothing(api: Api):
    """An id or filter with NUL in a path or query is a plain miss (404, or an empty list)."""
    agent_id = api.create_agent(echo_dsl())
    for path in ("/agents/a%00b", f"/agents/{agent_id}/sessions/a%00b", "/tasks/a%00b/cancel"):
        resp = api.post(path) if path.endswith("cancel") else api.get(path)
        assert resp.status_code == 404 and resp.json["code"] == 102, (path, resp.json)
    assert api.delete("/system/tokens/a%00b").status_code == 404
    assert api.get("/datasets", query_string={"name": TEXT}).status_code == 404
    assert api.get(f"/agents/{agent_id}/sessions", query_string={"id": TEXT}).json["data"] == []


@pytest.fixture
def mcp_api(app_factory) -> Api:
    app = app_factory(SETTINGS={"invoke": {"allow_hosts": ["127.0.0.1"], "timeout_seconds": 5}})
    return Api(app, make_token(app, "tenant-a"))


def test_mcp_server_names_round_trip(mcp_api: Api):
    with MCPTestServer() as server:
        made = mcp_api.post(
            "/mcp/servers",
            json={
                "name": TEXT,
                "description": TEXT,
                "url": server.streamable_url,
                "server_type": "streamable-http",
            },
        )
    assert made.status_code == 200, made.json
    assert made.json["data"]["name"] == TEXT and made.json["data"]["description"] == TEXT
    assert mcp_api.get(f"/mcp/servers/{made.json['data']['id']}").json["data"]["name"] == TEXT


@given(st.text(alphabet=st.sampled_from(["\0", "\ufffe", "\uffff", "a", "é"]) | st.characters(), max_size=30))
def test_the_postgres_encoding_round_trips_and_leaves_no_nul(text: str):
    stored = to_postgres(text)
    assert "\0" not in stored and from_postgres(stored) == text
    assert len(stored) == len(text) + text.count("\ufffe") + text.count("\uffff")
    if not any(c in text for c in "\0\ufffe\uffff"):
        assert stored == text


def test_postgres_keeps_plain_text_as_it_is_and_nul_as_a_noncharacter(postgres_url):
    """Rows without NUL (or the two noncharacters) look the same to anyone reading the database."""
    init_database(postgres_url)
    names = [f"plain é {uuid.uuid4().hex}", f"{TEXT} {uuid.uuid4().hex}"]
    try:
        with db.connection_context():
            ids = [Tenant.create(name=name).id for name in names]
            raw = [
                db.execute_sql("SELECT convert_to(name, 'UTF8') FROM tenant WHERE id = %s", (i,)).fetchone()[
                    0
                ]
                for i in ids
            ]
            assert [Tenant.get_by_id(i).name for i in ids] == names
            named = db.connection().execute("SELECT %(a)s, %(b)s, 1", {"a": TEXT, "b": "x"}).fetchone()
            assert named == (TEXT, "x", 1)
            Tenant.delete().where(Tenant.id.in_(ids)).execute()
    finally:
        close_idle_connections()
    assert [bytes(r) for r in raw] == [names[0].encode(), to_postgres(names[1]).encode()]
    assert b"\0" not in raw[1]
