"""Agent with tools through the test LLM server: the bounded loop, what goes back to
the model, other components (and Agents) as tools, streaming, bad tool specs."""

from __future__ import annotations

import json

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, finished_nodes, make_dsl, node, run
from tests.llm_server import LLMServer, text, tool_call

MERGE_TOOL = {
    "component_name": "StringTransform",
    "name": "shout",
    "params": {"method": "merge", "script": "{sys.query}!", "description": "Repeats the question loudly"},
}


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def agent_canvas(
    llm: LLMServer, tools: list[dict], message: str = "Result: {Agent:A@content}", **params
) -> Canvas:
    dsl = make_dsl(
        node("Agent:A", "Agent", {"sys_prompt": "Use tools.", "tools": tools, **params}),
        node("Message:Out", "Message", {"content": [message]}),
    )
    services = {
        "llm_settings": llm.settings(),
        "invoke": {"allow_hosts": ["127.0.0.1"], "timeout_seconds": 5},
    }
    return Canvas(dsl, services=services)


def test_tool_loop_stops_at_max_rounds_and_asks_for_the_answer(llm):
    canvas = agent_canvas(llm, [MERGE_TOOL], max_rounds=2)
    llm.queue(tool_call("shout"), tool_call("shout"), text("final answer"))
    events = run(canvas, "hey")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "Result: final answer"
    requests = llm.chat_requests()
    assert len(requests) == 3
    assert [r.get("tool_choice") for r in requests] == [None, None, "none"]
    assert all(r["tools"][0]["function"]["name"] == "shout" for r in requests)


def test_a_model_that_only_wants_tools_after_max_rounds_fails_clearly(llm):
    canvas = agent_canvas(llm, [MERGE_TOOL], max_rounds=1)
    llm.queue(tool_call("shout"), tool_call("shout"), tool_call("shout"))
    data = final(run(canvas, "hey"))
    assert data["status"] == "failed"
    assert "Agent:A" in data["error"] and "max_rounds=1" in data["error"]
    assert len(llm.chat_requests()) == 2
    assert llm.pending() == 1  # the loop did not go on


def test_tool_results_go_back_to_the_model(llm):
    canvas = agent_canvas(llm, [MERGE_TOOL], message="{Agent:A@content}.")
    llm.queue(tool_call("shout", {}), text("It said so"))
    events = run(canvas, "hello")
    assert answer(events) == "It said so."
    second = llm.chat_requests()[1]["messages"]
    assert second[:2] == [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "hello"}]
    call, result = second[2], second[3]
    assert call["role"] == "assistant" and call["tool_calls"][0]["function"]["name"] == "shout"
    assert result == {
        "role": "tool",
        "tool_call_id": call["tool_calls"][0]["id"],
        "content": '{"result": "hello!"}',
    }
    tools = llm.chat_requests()[0]["tools"]
    assert tools[0]["function"]["description"] == "Repeats the question loudly"


def test_an_invoke_tool_calls_a_real_http_endpoint(llm):
    invoke = {
        "component_name": "Invoke",
        "name": "models",
        "params": {"url": f"{llm.url}/models", "method": "get", "description": "Lists the models"},
    }
    canvas = agent_canvas(llm, [invoke])
    llm.queue(tool_call("models"), text("there is one model"))
    events = run(canvas, "which models?")
    assert final(events)["status"] == "succeeded"
    tool_message = llm.chat_requests()[1]["messages"][3]
    assert tool_message["role"] == "tool"
    result = json.loads(tool_message["content"])
    assert result["status_code"] == 200 and result["result"]["data"][0]["id"] == llm.model
    assert any(r["path"].endswith("/models") for r in llm.requests)


def test_another_agent_is_a_tool(llm):
    helper = {
        "component_name": "Agent",
        "name": "researcher",
        "params": {"sys_prompt": "You research.", "description": "Finds facts"},
    }
    canvas = agent_canvas(llm, [helper], message="{Agent:A@content}")
    usage = [{"prompt_tokens": p, "completion_tokens": 1, "total_tokens": p + 1} for p in (10, 20, 30)]
    llm.queue(
        tool_call("researcher", {"user_prompt": "find the capital", "context": "France"}, usage=usage[0]),
        text("Paris", usage=usage[1]),
        text("The capital is Paris", usage=usage[2]),
    )
    events = run(canvas, "capital of France?")
    assert answer(events) == "The capital is Paris"
    outer1, inner, outer2 = llm.chat_requests()
    params = outer1["tools"][0]["function"]["parameters"]
    assert params["required"] == ["user_prompt"] and "context" in params["properties"]
    assert inner["messages"] == [
        {"role": "system", "content": "You research."},
        {"role": "user", "content": "Context:\nFrance\n\nTask:\nfind the capital"},
    ]
    assert outer2["messages"][-1]["content"] == "Paris"
    assert final(events)["usage"] == {"prompt_tokens": 60, "completion_tokens": 3, "total_tokens": 63}


def test_unknown_tools_and_bad_arguments_are_told_to_the_model(llm):
    canvas = agent_canvas(llm, [MERGE_TOOL], message="{Agent:A@content}")
    llm.queue(tool_call("nope"), tool_call("shout", "{not json"), text("recovered"))
    events = run(canvas, "x")
    assert answer(events) == "recovered"
    tool_results = [m["content"] for m in llm.chat_requests()[2]["messages"] if m["role"] == "tool"]
    assert tool_results[0].startswith("error: there is no tool 'nope'") and "shout" in tool_results[0]
    assert tool_results[1].startswith("error: the arguments of tool call 'shout' are not JSON")


def test_calls_are_listed_in_the_outputs_when_read_whole(llm):
    dsl = make_dsl(
        node("Agent:A", "Agent", {"tools": [MERGE_TOOL]}),
        node("Message:Out", "Message", {"content": ["ok"]}),  # not streamed: read whole
    )
    llm.queue(tool_call("shout"), text("done"))
    events = run(Canvas(dsl, services={"llm_settings": llm.settings()}), "yo")
    calls = finished_nodes(events)["Agent:A"]["outputs"]["tool_calls"]
    assert calls == [{"name": "shout", "arguments": "{}", "result": '{"result": "yo!"}'}]


def test_streamed_agent_runs_its_tools_then_streams_the_answer(llm):
    canvas = agent_canvas(llm, [MERGE_TOOL], message="{Agent:A@content}")
    llm.queue(tool_call("shout"), text("the final words"))
    events = run(canvas, "q")
    chunks = [e["data"]["content"] for e in events if e["event"] == "message"]
    assert chunks == ["the ", "final ", "words"]
    assert all(r["stream"] is True for r in llm.chat_requests())
    assert json.loads(str(canvas))["memory"]["Agent:A"][-1]["content"] == "the final words"


@pytest.mark.parametrize(
    ("tools", "fragment"),
    [
        ([{"component_name": "Teleport", "name": "t"}], "unknown component type 'Teleport'"),
        ([{"component_name": "UserFillUp", "name": "ask"}], "cannot be a tool"),
        ([{"component_name": "StringTransform", "name": "s", "params": {"method": "explode"}}], "method"),
        (["shout"], "tools[0]"),
        (
            [{"component_name": "StringTransform", "params": {"method": "merge", "script": "{Nope:X@y}"}}],
            "Nope:X",
        ),
    ],
)
def test_bad_tool_specs_are_dsl_errors_naming_the_agent(tools, fragment):
    with pytest.raises(DSLError) as e:
        Canvas(make_dsl(node("Agent:A", "Agent", {"tools": tools})))
    assert "Agent:A" in str(e.value) and fragment in str(e.value)
