"""Completions answered in front of Flask (api.blueprints.completions.CompletionLane).

Every request here goes once through the app as served (the lane in front) and once
straight to Flask's view (the lane's inner WSGI app), each on sessions of its own: the
replies must be the same, status, headers and body (ids and times aside). Which of the
two answered is seen by counting the calls of Flask's view.
"""

from __future__ import annotations

import json
import re
import secrets

import pytest
from werkzeug.test import Client
from werkzeug.wrappers import Response

from api.db import Session
from tests.api.conftest import Api, dsl_of, echo_dsl, make_token, parse_sse, sample

_VARYING = {
    "id",
    "message_id",
    "task_id",
    "session_id",
    "created_at",
    "create_time",
    "update_time",
    "elapsed_time",
    "created",
}
_ANSWERS = {"name": "Ann", "age": 41, "plan": "pro", "notes": "n"}  # the intake form's
_HEADERS = (
    "Content-Type",
    "Retry-After",
    "Cache-Control",
    "Vary",
    "Access-Control-Allow-Origin",
    "Access-Control-Expose-Headers",
)
_ID = re.compile(r"[0-9a-f]{32}")


def _steady(value):
    """``value`` with the ids and times a reply makes anew each time blanked."""
    if isinstance(value, dict):
        return {k: "…" if k in _VARYING else _steady(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    if isinstance(value, str):
        return _ID.sub("…", value)  # a session named in a message
    return value


class FlaskOnly(Api):
    """An :class:`Api` whose requests skip the lane: they reach Flask as before it."""

    def __init__(self, app, token: str):
        super().__init__(app, token)
        self.client = Client(app.wsgi_app.wsgi_app, Response)


def _reply(resp) -> tuple:
    text = resp.get_data(as_text=True)
    if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
        # RAGFlow's frames are "data:<json>", OpenAI's "data: <json>" and "data: [DONE]"
        body = _steady(parse_sse(text.replace("data: ", "data:")))
    else:
        body = _steady(json.loads(text))
    headers = {h: resp.headers.get(h) for h in _HEADERS}
    headers["has X-Session-Id"] = "X-Session-Id" in resp.headers  # the embed page's (an id)
    return resp.status_code, headers, body


def _counting_view(app, endpoint: str = "completions.agent_completions") -> list:
    """Count the calls of Flask's view of a completion route (the lane never calls it)."""
    calls: list = []
    view = app.view_functions[endpoint]

    def counted(**kwargs):
        calls.append(kwargs)
        return view(**kwargs)

    app.view_functions[endpoint] = counted
    return calls


def _both(app, token: str, scenario) -> list:
    """``scenario(api)``'s replies through the lane and through Flask alone: the same."""
    replies = [[_reply(r) for r in scenario(cls(app, token))] for cls in (Api, FlaskOnly)]
    assert replies[0] == replies[1]
    return replies[0]


def test_a_form_turn_through_the_lane_is_answered_as_by_flask(app):
    calls = _counting_view(app)
    token = make_token(app)
    agent_id = Api(app, token).create_agent(sample("intake_form"))

    def form_turns(api: Api):
        session_id = api.create_session(agent_id)
        streamed = api.create_session(agent_id)
        return [
            api.ask(agent_id, session_id, "sign me up"),
            api.ask(agent_id, session_id, inputs=_ANSWERS),
            api.ask(agent_id, streamed, "sign me up", stream=True),
            api.ask(agent_id, streamed, inputs=_ANSWERS, stream=True, return_trace=True),
        ]

    paused, finished, paused_stream, finished_stream = _both(app, token, form_turns)
    assert paused[0] == 200 and paused[2]["data"]["event"] == "user_inputs"
    assert finished[0] == 200 and finished[2]["data"]["data"]["content"].startswith("Thanks Ann!")
    assert paused_stream[1]["Content-Type"].startswith("text/event-stream")
    assert [f["event"] for f in paused_stream[2][:-1]] == ["message", "message_end", "user_inputs"]
    assert "node_finished" in [f["event"] for f in finished_stream[2][:-1]]  # the trace
    assert len(calls) == 4  # Flask's view answered FlaskOnly's four; the lane, the app's


def _error_agents(app, view: str = "completions.agent_completions") -> tuple[list, str, tuple[str, str]]:
    """The calls of ``view`` counted, a token, and two agents: one that echoes the
    question, one whose turn times out (504)."""
    calls = _counting_view(app, view)
    token = make_token(app)
    api = Api(app, token)
    failing = dsl_of({"TestFail:Call": ("TestFail", {"error": "LLMTimeout"}, [])})
    return calls, token, (api.create_agent(echo_dsl()), api.create_agent(failing))


def _busy_session(app, api: Api, agent_id: str) -> str:
    """A session of ``agent_id`` that another turn holds (its lease far from expiring)."""
    session_id = api.create_session(agent_id)
    with app.app_context():
        Session.update(lease_owner="someone", lease_expires=2**62).where(Session.id == session_id).execute()
    return session_id


def test_errors_the_lane_meets_are_answered_as_by_flask(app):
    calls, token, (echo, failing) = _error_agents(app)

    def errors(api: Api):
        session_id = api.create_session(echo)
        busy_id = _busy_session(app, api, echo)
        blocking = {"session_id": session_id, "question": "hi", "stream": False}
        return [
            api.ask(echo, "no-such-session", "hi"),
            api.ask("no-such-agent", None, "hi"),
            api.ask(echo, session_id, inputs={"x": 1}),  # no form is waiting
            api.ask(echo, session_id, "hi", user_id="u" * 256),
            api.ask(echo, session_id, "hi", custom_header={"X-A": 1}),
            api.ask(echo, busy_id, "hi"),
            api.ask(failing, api.create_session(failing), "go"),
            api.ask(echo, None, "a new session"),
            *(
                api.post(f"/agents/{echo}/completions", json=blocking, headers={"Authorization": value})
                for value in ("Bearer wrong", "")
            ),
        ]

    replies = _both(app, token, errors)
    assert [r[0] for r in replies] == [404, 404, 400, 400, 400, 409, 504, 200, 401, 401]
    assert "busy" in replies[5][2]["message"] and replies[6][2]["code"] == 100
    # Flask's view ran for FlaskOnly's requests but the two its token check refused; the
    # lane answered all of the app's.
    assert len(calls) == 8


@pytest.mark.parametrize(
    "send",
    [
        pytest.param(lambda api, a, s: api.ask(a, s, 5), id="question-not-text"),
        pytest.param(lambda api, a, s: api.ask(a, s, "hi", stream="maybe"), id="stream-not-a-flag"),
        pytest.param(lambda api, a, s: api.ask(a, s, "hi", return_trace="maybe"), id="trace-not-a-flag"),
        pytest.param(lambda api, a, s: api.post(f"/agents/{a}/completions", data="{", content_type="application/json"),
                     id="not-json"),
        pytest.param(lambda api, a, s: api.post(f"/agents/{a}/completions", data="[]", content_type="application/json"),
                     id="not-an-object"),
        pytest.param(lambda api, a, s: api.post(f"/agents/{a}/completions", data=json.dumps(
            {"session_id": s, "question": "hi", "stream": False}), content_type="text/plain"), id="text-plain"),
        pytest.param(lambda api, a, s: api.post(f"/agents/{a}/completions", data=json.dumps(
            {"session_id": s, "question": "x" * 3000, "stream": False}), content_type="application/json"),
            id="too-large"),
    ],
)  # fmt: skip
def test_what_the_lane_does_not_take_reaches_flask(app_factory, send):
    app = app_factory(MAX_CONTENT_LENGTH=2048)
    calls = _counting_view(app)
    token = make_token(app)
    agent_id = Api(app, token).create_agent(echo_dsl())
    (reply,) = _both(app, token, lambda api: [send(api, agent_id, api.create_session(agent_id))])
    assert reply[0] in (200, 400, 413)
    assert len(calls) == 2  # Flask's view answered both: the lane stood aside


def test_the_token_rate_limit_counts_a_lane_request_once(app_factory):
    app = app_factory(SETTINGS={"rate": {"limit_api": "4/minute"}})
    token = make_token(app)
    api = Api(app, token)
    agent_id = api.create_agent(echo_dsl())  # 1
    session_id = api.create_session(agent_id)  # 2
    assert api.ask(agent_id, session_id, "hi").status_code == 200  # 3, through the lane
    assert api.ask(agent_id, session_id, "hi").status_code == 200  # 4
    refused = api.ask(agent_id, session_id, "hi")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert "AGENTCANVAS_RATE_LIMIT_API" in refused.json["message"]
    assert (
        api.post(f"/agents/{agent_id}/completions", data="{", content_type="application/json").status_code
        == 429
    )


def test_the_lane_stands_aside_when_flask_would_run_more(app):
    seen = []
    app.before_request(lambda: seen.append("hook"))
    calls = _counting_view(app)
    api = Api(app, make_token(app))
    agent_id = api.create_agent(echo_dsl())
    resp = api.ask(agent_id, api.create_session(agent_id), "hi")
    assert resp.status_code == 200 and resp.json["data"]["data"]["content"] == "echo: hi"
    assert len(calls) == 1 and seen.count("hook") == 3  # Flask answered all three, hooks run


# ------------------------------------------------------------------ the OpenAI route
_OPENAI_VIEW = "openai_compat.chat_completions"


def _openai(api: Api, agent_id: str, question: str = "hi", **body):
    messages = [{"role": "user", "content": question}]
    return api.post(f"/agents_openai/{agent_id}/chat/completions", json={"messages": messages, **body})


def test_an_openai_form_turn_through_the_lane_is_answered_as_by_flask(app):
    calls = _counting_view(app, _OPENAI_VIEW)
    token = make_token(app)
    agent_id = Api(app, token).create_agent(sample("intake_form"))

    def form_turns(api: Api):
        session_id = api.create_session(agent_id)
        streamed = api.create_session(agent_id)
        usage = {"include_usage": True}
        return [
            _openai(api, agent_id, "sign me up", session_id=session_id),
            _openai(api, agent_id, inputs=_ANSWERS, session_id=session_id, model="intake"),
            _openai(api, agent_id, "sign me up", metadata={"id": streamed}, stream=True),
            _openai(api, agent_id, inputs=_ANSWERS, session_id=streamed, stream=True, stream_options=usage),
            _openai(api, agent_id, "a new session"),
        ]

    paused, finished, paused_stream, finished_stream, new = _both(app, token, form_turns)
    assert paused[0] == 200 and paused[2]["object"] == "chat.completion"
    assert paused[2]["user_inputs"]["component_id"]  # the form waits
    assert finished[2]["choices"][0]["message"]["content"].startswith("Thanks Ann!")
    assert finished[2]["model"] == "intake"
    assert paused_stream[1]["Content-Type"].startswith("text/event-stream")
    assert paused_stream[2][-1] == "[DONE]" and finished_stream[2][-1] == "[DONE]"
    assert finished_stream[2][-2]["usage"]["completion_tokens"] > 0
    assert new[0] == 200
    assert len(calls) == 5  # Flask's view answered FlaskOnly's five; the lane, the app's


def test_openai_errors_the_lane_meets_are_answered_as_by_flask(app):
    calls, token, (echo, failing) = _error_agents(app, _OPENAI_VIEW)

    def errors(api: Api):
        session_id = api.create_session(echo)
        busy_id = _busy_session(app, api, echo)
        path = f"/agents_openai/{echo}/chat/completions"
        hello = {"messages": [{"role": "user", "content": "hi"}]}
        return [
            _openai(api, echo, session_id="no-such-session"),
            _openai(api, "no-such-agent"),
            _openai(api, echo, session_id=busy_id),
            _openai(api, echo, session_id=session_id, stream="maybe"),
            _openai(api, echo, session_id=session_id, metadata={"id": busy_id}),
            api.post(path, json={"messages": []}),
            api.post(path, json={"messages": [{"role": "assistant", "content": "hi"}]}),
            _openai(api, failing, session_id=api.create_session(failing)),
            _openai(api, echo, session_id=session_id),
            *(api.post(path, json=hello, headers={"Authorization": value}) for value in ("Bearer wrong", "")),
        ]

    replies = _both(app, token, errors)
    assert [r[0] for r in replies] == [404, 404, 409, 400, 400, 400, 400, 504, 200, 401, 401]
    for status, _, body in replies:
        if status >= 400:  # OpenAI's error object, the after_request hook's also where the lane answered
            assert body["error"]["message"] and body["error"]["type"], body
    assert replies[-1][2]["error"]["type"] == "authentication_error"
    assert replies[8][2]["choices"][0]["message"]["content"] == "echo: hi"
    # Flask's view ran for FlaskOnly's requests but the two its token check refused; the
    # lane answered all of the app's.
    assert len(calls) == 9


def test_an_openai_body_its_schema_refuses_reaches_flask(app):
    calls = _counting_view(app, _OPENAI_VIEW)
    token = make_token(app)
    agent_id = Api(app, token).create_agent(echo_dsl())
    path = f"/agents_openai/{agent_id}/chat/completions"
    (reply,) = _both(app, token, lambda api: [api.post(path, json={"messages": "hi"})])
    assert reply[0] in (400, 422) and reply[2]["error"]["type"]
    assert (
        len(calls) == 2
    )  # both reached Flask's view (whose schema check refused them): the lane stood aside


# ------------------------------------------------------------------ /agents/chat/completions
_CHAT_VIEW = "completions.chat_completions"


def _chat(api: Api, agent_id: str | None, **body):
    return api.post(
        "/agents/chat/completions", json={**({} if agent_id is None else {"agent_id": agent_id}), **body}
    )


def test_a_chat_form_turn_through_the_lane_is_answered_as_by_flask(app):
    """ragflow-sdk 0.26+'s session.ask: the agent in the body, RAGFlow's or OpenAI's shapes."""
    calls = _counting_view(app, _CHAT_VIEW)
    token = make_token(app)
    agent_id = Api(app, token).create_agent(sample("intake_form"))
    typed = {k: {"type": "line", "value": v} for k, v in _ANSWERS.items()}  # as ragflow-sdk sends them

    def form_turns(api: Api):
        session_id = api.create_session(agent_id)
        streamed = api.create_session(agent_id)
        openai = api.create_session(agent_id)
        messages = [{"role": "user", "content": "sign me up"}]
        return [
            _chat(api, agent_id, session_id=session_id, query="sign me up", stream=False),
            _chat(api, agent_id, session_id=session_id, inputs=typed, stream=False),
            _chat(api, agent_id, session_id=streamed, question="sign me up", stream=True),
            _chat(
                api, agent_id, session_id=streamed, inputs=_ANSWERS, return_trace=True
            ),  # streamed by default
            _chat(api, agent_id, session_id=openai, messages=messages, **{"openai-compatible": True}),
            _chat(api, agent_id, query="a new session", stream=False, **{"openai-compatible": False}),
        ]

    paused, finished, paused_stream, finished_stream, openai, new = _both(app, token, form_turns)
    assert paused[0] == 200 and paused[2]["data"]["event"] == "user_inputs"
    assert finished[2]["data"]["data"]["content"].startswith("Thanks Ann!")
    assert [f["event"] for f in paused_stream[2][:-1]] == ["message", "message_end", "user_inputs"]
    assert "node_finished" in [f["event"] for f in finished_stream[2][:-1]]
    assert openai[2]["object"] == "chat.completion" and openai[2]["user_inputs"]["component_id"]
    assert new[0] == 200 and new[2]["data"]["event"] == "user_inputs"
    assert len(calls) == 6  # Flask's view answered FlaskOnly's six; the lane, the app's


def test_chat_errors_the_lane_meets_are_answered_as_by_flask(app):
    calls, token, (echo, failing) = _error_agents(app, _CHAT_VIEW)

    def errors(api: Api):
        session_id = api.create_session(echo)
        return [
            _chat(api, None, query="hi"),  # RAGFlow's "`agent_id` is required."
            _chat(api, "no-such-agent", query="hi", stream=False),
            _chat(api, echo, session_id="no-such-session", query="hi", stream=False),
            _chat(api, echo, session_id=_busy_session(app, api, echo), query="hi", stream=False),
            _chat(api, failing, session_id=api.create_session(failing), query="go", stream=False),
            _chat(api, echo, session_id=session_id, messages=[], **{"openai-compatible": True}),
            _chat(api, echo, session_id=session_id, query="hi", stream=False),
            *(
                api.post(
                    "/agents/chat/completions", json={"agent_id": echo}, headers={"Authorization": value}
                )
                for value in ("Bearer wrong", "")
            ),
        ]

    replies = _both(app, token, errors)
    assert [r[0] for r in replies] == [400, 404, 404, 409, 504, 400, 200, 401, 401]
    assert "`agent_id` is required." in replies[0][2]["message"]
    assert replies[5][2]["error"]["type"] == "invalid_request_error"  # openai-compatible: OpenAI's shape
    assert replies[6][2]["data"]["data"]["content"] == "echo: hi"
    assert len(calls) == 7  # the lane answered all of the app's; Flask, FlaskOnly's but two


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"query": "hi", "openai-compatible": "maybe"}, id="openai-compatible-not-a-flag"),
        pytest.param({"query": "hi", "stream": "maybe"}, id="stream-not-a-flag"),
        pytest.param({"query": 5}, id="query-not-text"),
    ],
)
def test_a_chat_body_the_lane_does_not_take_reaches_flask(app, body):
    calls = _counting_view(app, _CHAT_VIEW)
    token = make_token(app)
    agent_id = Api(app, token).create_agent(echo_dsl())
    (reply,) = _both(app, token, lambda api: [_chat(api, agent_id, **body)])
    assert reply[0] in (400, 422)
    assert len(calls) == 2  # Flask's view answered both: the lane stood aside


# ------------------------------------------------------------------ the embed page's route
_BOT_VIEW = "embed.bot.bot_completions"
_SITE = "https://shop.example"  # the agents' allowed parent origin


def _bot(api: Api, agent_id: str, user_id: str, origin: str | None = _SITE, **body):
    """The embed page's completion, ``api`` speaking with an embed token."""
    headers = {"Origin": origin} if origin else {}
    return api.client.post(
        f"/api/v1/agentbots/{agent_id}/completions",
        json={"user_id": user_id, **body},
        headers=api.headers(headers),
    )


def _embeddable(app, dsl: dict) -> tuple[str, str]:
    """An agent of tenant-a that ``_SITE`` may embed, and an embed token of tenant-a."""
    api = Api(app, make_token(app))
    agent_id = api.create_agent(dsl)
    assert api.put(f"/agents/{agent_id}/embed", json={"allowed_origins": [_SITE]}).status_code == 200
    return agent_id, make_token(app, kind="embed")


def test_an_embed_form_turn_through_the_lane_is_answered_as_by_flask(app):
    calls = _counting_view(app, _BOT_VIEW)
    agent_id, token = _embeddable(app, sample("intake_form"))

    def form_turns(api: Api):
        visitor = secrets.token_hex(16)
        paused = _bot(api, agent_id, visitor, question="sign me up", stream=False)
        session_id = paused.headers["X-Session-Id"]
        return [
            paused,
            _bot(api, agent_id, visitor, session_id=session_id, inputs=_ANSWERS, stream=False),
            _bot(api, agent_id, visitor, origin=None, session_id=session_id, question="again"),  # streamed
            _bot(api, agent_id, visitor, origin="https://evil.example", question="hi", stream=False),
        ]

    paused, finished, streamed, elsewhere = _both(app, token, form_turns)
    assert paused[0] == 200 and paused[2]["data"]["event"] == "user_inputs"
    assert paused[1]["Access-Control-Allow-Origin"] == _SITE and paused[1]["has X-Session-Id"]
    assert "X-Session-Id" in paused[1]["Access-Control-Expose-Headers"] and "Origin" in paused[1]["Vary"]
    assert finished[2]["data"]["data"]["content"].startswith("Thanks Ann!")
    assert streamed[1]["Content-Type"].startswith("text/event-stream")
    assert streamed[1]["Access-Control-Allow-Origin"] is None  # no Origin sent
    assert elsewhere[0] == 200 and elsewhere[1]["Access-Control-Allow-Origin"] is None
    assert len(calls) == 4  # Flask's view answered FlaskOnly's four; the lane, the app's


def test_embed_errors_the_lane_meets_are_answered_as_by_flask(app):
    calls = _counting_view(app, _BOT_VIEW)
    agent_id, token = _embeddable(app, echo_dsl())
    api_token = make_token(app)

    def errors(api: Api):
        visitor = secrets.token_hex(16)
        session_id = _bot(api, agent_id, visitor, question="hi", stream=False).headers["X-Session-Id"]
        return [
            _bot(api, agent_id, "short", question="hi", stream=False),  # not an end-user id
            _bot(api, "no-such-agent", visitor, question="hi", stream=False),
            _bot(api, agent_id, secrets.token_hex(16), session_id=session_id, question="hi", stream=False),
            _bot(api, agent_id, visitor, question="x" * 70000, stream=False),  # over max_value_bytes
            _bot(api, agent_id, visitor, session_id=session_id, question="hi", stream=False),
            *(
                api.client.post(
                    f"/api/v1/agentbots/{agent_id}/completions",
                    json={"user_id": visitor, "question": "hi"},
                    headers={"Origin": _SITE, **({"Authorization": value} if value else {})},
                )
                for value in ("Bearer wrong", f"Bearer {api_token}", "")
            ),
        ]

    replies = _both(app, token, errors)
    assert [r[0] for r in replies] == [400, 404, 404, 413, 200, 401, 401, 401]
    assert replies[4][2]["data"]["data"]["content"] == "echo: hi"
    assert "embed tokens only" in replies[6][2]["message"]  # an API token is refused here
    for i, (status, headers, _) in enumerate(replies):  # CORS on errors too: the page can read them
        assert headers["Access-Control-Allow-Origin"] == (None if i == 1 else _SITE), (
            status
        )  # 1: no such agent
    # Flask's view ran for FlaskOnly's six (the session's first question, five errors), not
    # for the three its token check refused; the lane answered all of the app's.
    assert len(calls) == 6


def test_the_embed_rate_limit_counts_a_lane_request_once(app_factory):
    app = app_factory(SETTINGS={"rate": {"limit_embed": "2/minute"}})
    agent_id, token = _embeddable(app, echo_dsl())
    api, visitor = Api(app, token), secrets.token_hex(16)
    assert _bot(api, agent_id, visitor, question="hi", stream=False).status_code == 200  # through the lane
    assert _bot(api, agent_id, visitor, question="hi", stream=False).status_code == 200
    refused = _bot(api, agent_id, visitor, question="hi", stream=False)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["Access-Control-Allow-Origin"] == _SITE
    assert _bot(api, agent_id, secrets.token_hex(16), question="hi", stream=False).status_code == 200


def test_a_failing_cors_step_is_answered_as_by_flask(app, monkeypatch):
    """Flask answers an after_request hook that raises as an internal error, through the
    app's error handler (and runs the hooks on that reply once more); so does the lane."""
    from api.services import embed as embed_service

    calls = _counting_view(app, _BOT_VIEW)
    agent_id, token = _embeddable(app, echo_dsl())
    failing = {"on": False}
    looked_up = embed_service.cors_origin

    def cors_origin(agent, origin):
        if failing["on"]:
            raise RuntimeError("the origins could not be read")
        return looked_up(agent, origin)

    monkeypatch.setattr(embed_service, "cors_origin", cors_origin)

    def turns(api: Api):
        visitor = secrets.token_hex(16)
        failing["on"] = True
        try:
            return [_bot(api, agent_id, visitor, question="hi", stream=False)]
        finally:
            failing["on"] = False

    ((status, headers, body),) = _both(app, token, turns)
    assert status == 500 and body["code"] == 100 and "internal error" in body["message"]
    assert headers["Access-Control-Allow-Origin"] is None and "Origin" in headers["Vary"]
    assert len(calls) == 1  # Flask's view answered FlaskOnly's; the lane, the app's
