"""A session's transcript: paged on every read, capped in stored size (docs/design.md §15, issue 8 point 11)."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, echo_dsl, make_token
from tests.api.test_embed import Bot


def _chat(api: Api, agent_id: str, session_id: str, turns: int) -> None:
    for i in range(turns):
        resp = api.ask(agent_id, session_id, f"q{i}")
        assert resp.status_code == 200, resp.json


def _texts(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages]


def test_get_session_pages_the_transcript_newest_page_first(api: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    _chat(api, agent_id, session_id, 5)  # prologue + 10 messages

    first = api.session(agent_id, session_id, messages_page_size=4)
    assert _texts(first["message"]) == ["q3", "echo: q3", "q4", "echo: q4"]
    assert first["messages_total"] == 11
    assert (first["messages_page"], first["messages_page_size"]) == (1, 4)
    second = api.session(agent_id, session_id, messages_page=2, messages_page_size=4)
    assert _texts(second["message"]) == ["q1", "echo: q1", "q2", "echo: q2"]
    third = api.session(agent_id, session_id, messages_page=3, messages_page_size=4)
    assert _texts(third["message"]) == ["Hi!", "q0", "echo: q0"]
    assert api.session(agent_id, session_id, messages_page=4, messages_page_size=4)["message"] == []


def test_no_transcript_reply_is_unbounded(app_factory):
    app = app_factory(PAGE_SIZE=6)
    api = Api(app, make_token(app))
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    _chat(api, agent_id, session_id, 5)
    data = api.session(agent_id, session_id)
    assert len(data["message"]) == 6 and data["messages_total"] == 11
    assert data["message"][-1]["content"] == "echo: q4"
    listed = api.get(f"/agents/{agent_id}/sessions", query_string={"messages": "true"}).json["data"]
    assert len(listed[0]["message"]) <= 100


@pytest.mark.parametrize(
    "params, field",
    [
        ({"messages_page": 0}, "messages_page"),
        ({"messages_page": "two"}, "messages_page"),
        ({"messages_page": "99999999999999999999"}, "messages_page"),
        ({"messages_page_size": 0}, "messages_page_size"),
        ({"messages_page_size": 1001}, "messages_page_size"),
    ],
)
def test_bad_transcript_page_is_a_400_naming_the_parameter(api: Api, params, field):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    resp = api.get(f"/agents/{agent_id}/sessions/{session_id}", query_string=params)
    assert resp.status_code == 400 and resp.json["code"] == 101
    assert field in resp.json["message"]


def test_a_full_transcript_refuses_the_next_turn_and_keeps_the_session(app_factory):
    app = app_factory(MAX_TRANSCRIPT_BYTES=2000)
    api = Api(app, make_token(app))
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    assert api.ask(agent_id, session_id, "x" * 1000).status_code == 200  # 3 + 1000 + 1006 bytes
    before = api.session(agent_id, session_id)

    resp = api.ask(agent_id, session_id, "one more")
    assert resp.status_code == 413 and resp.json["code"] == 101
    assert "session.max_transcript_bytes" in resp.json["message"]
    assert "start a new session" in resp.json["message"]
    after = api.session(agent_id, session_id)
    assert (after["version"], after["round"], after["message"]) == (
        before["version"],
        before["round"],
        before["message"],
    )
    assert after["status"] == "idle"
    # A new session of the same agent works.
    assert api.ask(agent_id, None, "fresh").status_code == 200


def test_embed_reload_pages_and_the_cap_stops_an_anonymous_visitor(app_factory):
    app = app_factory(MAX_TRANSCRIPT_BYTES=3000)
    api = Api(app, make_token(app))
    bot = Bot(app, make_token(app, "tenant-a", "embed"))
    agent_id = api.create_agent(echo_dsl())
    _, session_id = bot.chat(agent_id, "a" * 900)
    bot.chat(agent_id, "b" * 900, session_id=session_id)

    resp = bot.client.get(
        f"/api/v1/agentbots/{agent_id}/sessions/{session_id}",
        query_string={"user_id": bot.user_id, "messages_page_size": 2},
        headers=bot.headers(),
    )
    data = resp.json["data"]
    assert _texts(data["message"]) == ["b" * 900, "echo: " + "b" * 900]
    assert data["messages_total"] == 5

    full = bot.complete(agent_id, "c", session_id=session_id)
    assert full.status_code == 413
    assert "start a new session" in full.json["message"]
    assert bot.history(agent_id, session_id).json["data"]["messages_total"] == 5
