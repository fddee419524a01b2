"""MCP end to end: servers registered per tenant through ``/mcp/servers`` against a
real MCP server (the official SDK, streamable HTTP and SSE), and an Agent whose
``mcp`` tools the test model calls."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import Api, make_token
from tests.llm_server import LLMServer, text, tool_call
from tests.mcp_server import MCPTestServer


@pytest.fixture(scope="module")
def mcp_server():
    with MCPTestServer() as server:
        yield server


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


@pytest.fixture
def allowed(app_factory, llm):
    app = app_factory(
        SETTINGS={"invoke": {"allow_hosts": ["127.0.0.1"], "timeout_seconds": 2}, "llm": llm.settings()}
    )
    return Api(app, make_token(app, "tenant-a")), Api(app, make_token(app, "tenant-b"))


def register(api: Api, url: str, server_type: str, name: str = "calc", **extra) -> dict:
    resp = api.post("/mcp/servers", json={"name": name, "url": url, "server_type": server_type, **extra})
    assert resp.status_code == 200, resp.json
    return resp.json["data"]


@pytest.mark.parametrize("kind", ["streamable-http", "sse"])
def test_a_server_is_saved_with_the_tools_it_lists(allowed, mcp_server, kind):
    api, other = allowed
    url = mcp_server.streamable_url if kind == "streamable-http" else mcp_server.sse_url
    saved = register(api, url, kind, headers={"Authorization": "Bearer mcp-secret-token"})
    assert saved["server_type"] == kind and saved["url"] == url
    assert sorted(saved["variables"]["tools"]) == ["add", "broken", "shout", "slow"]
    assert saved["variables"]["tools"]["add"]["inputSchema"]["required"] == ["a", "b"]
    # The token is never shown again.
    assert saved["headers"] == {"Authorization": "********"}
    listed = api.get("/mcp/servers").json["data"]
    assert listed["total"] == 1 and listed["mcp_servers"][0]["id"] == saved["id"]
    assert "mcp-secret-token" not in json.dumps(listed)
    # Another tenant sees nothing of it.
    assert other.get("/mcp/servers").json["data"] == {"mcp_servers": [], "total": 0}
    assert other.get(f"/mcp/servers/{saved['id']}").status_code == 404
    # Update (masked header kept), test, delete.
    resp = api.put(f"/mcp/servers/{saved['id']}", json={"name": "calculator", "headers": saved["headers"]})
    assert resp.status_code == 200 and resp.json["data"]["name"] == "calculator"
    tested = api.post(f"/mcp/servers/{saved['id']}/test", json={"url": url, "server_type": kind}).json["data"]
    assert {t["name"] for t in tested} == {"add", "broken", "shout", "slow"}
    assert api.delete(f"/mcp/servers/{saved['id']}").json["data"] is True
    assert api.get(f"/mcp/servers/{saved['id']}").status_code == 404


def test_bad_servers_are_refused_clearly(allowed, mcp_server, app_factory):
    api, _ = allowed
    resp = api.post("/mcp/servers", json={"name": "x", "url": mcp_server.sse_url, "server_type": "stdio"})
    assert resp.status_code == 400 and "server_type" in resp.json["message"]
    resp = api.post("/mcp/servers", json={"name": "x", "url": "http://127.0.0.1:1/mcp", "server_type": "sse"})
    assert resp.status_code == 400 and "MCP server 'x' failed" in resp.json["message"]
    register(api, mcp_server.sse_url, "sse", name="dup")
    resp = api.post("/mcp/servers", json={"name": "dup", "url": mcp_server.sse_url, "server_type": "sse"})
    assert resp.status_code == 409
    # Without the allow-list, a loopback server is refused by the Invoke rules.
    app = app_factory()
    strict = Api(app, make_token(app, "tenant-c"))
    resp = strict.post("/mcp/servers", json={"name": "x", "url": mcp_server.sse_url, "server_type": "sse"})
    assert resp.status_code == 400 and "invoke.allow_hosts" in resp.json["message"]


def agent_dsl(mcp_id: str, tools) -> dict:
    return {
        "components": {
            "begin": {
                "obj": {"component_name": "Begin", "params": {}},
                "downstream": ["Agent:A"],
                "upstream": [],
            },
            "Agent:A": {
                "obj": {"component_name": "Agent", "params": {"mcp": [{"mcp_id": mcp_id, "tools": tools}]}},
                "downstream": ["Message:Out"],
                "upstream": ["begin"],
            },
            "Message:Out": {
                "obj": {"component_name": "Message", "params": {"content": ["{Agent:A@content}"]}},
                "downstream": [],
                "upstream": ["Agent:A"],
            },
        },
        "path": [],
        "history": [],
        "retrieval": [],
    }


# The calls do not depend on the database: SQLite only (registration runs on every backend).
@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("kind", ["streamable-http", "sse"])
def test_an_agent_calls_mcp_tools_the_model_chooses(allowed, mcp_server, llm, kind, backend):
    api, other = allowed
    url = mcp_server.streamable_url if kind == "streamable-http" else mcp_server.sse_url
    saved = register(api, url, kind, name=f"calc-{kind}")
    # RAGFlow's shape: tools by name with their definitions; a list of names works too.
    tools = {"add": saved["variables"]["tools"]["add"]}
    agent_id = api.create_agent(agent_dsl(saved["id"], tools))
    mcp_server.calls.clear()
    llm.queue(tool_call("add", {"a": 20, "b": 22}), text("It is 42."))
    resp = api.ask(agent_id, None, "what is 20 + 22?")
    assert resp.status_code == 200, resp.json
    assert resp.json["data"]["data"]["content"] == "It is 42."
    assert mcp_server.calls == [("add", {"a": 20, "b": 22})]
    first, second = llm.chat_requests()[-2:]
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]
    assert first["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": second["messages"][-1]["tool_call_id"],
        "content": "42",
    }

    # A failing tool and a tool that outlives invoke.timeout_seconds: the model is told.
    agent_id = api.create_agent(agent_dsl(saved["id"], ["broken", "slow"]))
    llm.queue(tool_call("broken", {}, ("slow", {"seconds": 30})), text("Both failed."))
    resp = api.ask(agent_id, None, "try")
    assert resp.json["data"]["data"]["content"] == "Both failed."
    results = [m["content"] for m in llm.chat_requests()[-1]["messages"] if m["role"] == "tool"]
    assert results[0].startswith("error: MCP tool 'broken' failed")
    assert results[1].startswith("error:") and "invoke.timeout_seconds" in results[1]

    # Another tenant's agent naming this server reaches nothing.
    foreign = other.create_agent(agent_dsl(saved["id"], ["add"]))
    llm.queue(tool_call("add", {"a": 1, "b": 1}), text("no luck"))
    other.ask(foreign, None, "1+1")
    assert "is not one of this tenant's servers" in llm.chat_requests()[-1]["messages"][-1]["content"]


def test_custom_header_of_the_request_reaches_the_mcp_server_for_that_turn(allowed, mcp_server, llm):
    api, _ = allowed
    saved = register(
        api,
        mcp_server.streamable_url,
        "streamable-http",
        name="calc-headers",
        headers={"Authorization": "Bearer server-token", "X-Team": "blue"},
    )
    agent_id = api.create_agent(agent_dsl(saved["id"], ["add"]))

    def seen_by_the_tool_call(**body) -> dict:
        mcp_server.headers.clear()
        llm.queue(tool_call("add", {"a": 1, "b": 2}), text("3"))
        resp = api.ask(agent_id, None, "1+2", **body)
        assert resp.status_code == 200 and resp.json["data"]["data"]["content"] == "3", resp.json
        return mcp_server.headers[-1]

    # As RAGFlow: the request's custom_header is added to the server's, and wins.
    seen = seen_by_the_tool_call(custom_header={"Authorization": "Bearer user-token", "X-User": "u7"})
    assert (
        seen["authorization"] == "Bearer user-token" and seen["x-user"] == "u7" and seen["x-team"] == "blue"
    )
    # Only for that turn.
    seen = seen_by_the_tool_call()
    assert seen["authorization"] == "Bearer server-token" and "x-user" not in seen
