"""RAGFlow's long-term Memory (docs/design.md §15): /memories and /messages, save to memory from a
Message, extraction by the Memory's LLM after the turn, term search, FIFO forgetting."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, dsl_of, make_token
from tests.llm_server import LLMServer, text


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


@pytest.fixture
def mem_app(app_factory, llm):
    return app_factory(SETTINGS={"llm": llm.settings(max_retries=0)})


@pytest.fixture
def mapi(mem_app) -> Api:
    return Api(mem_app, make_token(mem_app, "tenant-a"))


def new_memory(api: Api, name: str = "notes", types=("raw",), **extra) -> dict:
    resp = api.post(
        "/memories", json={"name": name, "memory_type": list(types), "embd_id": "", "llm_id": "", **extra}
    )
    assert resp.status_code == 200 and resp.json["code"] == 0, resp.json
    return resp.json["data"]


def add(api: Api, memory_ids: list[str], user_input: str, agent_response: str, **extra):
    body = {
        "memory_id": memory_ids,
        "agent_id": "agent-1",
        "session_id": "s-1",
        "user_input": user_input,
        "agent_response": agent_response,
        **extra,
    }
    resp = api.post("/messages", json=body)
    assert resp.status_code == 200 and resp.json["code"] == 0, resp.json
    return resp


def wait_extraction(api: Api) -> None:
    api.app.extensions["agentcanvas.turns"].extractor.wait_idle()


def test_memories_are_created_listed_configured_updated_and_deleted(mapi: Api, other: Api):
    made = new_memory(mapi, "notes", ("raw", "semantic"))
    assert made["memory_type"] == ["raw", "semantic"] and made["forgetting_policy"] == "FIFO"
    assert made["memory_size"] == 5 * 1024 * 1024
    listed = mapi.get("/memories").json["data"]
    assert listed["total_count"] == 1 and listed["memory_list"][0]["id"] == made["id"]
    assert mapi.get(f"/memories/{made['id']}/config").json["data"]["name"] == "notes"
    updated = mapi.put(f"/memories/{made['id']}", json={"name": "journal", "memory_size": 1000}).json["data"]
    assert (updated["name"], updated["memory_size"]) == ("journal", 1000)
    # Another tenant sees nothing of it.
    assert other.get(f"/memories/{made['id']}/config").status_code == 404
    assert other.get("/memories").json["data"]["total_count"] == 0
    assert other.delete(f"/memories/{made['id']}").status_code == 404
    assert mapi.delete(f"/memories/{made['id']}").json["code"] == 0
    assert mapi.get(f"/memories/{made['id']}/config").status_code == 404


@pytest.mark.parametrize(
    "body, field",
    [
        ({"memory_type": ["raw"], "embd_id": "", "llm_id": ""}, "name"),
        ({"name": "x", "memory_type": ["semantic"], "embd_id": "", "llm_id": ""}, "raw"),
        ({"name": "x", "memory_type": ["raw", "dreams"], "embd_id": "", "llm_id": ""}, "memory_type"),
        ({"name": "x", "memory_type": "raw", "embd_id": "", "llm_id": "", "memory_size": 0}, "memory_size"),
        ({"name": "x", "memory_type": ["raw"], "embd_id": "", "llm_id": "", "temperature": 3}, "temperature"),
    ],
)
def test_bad_memory_settings_are_400s_naming_the_field(mapi: Api, body, field):
    resp = mapi.post("/memories", json=body)
    assert resp.status_code == 400 and resp.json["code"] == 101
    assert field in resp.json["message"]
    assert mapi.get("/memories").json["data"]["total_count"] == 0


def test_messages_are_saved_searched_listed_and_forgotten(mapi: Api, other: Api):
    memory = new_memory(mapi)
    add(mapi, [memory["id"]], "My cat is called Pixel", "A fine name for a cat.", user_id="u1")
    add(mapi, [memory["id"]], "I drink green tea every morning", "Noted.", user_id="u2")

    found = mapi.get(
        "/messages/search", query_string={"query": "what is my cat called", "memory_id": memory["id"]}
    )
    hits = found.json["data"]
    assert (
        hits
        and hits[0]["content"] == "User Input: My cat is called Pixel\nAgent Response: A fine name for a cat."
    )
    assert hits[0]["message_type"] == "raw" and hits[0]["user_id"] == "u1" and hits[0]["similarity"] > 0
    only_u2 = mapi.get(
        "/messages/search", query_string={"query": "cat tea", "memory_id": memory["id"], "user_id": "u2"}
    ).json["data"]
    assert [h["user_id"] for h in only_u2] == ["u2"]

    recent = mapi.get("/messages", query_string={"memory_id": memory["id"], "limit": 1}).json["data"]
    assert len(recent) == 1 and "green tea" in recent[0]["content"]
    listed = mapi.get(f"/memories/{memory['id']}").json["data"]["messages"]
    assert listed["total_count"] == 2

    message_id = recent[0]["message_id"]
    content = mapi.get(f"/messages/{memory['id']}:{message_id}/content").json["data"]
    assert content["message_id"] == message_id
    assert mapi.put(f"/messages/{memory['id']}:{message_id}", json={"status": False}).json["code"] == 0
    assert (
        mapi.get("/messages/search", query_string={"query": "green tea", "memory_id": memory["id"]}).json[
            "data"
        ]
        == []
    )
    assert mapi.delete(f"/messages/{memory['id']}:{message_id}").json["code"] == 0
    assert mapi.get(f"/messages/{memory['id']}:{message_id}/content").status_code == 404

    # Another tenant's calls find nothing of it.
    assert other.get("/messages", query_string={"memory_id": memory["id"]}).status_code == 404
    resp = other.post(
        "/messages",
        json={
            "memory_id": [memory["id"]],
            "agent_id": "a",
            "session_id": "s",
            "user_input": "x",
            "agent_response": "y",
        },
    )
    assert resp.status_code == 404


def test_message_errors(mapi: Api):
    memory = new_memory(mapi)
    resp = mapi.post("/messages", json={"memory_id": memory["id"], "agent_id": "a", "session_id": "s"})
    assert resp.status_code == 400 and "user_input" in resp.json["message"]
    assert mapi.get("/messages/search", query_string={"memory_id": memory["id"]}).status_code == 400
    assert mapi.get("/messages").status_code == 400
    bad = mapi.get("/messages/search", query_string={"memory_id": memory["id"], "query": "x", "top_n": 0})
    assert bad.status_code == 400 and "top_n" in bad.json["message"]
    assert mapi.put(f"/messages/{memory['id']}:1", json={"status": "yes"}).status_code in (400, 404)
    assert mapi.get(f"/messages/{memory['id']}:abc/content").status_code == 400


def test_a_full_memory_forgets_its_oldest_messages_first(mapi: Api):
    memory = new_memory(mapi, memory_size=200)
    for i in range(5):
        add(mapi, [memory["id"]], f"fact number {i} " + "x" * 40, "ok")
    kept = mapi.get(f"/memories/{memory['id']}").json["data"]["messages"]["message_list"]
    assert sum(len(m["content"]) for m in kept) <= 200
    assert [m["content"].split()[4] for m in kept] == ["4", "3"]  # newest first; 0-2 forgotten
    found = mapi.get(
        "/messages/search", query_string={"query": "fact number 0", "memory_id": memory["id"]}
    ).json
    assert all("fact number 0 " not in m["content"] for m in found["data"])


def test_the_memorys_llm_extracts_after_the_save(mapi: Api, llm: LLMServer):
    memory = new_memory(mapi, "profile", ("raw", "semantic", "episodic"))
    llm.queue(text('{"semantic": [{"content": "The user has a cat named Pixel."}], "episodic": []}'))
    add(mapi, [memory["id"]], "My cat is called Pixel", "Nice!")
    wait_extraction(mapi)
    messages = mapi.get(f"/memories/{memory['id']}").json["data"]["messages"]["message_list"]
    by_type = {m["message_type"]: m for m in messages}
    assert by_type["semantic"]["content"] == "The user has a cat named Pixel."
    assert by_type["semantic"]["source_id"] == by_type["raw"]["message_id"]
    request = llm.chat_requests()[-1]
    assert "semantic, episodic" in request["messages"][0]["content"]
    assert "User Input: My cat is called Pixel" in request["messages"][-1]["content"]


def test_a_message_with_memory_ids_saves_the_turn(mapi: Api, llm: LLMServer):
    memory = new_memory(mapi, "chats", ("raw", "semantic"))
    dsl = dsl_of(
        {
            "LLM:Chat": ("LLM", {"sys_prompt": "Be brief."}, ["Message:Out"]),
            "Message:Out": ("Message", {"content": ["{LLM:Chat@content}"], "memory_ids": [memory["id"]]}, []),
        }
    )
    agent_id = mapi.create_agent(dsl)
    session_id = mapi.create_session(agent_id, user_id="u7")
    llm.queue(text("Pixel is a lovely name."), text('{"semantic": [{"content": "The cat is Pixel."}]}'))
    resp = mapi.ask(agent_id, session_id, "My cat is Pixel", user_id="u7")
    assert resp.status_code == 200, resp.json
    wait_extraction(mapi)
    messages = mapi.get("/messages", query_string={"memory_id": memory["id"]}).json["data"]
    raw = next(m for m in messages if m["message_type"] == "raw")
    assert raw["content"] == "User Input: My cat is Pixel\nAgent Response: Pixel is a lovely name."
    assert (raw["agent_id"], raw["session_id"], raw["user_id"]) == (agent_id, session_id, "u7")
    assert any(m["message_type"] == "semantic" and m["content"] == "The cat is Pixel." for m in messages)

    # A failed turn saves nothing.
    llm.queue(text("x", status=500))
    mapi.ask(agent_id, session_id, "again")
    assert len(mapi.get("/messages", query_string={"memory_id": memory["id"]}).json["data"]) == 2


def test_keyed_memory_and_memories_share_the_table_without_mixing(mapi: Api, llm: LLMServer):
    from tests.api.test_memory_api import keyed_dsl, remembered

    memory = new_memory(mapi)
    agent_id = mapi.create_agent(keyed_dsl())
    add(mapi, [memory["id"]], "hello", "hi", agent_id=agent_id, user_id="u1")
    mapi.ask(agent_id, mapi.create_session(agent_id, user_id="u1"), "remember me")
    assert remembered(mapi, agent_id, "u1") == {
        "LLM:Chat": [
            {"role": "user", "content": "remember me"},
            {"role": "assistant", "content": "echo: remember me"},
        ]
    }
    mapi.delete(f"/agents/{agent_id}/memory/u1")
    assert len(mapi.get("/messages", query_string={"memory_id": memory["id"]}).json["data"]) == 1


def test_retrieval_from_memory_feeds_the_prompt(mapi: Api, llm: LLMServer):
    memory = new_memory(mapi)
    add(mapi, [memory["id"]], "My cat is called Pixel", "Lovely.", user_id="u1")
    add(mapi, [memory["id"]], "I live in Lisbon", "Nice city.", user_id="u1")
    dsl = dsl_of(
        {
            "Retrieval:Recall": (
                "Retrieval",
                {"retrieval_from": "memory", "memory_ids": [memory["id"]], "top_n": 1},
                ["LLM:Answer"],
            ),
            "LLM:Answer": (
                "LLM",
                {"sys_prompt": "Known about the user:\n{Retrieval:Recall@formalized_content}"},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{LLM:Answer@content}"]}, []),
        }
    )
    agent_id = mapi.create_agent(dsl)
    resp = mapi.ask(agent_id, None, "what is the name of my cat?")
    assert resp.status_code == 200, resp.json
    system = llm.chat_requests()[-1]["messages"][0]["content"]
    assert "Memory (raw): User Input: My cat is called Pixel" in system and "Lisbon" not in system

    # Another tenant's Memory cannot be searched from an agent.
    other = Api(mapi.app, make_token(mapi.app, "tenant-b"))
    foreign = other.create_agent(dsl)
    failed = other.ask(foreign, None, "cat?")
    assert failed.status_code >= 400 and "not found" in failed.json["message"]


def test_retrieval_from_memory_needs_memory_ids(mapi: Api):
    dsl = dsl_of({"Retrieval:Recall": ("Retrieval", {"retrieval_from": "memory"}, [])})
    resp = mapi.post("/agents", json={"title": "t", "dsl": dsl})
    assert resp.status_code == 400 and "memory_ids" in resp.json["message"]
