"""Completions on the samples, streamed and blocking; forms; conversation variables; failures."""

from __future__ import annotations

import secrets
import uuid

import pytest

from agent.canvas import Canvas
from api.db import Session
from tests.api.conftest import Api, dsl_of, echo_dsl, make_token, parse_sse, sample


def test_greeting_streamed_as_ragflow_sdk_reads_it(api: Api):
    agent_id = api.create_agent(sample("greeting"))
    session_id = api.create_session(agent_id)
    frames = api.ask_stream(agent_id, session_id, "hello there")
    assert frames[-1] == "[DONE]"
    events = frames[:-1]
    # Only what ragflow-sdk reads by default: message chunks, then message_end.
    assert {e["event"] for e in events[:-1]} == {"message"}
    assert events[-1]["event"] == "message_end"
    streamed = "".join(e["data"]["content"] for e in events[:-1])
    assert streamed.endswith("You said: hello there")
    assert events[-1]["data"]["content"] == streamed
    assert all(e["session_id"] == session_id for e in events)


def test_return_trace_streams_every_event(api: Api):
    agent_id = api.create_agent(sample("greeting"))
    frames = api.ask_stream(agent_id, api.create_session(agent_id), "hi", return_trace=True)
    names = [e["event"] for e in frames[:-1]]
    assert names[0] == "workflow_started" and names[-1] == "workflow_finished"
    assert "node_started" in names and "node_finished" in names and "message_end" in names


@pytest.mark.parametrize("route", ["completions", "regenerate", "openai", "embed"])
def test_a_stream_that_shows_no_node_event_has_none_made(api: Api, monkeypatch, route):
    """A stream without ``return_trace`` (and the OpenAI and embed streams) shows no node
    event: the run makes none (a ``node_finished`` holds its node's inputs and outputs as
    JSON). With ``return_trace`` they are made and shown."""
    made = []
    node_finished = Canvas._node_finished

    def spy(self, *args):
        made.append(args[0].id)
        return node_finished(self, *args)

    monkeypatch.setattr(Canvas, "_node_finished", spy)
    agent_id = api.create_agent(sample("greeting"))
    session_id = api.create_session(agent_id)
    traced = api.ask_stream(agent_id, session_id, "first", return_trace=True)
    assert made and [e["event"] for e in traced[:-1]].count("node_finished") == len(made)
    made.clear()
    if route == "completions":
        frames = api.ask_stream(agent_id, session_id, "hello there")
    elif route == "regenerate":
        frames = parse_sse(
            api.post(f"/agents/{agent_id}/sessions/{session_id}/regenerate", json={}).get_data(as_text=True)
        )
    elif route == "openai":
        resp = api.post(
            f"/agents_openai/{agent_id}/chat/completions",
            json={
                "messages": [{"role": "user", "content": "hello there"}],
                "stream": True,
                "session_id": session_id,
            },
        )
        frames = [line for line in resp.get_data(as_text=True).splitlines() if line.startswith("data:")]
    else:
        resp = api.app.test_client().post(
            f"/api/v1/agentbots/{agent_id}/completions",
            json={"question": "hello there", "user_id": secrets.token_hex(16), "stream": True},
            headers={"Authorization": f"Bearer {make_token(api.app, 'tenant-a', 'embed')}"},
        )
        frames = parse_sse(resp.get_data(as_text=True))
    assert ("You said: first" if route == "regenerate" else "hello there") in str(frames)
    assert made == []


def test_blocking_reply_and_a_new_session_when_none_given(api: Api):
    agent_id = api.create_agent(sample("greeting"))
    resp = api.ask(agent_id, None, "hey")
    assert resp.status_code == 200 and resp.json["code"] == 0
    data = resp.json["data"]
    assert data["event"] == "message_end"
    assert data["data"]["content"].endswith("You said: hey")
    session = api.session(agent_id, data["session_id"])
    assert session["round"] == 1 and session["message"][-1]["content"] == data["data"]["content"]
    # One random id per turn, as RAGFlow's: the message id a version-4 UUID, the task id its hex.
    message_id = uuid.UUID(data["message_id"])
    assert message_id.version == 4 and str(message_id) == data["message_id"]
    assert data["task_id"] == message_id.hex
    again = api.ask(agent_id, data["session_id"], "hey").json["data"]
    assert again["message_id"] != data["message_id"] and again["task_id"] != data["task_id"]


def test_chat_completions_takes_agent_id_in_the_body(api: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    resp = api.post(
        "/agents/chat/completions",
        json={"agent_id": agent_id, "session_id": session_id, "query": "q", "stream": False},
    )
    assert resp.json["data"]["data"]["content"] == "echo: q"
    resp = api.post("/agents/chat/completions", json={"query": "q"})
    assert resp.status_code == 400 and "`agent_id` is required" in resp.json["message"]


def _form_of(event: dict) -> dict:
    assert event["event"] == "user_inputs", event
    return event["data"]["inputs"]


def test_intake_form_paused_rejected_resumed_partially_finished(api: Api):
    agent_id = api.create_agent(sample("intake_form"))
    session_id = api.create_session(agent_id)

    first = api.ask(agent_id, session_id, "sign me up")
    assert first.status_code == 200
    form = _form_of(first.json["data"])
    assert set(form) == {"name", "age", "plan", "notes"} and form["notes"]["optional"] is True
    assert first.json["data"]["data"]["content"]  # the tips, where ragflow-sdk reads text
    paused = api.session(agent_id, session_id, dsl="true")
    assert paused["status"] == "paused" and paused["pending_form"] == "UserFillUp:Intake"

    wrong = api.ask(agent_id, session_id, inputs={"name": "Ann", "age": "forty"})
    assert wrong.status_code == 400 and wrong.json["code"] == 101
    assert set(wrong.json["data"]["errors"]) == {"age"}
    assert "integer" in wrong.json["data"]["errors"]["age"]
    unchanged = api.session(agent_id, session_id, dsl="true")
    assert unchanged["version"] == paused["version"] and unchanged["dsl"] == paused["dsl"]
    assert unchanged["status"] == "paused" and unchanged["message"] == paused["message"]

    partial = api.ask(agent_id, session_id, inputs={"name": "Ann", "age": {"value": "41"}})
    assert set(_form_of(partial.json["data"])) == {"plan"}
    # The transcript logs the answers as the form accepted them: "41" for an integer is 41.
    logged = [m for m in api.session(agent_id, session_id)["message"] if m["role"] == "user"][-1]
    assert logged["inputs"] == {"name": "Ann", "age": 41}

    frames = api.ask_stream(agent_id, session_id, inputs={"plan": "pro"})
    assert frames[-2]["event"] == "message_end"
    assert "Thanks Ann" in frames[-2]["data"]["content"] and "pro plan" in frames[-2]["data"]["content"]
    done = api.session(agent_id, session_id)
    assert done["status"] == "idle" and done["pending_form"] is None and done["round"] == 3

    stray = api.ask(agent_id, session_id, inputs={"plan": "pro"})
    assert stray.status_code == 400 and stray.json["code"] == 101


def test_streamed_pause_ends_with_the_form(api: Api):
    agent_id = api.create_agent(sample("intake_form"))
    frames = api.ask_stream(agent_id, api.create_session(agent_id), "hi")
    assert frames[-1] == "[DONE]"
    assert frames[-2]["event"] == "user_inputs" and frames[-2]["data"]["content"]
    assert set(frames[-2]["data"]["inputs"]) == {"name", "age", "plan", "notes"}


def test_counter_variables_read_typed_and_written(api: Api):
    agent_id = api.create_agent(sample("counter"))
    session_id = api.create_session(agent_id)
    path = f"/agents/{agent_id}/sessions/{session_id}/variables"
    assert (
        api.ask(agent_id, session_id, "one")
        .json["data"]["data"]["content"]
        .startswith("This is message number 1")
    )
    variables = {v["name"]: v for v in api.get(path).json["data"]}
    assert variables["count"]["value"] == 1 and variables["count"]["type"] == "number"
    assert variables["said"]["value"] == ["one"]

    resp = api.put(f"{path}/count", json={"value": "ten"})
    assert resp.status_code == 400 and resp.json["code"] == 101
    assert "'number'" in resp.json["message"] and "string" in resp.json["message"]
    resp = api.put(f"{path}/count", json={"value": None})
    assert resp.status_code == 400 and resp.json["message"].endswith("got null")
    resp = api.put(f"{path}/said", json={"value": ["ok", 3]})
    assert resp.status_code == 400 and "item 1 is number 3" in resp.json["message"]
    resp = api.put(f"{path}/nope", json={"value": 1})
    assert resp.status_code == 404 and "count" in resp.json["message"]
    resp = api.put(f"{path}/count", json={"val": 1})
    assert resp.status_code == 400 and "'value'" in resp.json["message"]
    before = api.session(agent_id, session_id)["version"]
    assert api.session(agent_id, session_id)["version"] == before  # refused writes stored nothing

    resp = api.put(f"{path}/count", json={"value": 10})
    assert resp.json["code"] == 0 and resp.json["data"]["value"] == 10
    assert api.session(agent_id, session_id)["version"] == before + 1
    answer = api.ask(agent_id, session_id, "two").json["data"]["data"]["content"]
    assert answer.startswith("This is message number 11")


def test_secret_variables_are_masked(api: Api):
    dsl = echo_dsl()
    dsl["variables"] = {
        "api_key": {"type": "secret", "value": "s3cr3t"},
        "plain": {"type": "string", "value": "x"},
    }
    agent_id = api.create_agent(dsl)
    session_id = api.create_session(agent_id)
    listed = {
        v["name"]: v["value"]
        for v in api.get(f"/agents/{agent_id}/sessions/{session_id}/variables").json["data"]
    }
    assert listed == {"api_key": "******", "plain": "x"}


def test_variable_write_while_a_turn_runs_is_busy(api: Api):
    agent_id = api.create_agent(sample("counter"))
    session_id = api.create_session(agent_id)
    with api.app.app_context():
        Session.update(lease_owner="someone", lease_expires=2**62).where(Session.id == session_id).execute()
    resp = api.put(f"/agents/{agent_id}/sessions/{session_id}/variables/count", json={"value": 3})
    assert resp.status_code == 409 and resp.json["code"] == 106


@pytest.mark.parametrize(("error", "status"), [("LLMError", 502), ("LLMTimeout", 504)])
def test_llm_failures_map_to_gateway_statuses(api: Api, error: str, status: int):
    dsl = dsl_of({"TestFail:Call": ("TestFail", {"error": error}, [])})
    agent_id = api.create_agent(dsl)
    session_id = api.create_session(agent_id)
    resp = api.ask(agent_id, session_id, "go")
    assert resp.status_code == status and resp.json["code"] == 100
    assert "TestFail:Call" in resp.json["message"]
    assert resp.json["data"]["data"]["content"] == resp.json["message"]

    frames = api.ask_stream(agent_id, session_id, "again")
    assert frames[-1] == "[DONE]"
    assert frames[-2]["event"] == "workflow_finished" and frames[-2]["data"]["status"] == "failed"
    assert "TestFail:Call" in frames[-2]["data"]["content"]

    # A failed turn appends no exchange; its error is on the session.
    session = api.session(agent_id, session_id)
    assert session["round"] == 0 and [m["role"] for m in session["message"]] == ["assistant"]
    assert "TestFail:Call" in session["last_error"] and session["status"] == "idle"


def test_completion_bad_input(api: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    cases = [
        ({"question": 5}, "'question'"),
        ({"question": "x", "inputs": "name=Ann"}, "'inputs'"),
        ({"question": "x", "session_id": 12}, "'session_id'"),
        ({"question": "x", "stream": "perhaps"}, "'stream'"),
        ({"question": "x", "files": "a.txt"}, "'files'"),
        ({"question": "x", "inputs": {"name": "Ann"}}, "no form"),
    ]
    for body, needle in cases:
        body.setdefault("session_id", session_id)
        resp = api.post(f"/agents/{agent_id}/completions", json=body)
        assert resp.status_code == 400 and resp.json["code"] == 101, (body, resp.json)
        assert needle in resp.json["message"], (body, resp.json["message"])
    resp = api.post(f"/agents/{agent_id}/completions", data="{oops", content_type="application/json")
    assert resp.status_code == 400 and "JSON" in resp.json["message"]
    resp = api.ask("nope", None, "x")
    assert resp.status_code == 404 and resp.json["code"] == 102
    resp = api.ask(agent_id, "nope", "x")
    assert resp.status_code == 404 and resp.json["code"] == 102

    # A session of agent X used with agent Y is not found.
    other_agent = api.create_agent(echo_dsl("other"))
    resp = api.ask(other_agent, session_id, "x")
    assert resp.status_code == 404 and resp.json["code"] == 102

    session = api.session(agent_id, session_id)
    assert session["round"] == 0 and session["version"] == 1 and session["status"] == "idle"


def test_refused_first_turn_leaves_no_session(api: Api):
    dsl = echo_dsl("age {begin@age}")
    dsl["components"]["begin"]["obj"]["params"].update(
        mode="task", inputs={"age": {"name": "Age", "type": "integer", "optional": False}}
    )
    agent_id = api.create_agent(dsl)
    resp = api.ask(agent_id, None, inputs={"age": "old"})
    assert resp.status_code == 400 and set(resp.json["data"]["errors"]) == {"age"}
    assert api.get(f"/agents/{agent_id}/sessions").json["data"] == []

    resp = api.ask(agent_id, None, inputs={"age": "41"})
    assert resp.json["data"]["data"]["content"] == "age 41"
    assert len(api.get(f"/agents/{agent_id}/sessions").json["data"]) == 1
