"""Keyed LLM memory through the REST API, and a RAGFlow Categorize template imported and run.

Every LLM call goes to the test LLM server (tests/llm_server.py), which records what it
was sent: the tests assert exactly which history reached the model.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from peewee import MySQLDatabase

from api.db import MemoryEntry, db, init_database
from api.services.memory import DatabaseMemoryStore
from tests.api.conftest import MYSQL, Api, dsl_of
from tests.api.test_cli import cli  # noqa: F401 - the `agentcanvas` fixture, shared with the CLI tests
from tests.llm_server import LLMServer, error, text

TEMPLATE = Path(__file__).parent / "data" / "ragflow_order_desk.json"


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


@pytest.fixture
def app(app_factory, llm):
    """The app with its default LLM provider set to the test server (no retries: failures are final)."""
    return app_factory(SETTINGS={"llm": llm.settings(max_retries=0)})


def keyed_dsl() -> dict:
    """An LLM that remembers each user (``memory_key: "{sys.user_id}"``), then a Message."""
    llm_params = {"sys_prompt": "Be brief.", "memory_key": "{sys.user_id}", "message_history_window_size": 10}
    return dsl_of(
        {
            "LLM:Chat": ("LLM", llm_params, ["Message:Out"]),
            "Message:Out": ("Message", {"content": ["{LLM:Chat@content}"]}, []),
        }
    )


def sent_history(llm: LLMServer, index: int = -1) -> list[dict]:
    """The messages of a request between its system prompt (if any) and its user prompt."""
    messages = llm.chat_requests()[index]["messages"]
    assert messages[-1]["role"] == "user"
    return messages[1:-1] if messages[0]["role"] == "system" else messages[:-1]


def exchange(question: str) -> list[dict]:
    """What the echoing test server and the memory make of one question."""
    return [{"role": "user", "content": question}, {"role": "assistant", "content": f"echo: {question}"}]


def say(api: Api, agent_id: str, user_id: str, question: str, session_id: str | None = None) -> str:
    """One blocking turn in a new session of ``user_id`` (or in ``session_id``); returns the answer."""
    if session_id is None:
        session_id = api.create_session(agent_id, user_id=user_id)
    resp = api.ask(agent_id, session_id, question)
    assert resp.status_code == 200, resp.json
    return resp.json["data"]["data"]["content"]


def remembered(api: Api, agent_id: str, key: str) -> dict[str, list[dict]]:
    """``GET .../memory/<key>`` as ``{node_id: [{role, content}]}``."""
    resp = api.get(f"/agents/{agent_id}/memory/{key}")
    assert resp.status_code == 200, resp.json
    data = resp.json["data"]
    assert data["key"] == key and data["total"] == sum(len(v) for v in data["nodes"].values())
    return {
        node: [{"role": e["role"], "content": e["content"]} for e in entries]
        for node, entries in data["nodes"].items()
    }


# -- keyed memory ------------------------------------------------------------------------


def test_keyed_memory_follows_a_user_into_new_sessions(api: Api, llm: LLMServer):
    agent_id = api.create_agent(keyed_dsl())
    assert say(api, agent_id, "u1", "my name is Ada") == "echo: my name is Ada"
    assert sent_history(llm) == []

    # A new session of the same agent: the model hears what u1 said before.
    second = api.create_session(agent_id, user_id="u1")
    say(api, agent_id, "u1", "what is my name?", second)
    assert sent_history(llm) == exchange("my name is Ada")
    # Keyed memory lives beside the session, not in its snapshot.
    assert api.session(agent_id, second, dsl="true")["dsl"]["memory"] == {}

    # The user named in the completion itself (no session given) is remembered too.
    resp = api.ask(agent_id, None, "and now?", user_id="u1")
    assert resp.status_code == 200, resp.json
    assert sent_history(llm) == exchange("my name is Ada") + exchange("what is my name?")
    assert remembered(api, agent_id, "u1") == {
        "LLM:Chat": exchange("my name is Ada") + exchange("what is my name?") + exchange("and now?")
    }


def test_keyed_memory_never_crosses_users_agents_or_tenants(api: Api, other: Api, llm: LLMServer):
    first = api.create_agent(keyed_dsl())
    say(api, first, "u1", "my pin is 4711")

    say(api, first, "u2", "hello")  # another user of the same agent
    assert sent_history(llm) == []
    second = api.create_agent(keyed_dsl())  # same node ids and key, another agent
    say(api, second, "u1", "hello")
    assert sent_history(llm) == []
    foreign = other.create_agent(keyed_dsl())  # another tenant
    say(other, foreign, "u1", "hello")
    assert sent_history(llm) == []

    assert remembered(api, first, "u1") == {"LLM:Chat": exchange("my pin is 4711")}
    assert remembered(api, second, "u1") == {"LLM:Chat": exchange("hello")}
    # Another tenant's agent is not found, and its memory is neither shown nor deleted.
    for method in (other.get, other.delete):
        resp = method(f"/agents/{first}/memory/u1")
        assert resp.status_code == 404 and resp.json["code"] == 102, resp.json
        assert "4711" not in json.dumps(resp.json)
    assert remembered(api, first, "u1") == {"LLM:Chat": exchange("my pin is 4711")}
    say(api, first, "u1", "what is my pin?")
    assert sent_history(llm) == exchange("my pin is 4711")


def test_a_failed_llm_call_leaves_memory_unchanged(api: Api, llm: LLMServer):
    agent_id = api.create_agent(keyed_dsl())
    say(api, agent_id, "u1", "remember this")
    before = remembered(api, agent_id, "u1")

    llm.queue(error(500))
    session_id = api.create_session(agent_id, user_id="u1")
    resp = api.ask(agent_id, session_id, "this fails")
    assert resp.status_code == 502 and resp.json["code"] == 100, resp.json
    assert remembered(api, agent_id, "u1") == before

    say(api, agent_id, "u1", "try again", session_id)
    assert sent_history(llm) == exchange("remember this")


def test_memory_of_a_turn_that_fails_later_is_not_committed(api: Api, llm: LLMServer):
    """The keyed node answered, a later node failed: the turn, its memory included, is void."""
    dsl = dsl_of(
        {
            "LLM:Chat": ("LLM", {"memory_key": "{sys.user_id}"}, ["LLM:Check"]),
            "LLM:Check": ("LLM", {"prompts": "Check: {LLM:Chat@content}"}, ["Message:Out"]),
            "Message:Out": ("Message", {"content": ["{LLM:Check@content}"]}, []),
        }
    )
    agent_id = api.create_agent(dsl)
    llm.queue(text("fine"), error(503))
    resp = api.ask(agent_id, None, "hi", user_id="u1")
    assert resp.status_code == 502 and "LLM:Check" in resp.json["message"]
    assert remembered(api, agent_id, "u1") == {}


def test_memory_that_cannot_be_stored_fails_the_whole_turn(api: Api, llm: LLMServer):
    """Memory is written in the turn's transaction: when it cannot be, nothing of the turn is kept."""
    long_id = "LLM:" + "n" * 260
    dsl = dsl_of(
        {
            # A window of 0 reads nothing, so only the end-of-turn write meets the long id.
            long_id: (
                "LLM",
                {"memory_key": "{sys.user_id}", "message_history_window_size": 0},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": [f"{{{long_id}@content}}"]}, []),
        }
    )
    agent_id = api.create_agent(dsl)
    session_id = api.create_session(agent_id, user_id="u1")
    before = api.session(agent_id, session_id)
    resp = api.ask(agent_id, session_id, "hi")
    assert resp.status_code == 500, resp.json
    assert "could not be saved" in resp.json["message"] and "255" in resp.json["message"]
    after = api.session(agent_id, session_id)
    assert (after["version"], after["round"], after["message"]) == (
        before["version"],
        before["round"],
        before["message"],
    )
    assert remembered(api, agent_id, "u1") == {}


def test_a_paused_turn_commits_its_memory_once(api: Api, llm: LLMServer):
    dsl = dsl_of(
        {
            "LLM:Chat": ("LLM", {"memory_key": "{sys.user_id}"}, ["UserFillUp:Confirm"]),
            "UserFillUp:Confirm": (
                "UserFillUp",
                {"tips": "Proceed?", "inputs": {"ok": {"name": "OK", "type": "line", "optional": False}}},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{LLM:Chat@content} ({UserFillUp:Confirm@ok})"]}, []),
        }
    )
    agent_id = api.create_agent(dsl)
    session_id = api.create_session(agent_id, user_id="u1")
    paused = api.ask(agent_id, session_id, "plan it")
    assert paused.json["data"]["event"] == "user_inputs"
    assert remembered(api, agent_id, "u1") == {"LLM:Chat": exchange("plan it")}
    done = api.ask(agent_id, session_id, inputs={"ok": "yes"})
    assert done.json["data"]["data"]["content"] == "echo: plan it (yes)"
    assert remembered(api, agent_id, "u1") == {"LLM:Chat": exchange("plan it")}


# -- GET / DELETE /agents/<id>/memory/<key> ------------------------------------------------


def test_memory_is_listed_per_node_and_forgotten(api: Api, llm: LLMServer):
    dsl = dsl_of(
        {
            "LLM:First": ("LLM", {"memory_key": "{sys.user_id}"}, ["LLM:Second"]),
            "LLM:Second": (
                "LLM",
                {"memory_key": "{sys.user_id}", "prompts": "Again: {sys.query}"},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{LLM:Second@content}"]}, []),
        }
    )
    agent_id = api.create_agent(dsl)
    for question in ("one", "two"):
        say(api, agent_id, "ada", question)
    say(api, agent_id, "team/bob", "three")

    resp = api.get(f"/agents/{agent_id}/memory/ada")
    data = resp.json["data"]
    assert data["agent_id"] == agent_id and data["total"] == 8
    assert list(data["nodes"]) == ["LLM:First", "LLM:Second"]
    first = data["nodes"]["LLM:First"]
    assert [(e["role"], e["content"]) for e in first] == [
        (m["role"], m["content"]) for m in exchange("one") + exchange("two")
    ]
    assert all(isinstance(e["tokens"], int) and e["tokens"] > 0 and e["create_time"] > 0 for e in first)
    assert remembered(api, agent_id, "ada")["LLM:Second"][-1] == {
        "role": "assistant",
        "content": "echo: Again: two",
    }
    only = api.get(f"/agents/{agent_id}/memory/ada", query_string={"node_id": "LLM:Second"}).json["data"]
    assert list(only["nodes"]) == ["LLM:Second"] and only["total"] == 4
    # A key with a slash (the user id here) is one key.
    assert remembered(api, agent_id, "team/bob")["LLM:First"] == exchange("three")

    resp = api.delete(f"/agents/{agent_id}/memory/ada")
    assert resp.status_code == 200 and resp.json["data"]["deleted"] == 8
    assert remembered(api, agent_id, "ada") == {}
    assert remembered(api, agent_id, "team/bob") != {}
    say(api, agent_id, "ada", "who am I?")
    assert sent_history(llm, -2) == [] and sent_history(llm) == []
    again = api.delete(f"/agents/{agent_id}/memory/nobody")
    assert again.status_code == 200 and again.json["data"]["deleted"] == 0


def test_memory_routes_refuse_bad_keys_and_unknown_agents(api: Api):
    agent_id = api.create_agent(keyed_dsl())
    long_key = "k" * 256
    for method in (api.get, api.delete):
        resp = method(f"/agents/{agent_id}/memory/{long_key}")
        assert resp.status_code == 400 and resp.json["code"] == 101
        assert "256 characters" in resp.json["message"] and "255" in resp.json["message"]
        resp = method(f"/agents/{agent_id}/memory/%20ada")
        assert resp.status_code == 400 and "'ada'" in resp.json["message"]
        resp = method("/agents/nope/memory/ada")
        assert resp.status_code == 404 and resp.json["code"] == 102
        assert "'nope'" in resp.json["message"]
    resp = api.client.get(f"/api/v1/agents/{agent_id}/memory/ada")
    assert resp.status_code == 401 and resp.json["code"] == 401


def test_memory_is_bounded_per_key_and_node(api: Api, llm: LLMServer):
    agent_id = api.create_agent(keyed_dsl())
    store = DatabaseMemoryStore(_tenant_of(api), agent_id)
    entries = [{"role": ("user", "assistant")[i % 2], "content": f"m{i}"} for i in range(130)]

    def writes(node_id: str, start: int, stop: int) -> dict:
        return {(node_id, "u1"): [dict(e) for e in entries[start:stop]]}

    with api.app.app_context():
        # Three turns' worth of writes, beside another node's small memory.
        store.commit({**writes("LLM:Chat", 0, 60), **writes("LLM:Other", 0, 4)})
        store.commit(writes("LLM:Chat", 60, 100))
        store.commit(writes("LLM:Chat", 100, 130))
    kept = remembered(api, agent_id, "u1")
    assert kept["LLM:Chat"] == entries[30:] and len(kept["LLM:Chat"]) == 100
    assert kept["LLM:Other"] == entries[:4]

    # The model gets the newest of them, as many as the window asks for.
    say(api, agent_id, "u1", "newest?")
    assert sent_history(llm) == entries[-10:]


def test_deleting_an_agent_deletes_its_memory(api: Api, llm: LLMServer):
    gone, kept = api.create_agent(keyed_dsl()), api.create_agent(keyed_dsl())
    say(api, gone, "u1", "bye")
    say(api, kept, "u1", "stay")
    assert api.delete(f"/agents/{gone}").json["data"] is True
    with api.app.app_context():
        assert MemoryEntry.select().where(MemoryEntry.agent_id == gone).count() == 0
    assert remembered(api, kept, "u1") == {"LLM:Chat": exchange("stay")}


def _tenant_of(api: Api) -> str:
    return api.get("/system/tokens").json["data"][0]["tenant_id"]


def test_keys_differing_in_case_stay_apart_in_a_case_insensitive_mysql_database():
    """An operator may create the database with MySQL's usual case-insensitive collation."""
    name = f"agentcanvas_ci_{uuid.uuid4().hex[:12]}"
    admin = MySQLDatabase("information_schema", **MYSQL)
    with admin.connection_context():
        admin.execute_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
    try:
        init_database(f"mysql://root@127.0.0.1:3306/{name}", max_connections=2)
        store = DatabaseMemoryStore("tenant", "agent")
        with db.connection_context():
            store.commit(
                {
                    ("LLM:A", "Ada"): [{"role": "user", "content": "I am Ada"}],
                    ("LLM:A", "ada"): [{"role": "user", "content": "I am ada"}],
                }
            )
            assert [e["content"] for e in store.load("LLM:A", "Ada")] == ["I am Ada"]
            assert [e["content"] for e in store.entries("ada")["LLM:A"]] == ["I am ada"]
            assert store.delete("ADA") == 0 and store.delete("Ada") == 1
            assert [e["content"] for e in store.load("LLM:A", "ada")] == ["I am ada"]
    finally:
        db.obj.close_all()
        with admin.connection_context():
            admin.execute_sql(f"DROP DATABASE IF EXISTS `{name}`")


# -- a RAGFlow template: Begin, Categorize, desks, VariableAggregator, Message -------------

DESKS = {
    # category (as the model answers it) -> (the branch's Agent, its prompt prefix)
    "Delivery status": ("Agent:SwiftFoxesTrack", "Delivery question: "),
    "Refund request": ("Agent:KindBearsPay", "Refund question: "),
    "Something else": ("Agent:CalmDeerChat", "Customer says: "),
}


def export() -> dict:
    return json.loads(TEMPLATE.read_text(encoding="utf-8"))


def route(api: Api, llm: LLMServer, agent_id: str, session_id: str, question: str, model_says: str) -> list:
    """One turn with the classifier answering ``model_says``; returns the traced events."""
    llm.reset()
    llm.queue(text(model_says), text(f"desk reply to {question!r}"))
    frames = api.ask_stream(agent_id, session_id, question, return_trace=True)
    assert frames[-1] == "[DONE]"
    return frames[:-1]


def check_routed(llm: LLMServer, events: list, question: str, category: str) -> None:
    desk, prefix = DESKS[category]
    classify, answer = llm.chat_requests()
    assert "Categories:" in classify["messages"][0]["content"]
    assert classify["messages"][-1] == {"role": "user", "content": question}
    # Only the chosen desk asked the model, with its own prompt.
    assert answer["messages"][-1] == {"role": "user", "content": prefix + question}
    assert classify["model"] == answer["model"] == "test-model"  # the template's provider is not ours

    finished = {e["data"]["component_id"]: e["data"] for e in events if e["event"] == "node_finished"}
    ran_desks = {cid for cid in finished if cid.startswith("Agent:")}
    assert ran_desks == {desk}
    assert finished["Categorize:CleverOwlsSort"]["outputs"]["category_name"].strip() == category
    reply = f"desk reply to {question!r}"
    assert finished["VariableAggregator:NeatBirdsMerge"]["outputs"]["reply"] == reply
    end = next(e for e in events if e["event"] == "message_end")
    assert end["data"]["content"] == reply


def test_ragflow_template_imports_through_the_api_and_routes_each_category(api: Api, llm: LLMServer):
    original = export()
    resp = api.post("/agents", json={"title": original["title"], "dsl": original})
    assert resp.status_code == 200, resp.json
    agent_id = resp.json["data"]["id"]
    stored = api.get(f"/agents/{agent_id}").json["data"]["dsl"]
    assert stored["components"] == original["dsl"]["components"]
    assert stored["graph"] == original["dsl"]["graph"]

    session_id = api.create_session(agent_id, user_id="u1")
    # One session through every branch: each turn takes its own branch's value, never
    # a value left by the branch of an earlier turn.
    turns = [
        ("Where is my parcel?", "Delivery status", "Delivery status"),
        ("I want my money back", "Refund request.", "Refund request"),
        ("Do you sell gift cards?", "something else", "Something else"),
        ("Still no parcel", "It is about: Delivery status", "Delivery status"),
        # An answer naming no category goes to the default: the last one.
        ("blorp", "I cannot tell", "Something else"),
    ]
    for question, model_says, category in turns:
        events = route(api, llm, agent_id, session_id, question, model_says)
        check_routed(llm, events, question, category)
    session = api.session(agent_id, session_id)
    assert session["round"] == len(turns) and session["last_error"] is None


def test_ragflow_template_imported_with_the_cli_routes_too(api: Api, llm: LLMServer, cli):  # noqa: F811
    done = cli("agent", "import", str(TEMPLATE), "--tenant", "tenant-a")
    assert "Order help desk" in done.stdout
    listed = api.get("/agents", query_string={"title": "Order help desk"}).json["data"]["canvas"]
    assert len(listed) == 1
    agent_id = listed[0]["id"]
    session_id = api.create_session(agent_id)
    events = route(api, llm, agent_id, session_id, "How do I return these shoes?", "Refund request")
    check_routed(llm, events, "How do I return these shoes?", "Refund request")
