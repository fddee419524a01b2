"""The OpenAI-compatible endpoint: shapes, sessions, forms, usage, errors and ownership."""

from __future__ import annotations

import json

import pytest

from agent.llm.tokens import count_tokens
from tests.api.conftest import Api, dsl_of, echo_dsl, make_token, sample


def ask(api: Api, agent_id: str, content: str = "hi", **body):
    payload = {"model": "any", "messages": [{"role": "user", "content": content}], **body}
    return api.post(f"/agents_openai/{agent_id}/chat/completions", json=payload)


def chunks_of(resp) -> list:
    """The ``data: ...`` frames of an OpenAI stream: dicts, then ``"[DONE]"``."""
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    frames = []
    for block in resp.get_data(as_text=True).split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            body = block[len("data: ") :]
            frames.append(body if body == "[DONE]" else json.loads(body))
    return frames


def streamed_text(frames: list) -> str:
    return "".join(
        c["delta"].get("content") or "" for f in frames if isinstance(f, dict) for c in f.get("choices", [])
    )


def test_non_streamed_completion_and_session_continues(api: Api):
    agent_id = api.create_agent(echo_dsl())
    resp = ask(api, agent_id, "hello there")
    assert resp.status_code == 200
    body = resp.json
    assert body["object"] == "chat.completion" and body["model"] == "any"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello there"}
    assert body["choices"][0]["finish_reason"] == "stop"
    session_id = body["session_id"]
    assert body["id"] == session_id
    assert body["usage"] == {
        "prompt_tokens": count_tokens("hello there"),
        "completion_tokens": count_tokens("echo: hello there"),
        "total_tokens": count_tokens("hello there") + count_tokens("echo: hello there"),
    }

    # The same session through metadata.id, then through session_id.
    again = ask(api, agent_id, "second", metadata={"id": session_id})
    assert again.json["session_id"] == session_id
    third = ask(api, agent_id, "third", session_id=session_id)
    assert third.json["session_id"] == session_id
    session = api.session(agent_id, session_id)
    assert session["round"] == 3 and session["source"] == "openai"
    assert [m["content"] for m in session["message"] if m["role"] == "user"] == [
        "hello there",
        "second",
        "third",
    ]


def test_the_last_user_message_is_the_query(api: Api):
    agent_id = api.create_agent(echo_dsl())
    messages = [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "echo: first"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}],
        },
        {"role": "assistant", "content": None},
    ]
    resp = api.post(f"/agents_openai/{agent_id}/chat/completions", json={"messages": messages})
    assert resp.json["choices"][0]["message"]["content"] == "echo: part one\npart two"
    assert resp.json["model"] == agent_id  # no model given: the agent's id


def test_streamed_chunks_end_with_done(api: Api):
    agent_id = api.create_agent(echo_dsl())
    resp = ask(api, agent_id, "stream me", stream=True)
    assert resp.status_code == 200
    frames = chunks_of(resp)
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    session_id = chunks[0]["session_id"]
    assert all(c["id"] == session_id == c["session_id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert streamed_text(frames) == "echo: stream me"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c.get("usage") is None for c in chunks)

    with_usage = chunks_of(
        ask(
            api, agent_id, "count", stream=True, session_id=session_id, stream_options={"include_usage": True}
        )
    )
    assert with_usage[-2]["choices"] == [] and with_usage[-2]["usage"]["completion_tokens"] == count_tokens(
        "echo: count"
    )
    assert with_usage[-3]["choices"][0]["finish_reason"] == "stop"


def test_openai_compatible_flag_on_chat_completions(api: Api):
    agent_id = api.create_agent(echo_dsl())
    body = {
        "agent_id": agent_id,
        "openai-compatible": True,
        "messages": [{"role": "user", "content": "via flag"}],
    }
    resp = api.post("/agents/chat/completions", json=body)
    assert resp.status_code == 200 and resp.json["object"] == "chat.completion"
    assert resp.json["choices"][0]["message"]["content"] == "echo: via flag"
    frames = chunks_of(api.post("/agents/chat/completions", json={**body, "stream": True}))
    assert streamed_text(frames) == "echo: via flag" and frames[-1] == "[DONE]"
    bad = api.post("/agents/chat/completions", json={**body, "messages": []})
    assert bad.status_code == 400 and "'messages'" in bad.json["error"]["message"]


def test_paused_form_comes_back_as_tips_and_user_inputs(api: Api):
    agent_id = api.create_agent(sample("intake_form"))
    first = ask(api, agent_id, "sign me up").json
    tips = "Please tell us about yourself to sign up."
    assert first["choices"][0]["message"]["content"] == tips
    form = first["user_inputs"]
    assert form["component_id"] == "UserFillUp:Intake" and form["tips"] == tips
    assert set(form["inputs"]) == {"name", "age", "plan", "notes"}
    assert form["inputs"]["plan"]["options"] == ["basic", "pro"]
    session_id = first["session_id"]

    wrong = ask(api, agent_id, "", session_id=session_id, inputs={"name": "Ann", "age": "old", "plan": "pro"})
    assert wrong.status_code == 400 and "age" in wrong.json["data"]["errors"]
    assert wrong.json["error"]["type"] == "invalid_request_error"

    partial = chunks_of(ask(api, agent_id, "", session_id=session_id, inputs={"name": "Ann"}, stream=True))
    assert streamed_text(partial) == tips
    assert set(partial[-2]["user_inputs"]["inputs"]) == {"age", "plan"}

    done = ask(api, agent_id, "", session_id=session_id, inputs={"age": 30, "plan": "pro"}).json
    assert done["choices"][0]["message"]["content"].startswith(
        "Thanks Ann! You are signed up for the pro plan"
    )
    assert "user_inputs" not in done


@pytest.mark.parametrize(
    "body, says",
    [
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({}, "'messages' must be a non-empty list"),
        ({"messages": "hi"}, "'messages' must be a list, got text"),
        ({"messages": [{"content": "hi"}]}, "messages[0] must be an object with a 'role'"),
        ({"messages": ["hi"]}, "messages[0] must be an object"),
        ({"messages": [{"role": "system", "content": "x"}]}, "no message with role 'user'"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be text"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "only text parts",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "stream": "maybe"},
            "'stream' must be true or false",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "metadata": "s1"}, "'metadata' must be an object"),
        (
            {"messages": [{"role": "user", "content": "x"}], "metadata": {"id": 7}},
            "'metadata.id' must be a session id",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "metadata": {"id": "a"}, "session_id": "b"},
            "name different sessions",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "inputs": [1]}, "'inputs' must be an object"),
    ],
)
def test_bad_requests_are_clear_400s(api: Api, body, says):
    agent_id = api.create_agent(echo_dsl())
    resp = api.post(f"/agents_openai/{agent_id}/chat/completions", json=body)
    assert resp.status_code == 400 and resp.json["code"] == 101
    assert says in resp.json["message"] and resp.json["error"]["message"] == resp.json["message"]


def test_auth_and_ownership(api: Api, other: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = ask(api, agent_id).json["session_id"]

    # Another tenant: neither the agent nor the session exists for it.
    assert ask(other, agent_id).status_code == 404
    theirs = other.create_agent(echo_dsl())
    resp = ask(other, theirs, "x", metadata={"id": session_id})
    assert resp.status_code == 404 and resp.json["error"]["type"] == "not_found_error"
    # A session of another agent of the same tenant is not this agent's.
    second = api.create_agent(echo_dsl())
    assert ask(api, second, "x", session_id=session_id).status_code == 404
    assert api.session(agent_id, session_id)["round"] == 1

    no_token = api.client.post(
        f"/api/v1/agents_openai/{agent_id}/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
    )
    assert no_token.status_code == 401 and no_token.json["error"]["type"] == "authentication_error"
    embed = Api(api.app, make_token(api.app, "tenant-a", "embed"))
    assert ask(embed, agent_id).status_code == 401


def test_failed_turns(api: Api):
    agent_id = api.create_agent(dsl_of({"TestFail:F": ("TestFail", {"error": "LLMTimeout"}, [])}))
    resp = ask(api, agent_id)
    assert resp.status_code == 504 and resp.json["error"]["type"] == "server_error"
    assert "did not answer" in resp.json["error"]["message"]
    frames = chunks_of(ask(api, agent_id, stream=True))
    assert frames[-1] == "[DONE]" and "did not answer" in frames[-2]["error"]["message"]
    assert all(c["choices"][0]["finish_reason"] is None for c in frames[:-2])


def test_script_in_messages_is_data(api: Api):
    agent_id = api.create_agent(echo_dsl())
    script = "<script>alert(1)</script>"
    resp = ask(api, agent_id, script)
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.json["choices"][0]["message"]["content"] == f"echo: {script}"
