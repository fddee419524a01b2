"""Drafts and releases, as RAGFlow: ``release: true`` publishes, ``release`` runs the latest
release, sessions stay on the version they started on, and the embed page and the
OpenAI-compatible route run the latest release when there is one."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, dsl_of, echo_dsl, make_token
from tests.api.test_embed import Bot


def _answer(api: Api, agent_id: str, session_id: str | None, question: str = "hi", **body) -> tuple[str, str]:
    resp = api.ask(agent_id, session_id, question, **body)
    assert resp.status_code == 200, resp.json
    return resp.json["data"]["data"]["content"], resp.json["data"]["session_id"]


def _versions(api: Api, agent_id: str) -> list[tuple[int, bool]]:
    return [(v["number"], v["release"]) for v in api.get(f"/agents/{agent_id}/versions").json["data"]]


def test_publishing_a_fix_reaches_new_conversations_never_the_middle_of_an_old_one(api: Api):
    resp = api.post("/agents", json={"title": "shop", "dsl": echo_dsl("v1 {sys.query}"), "release": True})
    assert resp.status_code == 200
    agent = resp.json["data"]
    agent_id = agent["id"]
    assert agent["release_version_id"] == agent["version_id"]
    assert _versions(api, agent_id) == [(1, True)]

    # A conversation on release 1 is under way.
    answer, old = _answer(api, agent_id, None, release=True)
    assert answer == "v1 hi"

    # The fix is published (a new version, released at once).
    resp = api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl("v2 {sys.query}"), "release": True})
    assert (
        resp.status_code == 200 and resp.json["data"]["release_version_id"] == resp.json["data"]["version_id"]
    )
    assert _versions(api, agent_id) == [(2, True), (1, True)]

    # New conversations get it; the old one goes on with what it started on, even when
    # the caller asks for the release again.
    assert _answer(api, agent_id, None, release=True)[0] == "v2 hi"
    assert _answer(api, agent_id, old, "again", release=True)[0] == "v1 again"
    assert _answer(api, agent_id, old, "and again")[0] == "v1 and again"


def test_a_draft_edited_after_a_release_is_not_run_by_release_callers_until_published(api: Api):
    agent_id = api.create_agent(echo_dsl("published {sys.query}"), title="drafty")
    # Nothing published yet: asking for the release is refused, and nothing is made.
    resp = api.ask(agent_id, None, "hi", release=True)
    assert resp.status_code == 409 and resp.json["code"] == 102
    assert "no published version" in resp.json["message"]
    resp = api.post(f"/agents/{agent_id}/sessions", json={"release": True})
    assert resp.status_code == 409 and "no published version" in resp.json["message"]
    assert api.get(f"/agents/{agent_id}/sessions").json["data"] == []

    # Publish the draft as it is (no new version), then edit the draft.
    resp = api.put(f"/agents/{agent_id}", json={"release": True})
    assert resp.status_code == 200 and _versions(api, agent_id) == [(1, True)]
    api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl("draft {sys.query}")})
    assert _versions(api, agent_id) == [(2, False), (1, True)]

    # The draft runs by default (as RAGFlow); release callers keep getting version 1.
    assert _answer(api, agent_id, None)[0] == "draft hi"
    assert _answer(api, agent_id, None, release=True)[0] == "published hi"
    released = api.post(f"/agents/{agent_id}/sessions", json={"release": True}).json["data"]
    assert _answer(api, agent_id, released["id"])[0] == "published hi"
    by_query = api.post(f"/agents/{agent_id}/sessions?release=true", json={}).json["data"]
    assert by_query["agent_version_id"] == released["agent_version_id"]

    # Publishing the same DSL again marks the draft released instead of copying it.
    resp = api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl("draft {sys.query}"), "release": True})
    assert resp.status_code == 200 and _versions(api, agent_id) == [(2, True), (1, True)]
    assert _answer(api, agent_id, None, release=True)[0] == "draft hi"


def test_the_embed_page_runs_the_latest_release_and_a_draft_edit_changes_nothing(api: Api):
    agent_id = api.create_agent(echo_dsl("v1 {sys.query}"), title="embedded")
    bot = Bot(api.app, make_token(api.app, "tenant-a", "embed"))
    # No release yet: the page runs the draft.
    frames, _ = bot.chat(agent_id, "hi")
    assert frames[-2]["data"]["content"] == "v1 hi"

    api.put(f"/agents/{agent_id}", json={"release": True})
    new = dsl_of({"Message:Echo": ("Message", {"content": ["v2 {sys.query}"]}, [])}, prologue="New!")
    api.put(f"/agents/{agent_id}", json={"dsl": new})
    frames, session_id = bot.chat(agent_id, "hi")
    assert frames[-2]["data"]["content"] == "v1 hi"
    assert bot.inputs(agent_id).json["data"]["prologue"] == "Hi!"  # the release's, not the draft's

    api.put(f"/agents/{agent_id}", json={"release": True})
    assert bot.inputs(agent_id).json["data"]["prologue"] == "New!"
    frames, _ = bot.chat(agent_id, "hi")
    assert frames[-2]["data"]["content"] == "v2 hi"
    # The visitor's conversation from before the release is still on version 1.
    frames, again = bot.chat(agent_id, "more", session_id=session_id)
    assert again == session_id and frames[-2]["data"]["content"] == "v1 more"


def test_the_openai_route_runs_the_latest_release(api: Api):
    agent_id = api.create_agent(echo_dsl("v1 {sys.query}"), title="openai")
    api.put(f"/agents/{agent_id}", json={"release": True})
    api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl("draft {sys.query}")})

    def ask(**body):
        resp = api.post(
            f"/agents_openai/{agent_id}/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], **body},
        )
        assert resp.status_code == 200, resp.json
        return resp.json["choices"][0]["message"]["content"]

    assert ask() == "v1 hi"
    assert ask(release=False) == "draft hi"  # asked for the draft by name


@pytest.mark.parametrize("release", ["sure", 2, [True]])
def test_a_release_that_is_not_a_boolean_is_refused(api: Api, release):
    resp = api.post("/agents", json={"title": "bad", "dsl": echo_dsl(), "release": release})
    assert resp.status_code == 400 and "release" in resp.json["message"]
    assert api.get("/agents").json["data"]["canvas"] == []
