"""Rate limits (api.ratelimit): per API token, per embed token and visitor, per agent; 429 + Retry-After.

Counts live in the database (or Redis); tests/e2e/test_ratelimit.py shows them shared
by two workers.
"""

from __future__ import annotations

import pytest

from api.ratelimit import Limiter
from tests.api.conftest import Api, echo_dsl, make_token
from tests.api.test_embed import Bot, new_user


def limited(app_factory, **limits: str):
    """An app whose rate limits are ``limits`` (``api="3/minute"``, ...)."""
    return app_factory(SETTINGS={"rate": {f"limit_{k}": v for k, v in limits.items()}})


def assert_429(resp, setting: str) -> None:
    assert resp.status_code == 429, resp.get_data(as_text=True)
    assert resp.json["code"] == 103 and setting in resp.json["message"]
    assert 1 <= int(resp.headers["Retry-After"]) <= 60
    assert resp.json["data"]["retry_after"] == int(resp.headers["Retry-After"])


def test_api_token_limit_counts_each_token_alone(app_factory):
    app = limited(app_factory, api="3/minute")
    first, second = Api(app, make_token(app, "tenant-a")), Api(app, make_token(app, "tenant-b"))
    for _ in range(3):
        assert first.get("/agents").status_code == 200
    assert_429(first.get("/agents"), "AGENTCANVAS_RATE_LIMIT_API")
    assert second.get("/agents").status_code == 200


def test_embed_limit_counts_each_visitor_and_an_agent_may_set_its_own(app_factory):
    app = limited(app_factory, embed="2/minute")
    api = Api(app, make_token(app, "tenant-a"))
    token = make_token(app, "tenant-a", "embed")
    agent_id = api.create_agent(echo_dsl())
    visitor, other = Bot(app, token, new_user()), Bot(app, token, new_user())
    for _ in range(2):
        assert visitor.complete(agent_id, "hi", stream=False).status_code == 200
    refused = visitor.complete(agent_id, "hi", stream=False)
    assert_429(refused, "AGENTCANVAS_RATE_LIMIT_EMBED")
    assert other.complete(agent_id, "hi", stream=False).status_code == 200

    # The agent's own limit replaces the default for it; bad notation names the field.
    bad = api.put(f"/agents/{agent_id}", json={"rate_limits": {"embed": "ten per second"}})
    assert bad.status_code == 400 and "10/second;300/hour" in bad.json["message"]
    resp = api.put(f"/agents/{agent_id}", json={"rate_limits": {"embed": "1/minute"}})
    assert resp.status_code == 200 and resp.json["data"]["rate_limits"] == {"embed": "1/minute"}
    third = Bot(app, token, new_user())
    assert third.complete(agent_id, "hi", stream=False).status_code == 200
    assert_429(third.complete(agent_id, "hi", stream=False), "the agent's rate_limits")


def test_an_agents_own_embed_limit_holds_where_the_server_sets_none(api: Api):
    token = make_token(api.app, "tenant-a", "embed")
    agent_id = api.create_agent(echo_dsl())
    free = api.create_agent(echo_dsl(), title="free")
    assert api.put(f"/agents/{agent_id}", json={"rate_limits": {"embed": "1/minute"}}).status_code == 200
    visitor = Bot(api.app, token, new_user())
    assert visitor.complete(agent_id, "hi", stream=False).status_code == 200
    assert_429(visitor.complete(agent_id, "hi", stream=False), "the agent's rate_limits")
    for _ in range(3):  # the same visitor on an agent without a limit of its own
        assert visitor.complete(free, "hi", stream=False).status_code == 200
    # Another tenant's agent is not found, limited or not, and nothing is counted for it.
    theirs = Bot(api.app, make_token(api.app, "tenant-b", "embed"), new_user())
    for _ in range(2):
        assert theirs.complete(agent_id, "hi", stream=False).status_code == 404


def test_no_limit_by_default_and_bad_settings_are_refused(api: Api):
    for _ in range(5):
        assert api.get("/agents").status_code == 200
    with pytest.raises(ValueError, match="AGENTCANVAS_RATE_LIMIT_WEBHOOK"):
        Limiter({"webhook": "5 a second"})
