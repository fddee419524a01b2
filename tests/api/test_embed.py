"""Embedding: embed tokens, the agentbots API bound to end users, the page, the snippet, origins."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from api.db import Agent, Session, db, init_database
from api.db.migrations import MIGRATIONS
from api.db.models import SchemaVersion
from tests.api.conftest import Api, dsl_of, echo_dsl, make_token, parse_sse, sample

AGENTCANVAS = Path(sys.executable).parent / "agentcanvas"


def new_user() -> str:
    return secrets.token_hex(16)


class Bot:
    """The embed page's calls: an embed token and one end user."""

    def __init__(self, app, token: str, user_id: str | None = None):
        self.client = app.test_client()
        self.token = token
        self.user_id = user_id or new_user()

    def headers(self, **extra) -> dict:
        return {"Authorization": f"Bearer {self.token}", **extra}

    def inputs(self, agent_id: str):
        return self.client.get(f"/api/v1/agentbots/{agent_id}/inputs", headers=self.headers())

    def complete(self, agent_id: str, question: str = "", **body):
        payload = {"question": question, "user_id": self.user_id, **body}
        return self.client.post(
            f"/api/v1/agentbots/{agent_id}/completions", json=payload, headers=self.headers()
        )

    def chat(self, agent_id: str, question: str = "", **body) -> tuple[list, str]:
        """A streamed turn read to its end: ``(frames, session id)``."""
        resp = self.complete(agent_id, question, **body)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return parse_sse(resp.get_data(as_text=True)), resp.headers["X-Session-Id"]

    def history(self, agent_id: str, session_id: str, user_id: str | None = None):
        return self.client.get(
            f"/api/v1/agentbots/{agent_id}/sessions/{session_id}",
            query_string={"user_id": user_id or self.user_id},
            headers=self.headers(),
        )

    def cancel(self, agent_id: str, session_id: str):
        return self.client.post(
            f"/api/v1/agentbots/{agent_id}/sessions/{session_id}/cancel",
            json={"user_id": self.user_id},
            headers=self.headers(),
        )


@pytest.fixture
def embed_token(app) -> str:
    return make_token(app, "tenant-a", "embed")


@pytest.fixture
def bot(app, embed_token) -> Bot:
    return Bot(app, embed_token)


def text_of(frames: list) -> str:
    return "".join(
        f["data"].get("content", "") for f in frames if isinstance(f, dict) and f["event"] == "message"
    )


# ---------------------------------------------------------------------- tokens
def test_embed_token_opens_only_the_embed_routes(api: Api, bot: Bot):
    agent_id = api.create_agent(echo_dsl())
    assert bot.inputs(agent_id).status_code == 200
    frames, _ = bot.chat(agent_id, "hi")
    assert text_of(frames) == "echo: hi" and frames[-1] == "[DONE]"

    # The embed token on the management API: refused everywhere, sessions included.
    as_api = Api(api.app, bot.token)
    for method, path in [
        ("GET", "/agents"),
        ("GET", f"/agents/{agent_id}"),
        ("GET", f"/agents/{agent_id}/sessions"),
        ("POST", f"/agents/{agent_id}/completions"),
        ("GET", "/system/tokens"),
        ("POST", "/system/tokens"),
        ("GET", f"/agents/{agent_id}/embed"),
        ("POST", f"/agents_openai/{agent_id}/chat/completions"),
    ]:
        resp = as_api.call(
            method, path, json={"question": "x", "messages": [{"role": "user", "content": "x"}]}
        )
        assert resp.status_code == 401 and resp.json["code"] == 401, (method, path, resp.json)
    # ...and there is no embed route that lists sessions.
    listing = bot.client.get(f"/api/v1/agentbots/{agent_id}/sessions", headers=bot.headers())
    assert listing.status_code in (404, 405)

    # An API token on the embed routes: refused, saying embed tokens only.
    as_api_token = Bot(api.app, api.token)
    for resp in (as_api_token.inputs(agent_id), as_api_token.complete(agent_id, "x")):
        assert resp.status_code == 401 and resp.json["code"] == 401
        assert "embed tokens only" in resp.json["message"]


def test_missing_wrong_and_revoked_embed_tokens(api: Api, bot: Bot):
    agent_id = api.create_agent(echo_dsl())
    missing = bot.client.get(f"/api/v1/agentbots/{agent_id}/inputs")
    assert missing.status_code == 401 and "missing embed token" in missing.json["message"]
    wrong = Bot(api.app, "acembed-" + secrets.token_urlsafe(32)).complete(agent_id, "x")
    assert wrong.status_code == 401 and wrong.json["code"] == 401

    frames, session_id = bot.chat(agent_id, "before")
    assert api.delete(f"/system/tokens/{bot.token}").json["code"] == 0
    # Revoked: the very next call is refused, whatever the route.
    assert bot.inputs(agent_id).status_code == 401
    assert bot.complete(agent_id, "after", session_id=session_id).status_code == 401
    assert bot.history(agent_id, session_id).status_code == 401
    assert bot.cancel(agent_id, session_id).status_code == 401
    page = bot.client.get(f"/embed/agents/{agent_id}", query_string={"auth": bot.token})
    assert page.status_code == 401 and "not valid" in page.get_data(as_text=True)
    assert api.session(agent_id, session_id)["round"] == 1


def test_embed_tokens_are_per_tenant(api: Api, other: Api, bot: Bot):
    mine = api.create_agent(echo_dsl())
    theirs = other.create_agent(echo_dsl())
    resp = bot.inputs(theirs)
    assert resp.status_code == 404 and resp.json["code"] == 102
    assert bot.complete(theirs, "x").status_code == 404
    page = bot.client.get(f"/embed/agents/{theirs}", query_string={"auth": bot.token})
    assert page.status_code == 404
    assert bot.inputs(mine).status_code == 200


# ---------------------------------------------------------------------- the bot API
def test_inputs_show_title_prologue_mode_and_begin_form(api: Api, bot: Bot):
    dsl = dsl_of({"Message:M": ("Message", {"content": ["{begin@city}"]}, [])}, prologue="Hello there")
    dsl["components"]["begin"]["obj"]["params"].update(
        mode="task", inputs={"city": {"name": "City", "type": "line", "optional": False}}
    )
    agent_id = api.create_agent(dsl, title="Weather")
    data = bot.inputs(agent_id).json["data"]
    assert data["title"] == "Weather" and data["prologue"] == "Hello there" and data["mode"] == "task"
    assert data["inputs"] == {"city": {"name": "City", "type": "line", "optional": False}}
    assert "avatar" in data

    # Task mode: Begin's form comes with the first call.
    frames, session_id = bot.chat(agent_id, "", inputs={"city": "Oslo"})
    assert text_of(frames) == "Oslo"
    wrong = bot.complete(agent_id, "", inputs={"town": "Oslo"})
    assert wrong.status_code == 400 and "town" in wrong.json["data"]["errors"]


def test_streamed_by_default_and_blocking_on_request(api: Api, bot: Bot):
    agent_id = api.create_agent(echo_dsl())
    frames, session_id = bot.chat(agent_id, "one")
    events = [f["event"] for f in frames[:-1]]
    assert set(events[:-1]) == {"message"} and events[-1] == "message_end"  # no node events
    assert all(f["session_id"] == session_id for f in frames[:-1])
    resp = bot.complete(agent_id, "two", session_id=session_id, stream=False)
    assert resp.status_code == 200 and resp.json["data"]["data"]["content"] == "echo: two"
    assert resp.headers["X-Session-Id"] == session_id
    history = bot.history(agent_id, session_id).json["data"]
    assert [m["content"] for m in history["message"]] == ["Hi!", "one", "echo: one", "two", "echo: two"]
    assert history["status"] == "idle" and history["form"] is None


def test_sessions_are_bound_to_their_end_user(api: Api, bot: Bot):
    agent_id = api.create_agent(echo_dsl())
    _, session_id = bot.chat(agent_id, "secret plans")
    stranger = Bot(api.app, bot.token)
    for resp in (
        stranger.complete(agent_id, "let me in", session_id=session_id),
        stranger.history(agent_id, session_id),
        stranger.cancel(agent_id, session_id),
        bot.history(agent_id, session_id, user_id=new_user()),
    ):
        assert resp.status_code == 404 and resp.json["code"] == 102
        assert "secret plans" not in resp.get_data(as_text=True)
    # The stranger's own conversation is separate.
    _, theirs = stranger.chat(agent_id, "hello")
    assert theirs != session_id
    assert len(bot.history(agent_id, session_id).json["data"]["message"]) == 3

    # A session made through the management API is out of reach of the embed routes,
    # even with the user id it was made with.
    api_session = api.create_session(agent_id, user_id=bot.user_id)
    assert bot.complete(agent_id, "x", session_id=api_session).status_code == 404
    assert bot.history(agent_id, api_session).status_code == 404
    # The tenant sees its end users' sessions (it owns them).
    listed = api.get(f"/agents/{agent_id}/sessions", query_string={"user_id": bot.user_id}).json["data"]
    assert {s["id"] for s in listed} == {session_id, api_session}
    assert api.session(agent_id, session_id)["source"] == "embed"


@pytest.mark.parametrize(
    "user_id, says",
    [
        (None, "'user_id' is required"),
        ("", "'user_id' is required"),
        (12345678901234567890123456789012, "'user_id' is out of range"),
        (1234567890123456789, "must be text"),
        ("short", "is not an end-user id"),
        ("x" * 129, "is not an end-user id"),
        ("has spaces but is long enough to pass a length check", "is not an end-user id"),
        ("<script>alert(1)</script>aaaaaaaaaaaaaaa", "is not an end-user id"),
        ("0" * 32, "does not look random"),
        ("abababababababababababababababab", "does not look random"),
    ],
)
def test_end_user_id_must_be_a_random_id(api: Api, bot: Bot, user_id, says):
    agent_id = api.create_agent(echo_dsl())
    body = {"question": "x"} if user_id is None else {"question": "x", "user_id": user_id}
    resp = bot.client.post(f"/api/v1/agentbots/{agent_id}/completions", json=body, headers=bot.headers())
    assert resp.status_code == 400 and resp.json["code"] == 101
    assert says in resp.json["message"]
    history = bot.client.get(
        f"/api/v1/agentbots/{agent_id}/sessions/{'a' * 32}", query_string={"user_id": user_id or ""}
    )
    assert history.status_code == 401  # no token: refused before anything else
    with api.app.app_context():
        assert Session.select().where(Session.agent_id == agent_id).count() == 0


def test_accepted_end_user_id_shapes(api: Api, bot: Bot):
    agent_id = api.create_agent(echo_dsl())
    for user_id in (
        secrets.token_hex(16),
        str(uuid.uuid4()),
        secrets.token_urlsafe(24),
        secrets.token_hex(64),
    ):
        resp = Bot(api.app, bot.token, user_id).complete(agent_id, "x", stream=False)
        assert resp.status_code == 200, (user_id, resp.json)


def test_form_through_the_embed_routes(api: Api, bot: Bot):
    agent_id = api.create_agent(sample("intake_form"))
    frames, session_id = bot.chat(agent_id, "sign me up")
    assert frames[-2]["event"] == "user_inputs"
    assert set(frames[-2]["data"]["inputs"]) == {"name", "age", "plan", "notes"}
    history = bot.history(agent_id, session_id).json["data"]
    assert history["status"] == "paused" and history["form"]["component_id"] == "UserFillUp:Intake"
    assert set(history["form"]["inputs"]) == {"name", "age", "plan", "notes"}
    before = api.session(agent_id, session_id)

    wrong = bot.complete(
        agent_id, "", session_id=session_id, inputs={"name": "Ann", "age": "forty", "plan": "gold"}
    )
    assert wrong.status_code == 400 and wrong.json["code"] == 101
    assert set(wrong.json["data"]["errors"]) == {"age", "plan"}
    after = api.session(agent_id, session_id)
    assert (after["version"], after["round"], after["status"]) == (
        before["version"],
        before["round"],
        "paused",
    )

    frames, _ = bot.chat(
        agent_id, "", session_id=session_id, inputs={"name": "Ann", "age": "40", "plan": "pro"}
    )
    assert "Thanks Ann! You are signed up for the pro plan" in text_of(frames)
    history = bot.history(agent_id, session_id).json["data"]
    assert history["status"] == "idle" and history["form"] is None
    answered = [m for m in history["message"] if m["role"] == "user"][-1]
    assert answered["inputs"] == {"name": "Ann", "age": 40, "plan": "pro"}  # as the form accepted them


def test_stop_button_cancels_only_its_own_running_turn(api: Api, bot: Bot):
    agent_id = api.create_agent(dsl_of({"TestTicker:T": ("TestTicker", {}, [])}))
    resp = bot.client.post(
        f"/api/v1/agentbots/{agent_id}/completions",
        json={"question": "go", "user_id": bot.user_id},
        headers=bot.headers(),
        buffered=False,
    )
    session_id = resp.headers["X-Session-Id"]
    chunks = iter(resp.response)
    assert json.loads(next(chunks).decode()[len("data:") :])["event"] == "message"

    assert Bot(api.app, bot.token).cancel(agent_id, session_id).status_code == 404
    busy = bot.complete(agent_id, "again", session_id=session_id)
    assert busy.status_code == 409 and busy.json["code"] == 106

    cancelled = bot.cancel(agent_id, session_id)
    assert cancelled.status_code == 200 and cancelled.json["data"]["cancelled"] is True
    frames = parse_sse("".join(c.decode() for c in chunks))
    assert frames[-2]["event"] == "workflow_finished" and frames[-2]["data"]["status"] == "cancelled"
    again = bot.cancel(agent_id, session_id)
    assert again.status_code == 200 and again.json["data"]["cancelled"] is False


def test_oversized_inputs(app_factory):
    app = app_factory(MAX_CONTENT_LENGTH=200_000, LIMITS={"max_value_bytes": 1000})
    api = Api(app, make_token(app))
    bot = Bot(app, make_token(app, kind="embed"))
    agent_id = api.create_agent(sample("intake_form"))

    long_message = bot.complete(agent_id, "x" * 1001)
    assert long_message.status_code == 413 and "limits.max_value_bytes" in long_message.json["message"]
    files = bot.complete(agent_id, "x", files=[{"name": "a.txt", "data": "z" * 1000}])
    assert files.status_code == 413 and "'files'" in files.json["message"]
    body = bot.complete(agent_id, "x", padding="y" * 300_000)
    assert body.status_code == 413 and body.json["code"] == 101
    with app.app_context():
        assert Session.select().count() == 0

    _, session_id = bot.chat(agent_id, "x" * 1000)
    huge = bot.complete(
        agent_id, "", session_id=session_id, inputs={"name": "A" * 2000, "age": 1, "plan": "pro"}
    )
    assert huge.status_code == 400 and "limit is 1000" in huge.json["data"]["errors"]["name"]
    assert api.session(agent_id, session_id)["status"] == "paused"


def test_script_in_messages_and_form_values_comes_back_as_data(api: Api, bot: Bot):
    agent_id = api.create_agent(sample("intake_form"))
    script = "<script>alert('x')</script>"
    frames, session_id = bot.chat(agent_id, script)
    resp = bot.complete(
        agent_id, "", session_id=session_id, inputs={"name": script, "age": 30, "plan": "basic"}, stream=False
    )
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.json["data"]["data"]["content"].startswith(f"Thanks {script}!")
    history = bot.history(agent_id, session_id)
    assert history.headers["Content-Type"] == "application/json"
    contents = [m["content"] for m in history.json["data"]["message"]]
    assert script in contents and any(c.startswith(f"Thanks {script}") for c in contents)

    # A title with markup is escaped in the page, which runs no inline script at all.
    titled = api.create_agent(echo_dsl(), title="<img src=x onerror=alert(1)>")
    page = bot.client.get(f"/embed/agents/{titled}", query_string={"auth": bot.token})
    html = page.get_data(as_text=True)
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]


def test_failures_reach_end_users_without_internal_detail(api: Api, bot: Bot):
    agent_id = api.create_agent(dsl_of({"TestFail:F": ("TestFail", {"error": "LLMError"}, [])}))
    frames, session_id = bot.chat(agent_id, "x")
    final = frames[-2]
    assert final["event"] == "workflow_finished" and final["data"]["status"] == "failed"
    assert "language service is not available" in final["data"]["content"]
    assert "HTTP 503" not in json.dumps(frames) and "TestFail:F" not in json.dumps(frames)

    blocking = bot.complete(agent_id, "y", session_id=session_id, stream=False)
    assert blocking.status_code == 502 and blocking.json["code"] == 100
    assert "language service is not available" in blocking.json["message"]
    assert "HTTP 503" not in blocking.get_data(as_text=True)
    # The agent's owner reads the whole error.
    assert "HTTP 503" in api.session(agent_id, session_id)["last_error"]

    timeout = api.create_agent(dsl_of({"TestFail:F": ("TestFail", {"error": "LLMTimeout"}, [])}))
    resp = bot.complete(timeout, "z", stream=False)
    assert resp.status_code == 504 and "took too long" in resp.json["data"]["data"]["content"]


# ---------------------------------------------------------------------- the page
def test_page_needs_an_embed_token_of_the_agents_tenant(api: Api, bot: Bot):
    agent_id = api.create_agent(echo_dsl(), title="Helper")
    page = bot.client.get(f"/embed/agents/{agent_id}", query_string={"auth": bot.token})
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    html = page.get_data(as_text=True)
    assert "<title>Helper</title>" in html and f'data-token="{bot.token}"' in html
    assert "/static/embed.js" in html and "/static/embed.css" in html
    assert "http" not in html.replace("http-equiv", "")  # nothing fetched from elsewhere
    assert page.headers["Referrer-Policy"] == "no-referrer" and page.headers["Cache-Control"] == "no-store"
    for asset in ("embed.js", "embed.css"):
        assert bot.client.get(f"/static/{asset}").status_code == 200

    missing = bot.client.get(f"/embed/agents/{agent_id}")
    assert missing.status_code == 401 and "no embed token" in missing.get_data(as_text=True)
    api_token = bot.client.get(f"/embed/agents/{agent_id}", query_string={"auth": api.token})
    assert api_token.status_code == 401
    assert "embed tokens only" in api_token.get_data(as_text=True)
    assert api.token not in api_token.get_data(as_text=True)
    unknown = bot.client.get(f"/embed/agents/{uuid.uuid4().hex}", query_string={"auth": bot.token})
    assert unknown.status_code == 404 and "does not exist" in unknown.get_data(as_text=True)


# ---------------------------------------------------------------------- snippet and origins
def test_snippet_and_allowed_origins(api: Api, bot: Bot):
    agent_id = api.create_agent(echo_dsl(), title='Say "hi"')
    data = api.get(f"/agents/{agent_id}/embed").json["data"]
    assert data["url"].endswith(f"/embed/agents/{agent_id}?auth=EMBED_TOKEN")
    assert data["allowed_origins"] == [] and data["frame_ancestors"] == "'self'"
    assert len(data["notes"]) == 2

    data = api.get(f"/agents/{agent_id}/embed", query_string={"embed_token": bot.token}).json["data"]
    assert data["url"].endswith(f"?auth={bot.token}")
    assert data["iframe"].startswith(f'<iframe src="{data["url"]}" title="Say &#34;hi&#34;"')
    page = bot.client.get(data["url"].split("localhost", 1)[1])
    assert page.status_code == 200
    assert page.headers["Content-Security-Policy"].endswith("frame-ancestors 'self'")

    wrong = api.get(f"/agents/{agent_id}/embed", query_string={"embed_token": api.token})
    assert wrong.status_code == 400 and "'embed_token'" in wrong.json["message"]

    put = api.put(
        f"/agents/{agent_id}/embed",
        json={
            "allowed_origins": [
                "https://Shop.Example.com:443/",
                "http://127.0.0.1:8000",
                "http://127.0.0.1:8000",
            ]
        },
    )
    assert put.json["data"]["allowed_origins"] == ["https://shop.example.com", "http://127.0.0.1:8000"]
    assert "notes" in put.json["data"]  # still no token in it
    policy = bot.client.get(f"/embed/agents/{agent_id}", query_string={"auth": bot.token}).headers[
        "Content-Security-Policy"
    ]
    assert policy.endswith("frame-ancestors 'self' https://shop.example.com http://127.0.0.1:8000")
    # Not versioned with the DSL: a new DSL keeps them.
    api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl("again: {sys.query}")})
    assert (
        api.get(f"/agents/{agent_id}/embed").json["data"]["allowed_origins"]
        == put.json["data"]["allowed_origins"]
    )

    assert (
        api.put(f"/agents/{agent_id}/embed", json={"allowed_origins": ["*"]}).json["data"]["frame_ancestors"]
        == "*"
    )
    assert (
        api.put(f"/agents/{agent_id}/embed", json={"allowed_origins": []}).json["data"]["frame_ancestors"]
        == "'self'"
    )


@pytest.mark.parametrize(
    "body, says",
    [
        ({}, "'allowed_origins'"),
        ({"allowed_origins": "https://a.com"}, "must be a list"),
        ({"allowed_origins": ["a.com"]}, "'a.com' must be http(s)://host[:port]"),
        ({"allowed_origins": ["ftp://a.com"]}, "'ftp://a.com'"),
        ({"allowed_origins": ["https://a.com/page"]}, "no path"),
        ({"allowed_origins": ["https://user@a.com"]}, "no path, query or user"),
        ({"allowed_origins": ["https://a.com:99999"]}, "bad port"),
        ({"allowed_origins": [7]}, "got 7"),
        ({"allowed_origins": ["https://a.com; script-src *"]}, "bad host name"),
        ({"allowed_origins": ["https://a..com"]}, "bad host name"),
        ({"allowed_origins": ["https://a.com\r\nSet-Cookie: x=1"]}, "allowed origin"),
        ({"allowed_origins": ["http://[::g]:80"]}, "allowed origin"),
        ({"allowed_origins": [f"https://a{i}.com" for i in range(51)]}, "the limit is 50"),
    ],
)
def test_bad_allowed_origins(api: Api, body, says):
    agent_id = api.create_agent(echo_dsl())
    resp = api.put(f"/agents/{agent_id}/embed", json=body)
    assert resp.status_code == 400 and resp.json["code"] == 101 and says in resp.json["message"]
    assert api.get(f"/agents/{agent_id}/embed").json["data"]["allowed_origins"] == []


def test_origins_of_another_tenants_agent(api: Api, other: Api):
    theirs = other.create_agent(echo_dsl())
    assert api.get(f"/agents/{theirs}/embed").status_code == 404
    assert api.put(f"/agents/{theirs}/embed", json={"allowed_origins": ["https://a.com"]}).status_code == 404


def test_cors_only_for_allowed_origins(api: Api, bot: Bot):
    agent_id = api.create_agent(echo_dsl())
    api.put(f"/agents/{agent_id}/embed", json={"allowed_origins": ["http://127.0.0.1:8000"]})
    url = f"/api/v1/agentbots/{agent_id}/completions"

    def preflight(origin: str):
        return bot.client.options(
            url,
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )

    allowed = preflight("http://127.0.0.1:8000")
    assert allowed.status_code == 200
    assert allowed.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8000"
    assert "Authorization" in allowed.headers["Access-Control-Allow-Headers"]
    assert "POST" in allowed.headers["Access-Control-Allow-Methods"]
    for origin in ("http://127.0.0.1:8001", "https://127.0.0.1:8000", "http://evil.example", "null"):
        refused = preflight(origin)
        assert "Access-Control-Allow-Origin" not in refused.headers, origin

    call = bot.client.post(
        url,
        json={"question": "x", "user_id": bot.user_id, "stream": False},
        headers=bot.headers(Origin="http://127.0.0.1:8000"),
    )
    assert call.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8000"
    assert "X-Session-Id" in call.headers["Access-Control-Expose-Headers"]
    assert "Origin" in call.headers["Vary"]
    other_site = bot.client.post(
        url, json={"question": "x", "user_id": bot.user_id}, headers=bot.headers(Origin="http://evil.example")
    )
    assert "Access-Control-Allow-Origin" not in other_site.headers
    # The management API sends no CORS headers at all.
    listing = api.get("/agents", headers={"Origin": "http://127.0.0.1:8000"})
    assert "Access-Control-Allow-Origin" not in listing.headers


def test_embed_origins_migration_adds_the_column_to_an_older_database(app, database_url):
    with app.app_context():
        table = Agent._meta.table_name
        db.execute_sql(f"ALTER TABLE {table} DROP COLUMN embed_origins")
        SchemaVersion.delete().where(SchemaVersion.version == 2).execute()
    init_database(database_url, max_connections=4)
    with db.connection_context():
        assert "embed_origins" in {c.name for c in db.get_columns(Agent._meta.table_name)}
        assert sorted(v.version for v in SchemaVersion.select()) == [v for v, _, _ in MIGRATIONS]
    api = Api(app, make_token(app))
    agent_id = api.create_agent(echo_dsl())
    put = api.put(f"/agents/{agent_id}/embed", json={"allowed_origins": ["https://a.com"]})
    assert put.json["data"]["allowed_origins"] == ["https://a.com"]


# ---------------------------------------------------------------------- quickstart
def test_quickstart_prints_working_embed_pages(database_url, tmp_path, app_factory):
    if not AGENTCANVAS.exists():
        pytest.fail(f"{AGENTCANVAS} is missing: install the project with `make install` (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCANVAS_")}
    env["AGENTCANVAS_DATABASE_URL"] = database_url
    done = subprocess.run(
        [str(AGENTCANVAS), "quickstart", "--no-serve", "--port", "9999"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    pages = [line.split("embed page: ", 1)[1] for line in done.stdout.splitlines() if "embed page: " in line]
    samples = list((Path(__file__).resolve().parents[2] / "samples").glob("*.json"))
    assert len(pages) == len(samples)
    tokens = {p.split("?auth=", 1)[1] for p in pages}
    assert len(tokens) == 1  # one embed token for the run
    app = app_factory()
    client = app.test_client()
    for url in pages:
        assert url.startswith("http://127.0.0.1:9999/embed/agents/")
        assert client.get(url.split("9999", 1)[1]).status_code == 200
