"""The official ``openai`` package against a real server: answers, streams, sessions, forms, errors."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from tests.e2e.conftest import SAMPLES, Client

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def served(deployment):
    """``(server, API token)``: one server on this test's database."""
    token = deployment.token()
    server = deployment.server()
    return server, token


def client_for(server, token: str, agent_id: str) -> OpenAI:
    # What a user writes: the agent's OpenAI-compatible base URL and the API token.
    return OpenAI(
        base_url=f"{server.url}/api/v1/agents_openai/{agent_id}", api_key=token, max_retries=0, timeout=60
    )


def test_streamed_and_non_streamed_answers_continue_one_session(deployment, served):
    server, token = served
    agent_id = deployment.import_agent(SAMPLES / "counter.json")
    client = client_for(server, token, agent_id)

    first = client.chat.completions.create(model="counter", messages=[{"role": "user", "content": "hello"}])
    assert first.object == "chat.completion"
    assert first.choices[0].message.content == "This is message number 1 in this session. You said: hello"
    assert first.usage.prompt_tokens > 0 and first.usage.completion_tokens > 0
    session_id = first.session_id  # the extra field that names the session
    assert first.id == session_id

    stream = client.chat.completions.create(
        model="counter",
        messages=[{"role": "user", "content": "again"}],
        stream=True,
        metadata={"id": session_id},
    )
    chunks = list(stream)
    assert len(chunks) > 2
    assert all(c.object == "chat.completion.chunk" and c.id == session_id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "This is message number 2 in this session. You said: again"
    assert chunks[-1].choices[0].finish_reason == "stop"

    third = client.chat.completions.create(
        model="counter",
        messages=[{"role": "user", "content": "three"}],
        extra_body={"session_id": session_id},
    )
    assert third.choices[0].message.content.startswith("This is message number 3 in this session.")

    fresh = client.chat.completions.create(model="counter", messages=[{"role": "user", "content": "new"}])
    assert fresh.session_id != session_id
    assert fresh.choices[0].message.content.startswith("This is message number 1 in this session.")

    session = Client(server.url, token).session(agent_id, session_id)
    assert session["round"] == 3 and session["source"] == "openai"


def test_usage_in_the_stream_and_forms(deployment, served):
    server, token = served
    agent_id = deployment.import_agent(SAMPLES / "intake_form.json")
    client = client_for(server, token, agent_id)

    stream = client.chat.completions.create(
        model="intake",
        messages=[{"role": "user", "content": "sign me up"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    finished = chunks[-2]
    form = finished.user_inputs
    assert set(form["inputs"]) == {"name", "age", "plan", "notes"}
    tips = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert tips == form["tips"] == "Please tell us about yourself to sign up."

    done = client.chat.completions.create(
        model="intake",
        messages=[{"role": "user", "content": "here you go"}],
        extra_body={"session_id": finished.session_id, "inputs": {"name": "Bo", "age": 19, "plan": "basic"}},
    )
    assert done.choices[0].message.content.startswith("Thanks Bo! You are signed up for the basic plan")


def test_errors_reach_the_client_as_openai_errors(deployment, served):
    server, token = served
    agent_id = deployment.import_agent(SAMPLES / "greeting.json")
    client = client_for(server, token, agent_id)
    with pytest.raises(openai.BadRequestError, match="'messages' must be a non-empty list"):
        client.chat.completions.create(model="g", messages=[])
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.chat.completions.create(
            model="g", messages=[{"role": "user", "content": "x"}], metadata={"id": "0" * 32}
        )
    stranger = client_for(server, "ac-not-a-token", agent_id)
    with pytest.raises(openai.AuthenticationError, match="not valid"):
        stranger.chat.completions.create(model="g", messages=[{"role": "user", "content": "x"}])
