"""Sessions over REST: creation with the prologue, pinning to a version, list, get, delete."""

from __future__ import annotations

import random

import pytest
from playhouse.migrate import SchemaMigrator
from playhouse.migrate import migrate as run_schema_changes

from api.db import SchemaVersion, Session, db, init_database, now_ms, update_mark
from api.db.models import UPDATE_MARK_MS
from api.services import turns
from tests.api.conftest import Api, dsl_of, echo_dsl, make_token, sample
from tests.api.test_regenerate import counter_dsl


def test_new_session_carries_the_prologue_and_agent_id(api: Api):
    agent_id = api.create_agent(sample("greeting"))
    resp = api.post(f"/agents/{agent_id}/sessions", json={"name": "chat 1", "user_id": "u-7"})
    data = resp.json["data"]
    assert resp.json["code"] == 0
    assert data["agent_id"] == agent_id and data["id"]
    assert data["message"] == [
        {
            "role": "assistant",
            "content": sample("greeting")["components"]["begin"]["obj"]["params"]["prologue"],
        }
    ]
    assert data["name"] == "chat 1" and data["user_id"] == "u-7"
    assert data["status"] == "idle" and data["round"] == 0


def test_sessions_stay_on_the_version_they_started_with(api: Api):
    agent_id = api.create_agent(echo_dsl("old: {sys.query}"))
    old_session = api.create_session(agent_id)
    api.put(f"/agents/{agent_id}", json={"dsl": echo_dsl("new: {sys.query}")})
    new_session = api.create_session(agent_id)

    assert api.ask(agent_id, old_session, "a").json["data"]["data"]["content"] == "old: a"
    assert api.ask(agent_id, new_session, "b").json["data"]["data"]["content"] == "new: b"
    # ...and a turn later still.
    assert api.ask(agent_id, old_session, "c").json["data"]["data"]["content"] == "old: c"

    versions = api.get(f"/agents/{agent_id}/versions").json["data"]
    assert api.session(agent_id, old_session)["agent_version_id"] == versions[1]["id"]
    assert api.session(agent_id, new_session)["agent_version_id"] == versions[0]["id"]


def test_a_new_session_starts_from_its_own_version_also_after_the_agent_changed(api: Api):
    # The state and prologue a new session starts with are made once per version in a
    # process (api.services.turns._first_state): each version's own, never the last one made.
    echo = {"Message:Echo": ("Message", {"content": ["{sys.query}"]}, [])}
    agent_id = api.create_agent(dsl_of(echo, prologue="Welcome!"))
    made = [api.post(f"/agents/{agent_id}/sessions", json={"name": f"s{i}"}).json["data"] for i in range(2)]
    assert [m["message"] for m in made] == [[{"role": "assistant", "content": "Welcome!"}]] * 2
    # What creation answers is the row as stored.
    for m in made:
        stored = api.session(agent_id, m["id"])
        assert {k: stored[k] for k in m if k != "message"} == {k: v for k, v in m.items() if k != "message"}

    api.put(f"/agents/{agent_id}", json={"dsl": dsl_of(echo, prologue="Hello again!"), "release": True})
    edited = api.post(f"/agents/{agent_id}/sessions", json={}).json["data"]
    assert edited["message"] == [{"role": "assistant", "content": "Hello again!"}]
    api.put(f"/agents/{agent_id}", json={"dsl": dsl_of(echo, prologue="Draft")})
    released = api.post(f"/agents/{agent_id}/sessions", json={"release": True}).json["data"]
    assert released["message"] == [{"role": "assistant", "content": "Hello again!"}]
    assert released["agent_version_id"] == edited["agent_version_id"] != made[0]["agent_version_id"]
    assert [(m["role"], m["content"]) for m in api.session(agent_id, made[0]["id"])["message"]] == [
        ("assistant", "Welcome!")
    ]

    # A deleted agent's versions make no session, though this process still has their state.
    assert api.delete(f"/agents/{agent_id}").status_code == 200
    gone = api.post(f"/agents/{agent_id}/sessions", json={})
    assert gone.status_code == 404 and agent_id in gone.json["message"]
    assert api.ask(agent_id, None, "hi").status_code == 404


def test_get_session_has_the_transcript(api: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    api.ask(agent_id, session_id, "one")
    api.ask(agent_id, session_id, "two")
    data = api.session(agent_id, session_id)
    assert [(m["role"], m["content"]) for m in data["message"]] == [
        ("assistant", "Hi!"),
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
        ("assistant", "echo: two"),
    ]
    assert data["round"] == 2 and data["version"] == 3
    assert "dsl" not in data
    with_dsl = api.session(agent_id, session_id, dsl="true")
    assert with_dsl["dsl"]["history"][-1] == ["assistant", "echo: two"]


def test_list_sessions(api: Api):
    agent_id = api.create_agent(echo_dsl())
    first = api.create_session(agent_id, user_id="alice")
    second = api.create_session(agent_id, user_id="bob")
    listed = api.get(
        f"/agents/{agent_id}/sessions", query_string={"orderby": "create_time", "desc": "False"}
    ).json
    assert listed["code"] == 0 and listed["total"] == 2
    assert [s["id"] for s in listed["data"]] == [first, second]
    assert all(s["agent_id"] == agent_id and "dsl" not in s for s in listed["data"])
    only_bob = api.get(f"/agents/{agent_id}/sessions", query_string={"user_id": "bob"}).json["data"]
    assert [s["id"] for s in only_bob] == [second]
    by_id = api.get(f"/agents/{agent_id}/sessions", query_string={"id": first, "dsl": "True"}).json["data"]
    assert [s["id"] for s in by_id] == [first] and "components" in by_id[0]["dsl"]
    with_messages = api.get(f"/agents/{agent_id}/sessions", query_string={"messages": "true"}).json["data"]
    assert all(s["message"][0]["content"] == "Hi!" for s in with_messages)


def _turn_at(monkeypatch: pytest.MonkeyPatch, when: int) -> None:
    """The turns (and other session writes) from now on happen at ``when`` (ms)."""
    monkeypatch.setattr(turns, "now_ms", lambda: when)


def _marks(api: Api, agent_id: str) -> list[tuple[int, int]]:
    with api.app.app_context():
        rows = Session.select(Session.update_time, Session.update_mark).where(Session.agent_id == agent_id)
        return [(r.update_time, r.update_mark) for r in rows]


def _listed(api: Api, agent_id: str, page_size: int, **params) -> list[str]:
    """Every page of the agent's sessions, in the order listed."""
    ids, page = [], 1
    while True:
        resp = api.get(
            f"/agents/{agent_id}/sessions", query_string={"page": page, "page_size": page_size, **params}
        )
        assert resp.status_code == 200, resp.json
        if not resp.json["data"]:
            return ids
        ids += [s["id"] for s in resp.json["data"]]
        page += 1


def test_sessions_listed_by_update_time_follow_their_last_turns_across_its_steps(api: Api, monkeypatch):
    """By update_time (the listing's default order), every page holds the sessions in
    the order of their last turns (ties by id the same way), latest or oldest first,
    with or without a user filter, whichever 10-minute steps of the indexed update_mark
    they are in."""
    agent_id = api.create_agent(echo_dsl())
    users = {}  # session id -> its user
    for i in range(30):
        user = "bob" if i % 3 == 0 else "alice"
        users[api.create_session(agent_id, user_id=user)] = user
    edge = update_mark(now_ms()) + 5 * UPDATE_MARK_MS
    rnd = random.Random(15)
    last = {}
    for session_id in users:  # last turns on either side of two step edges, some at one time
        last[session_id] = (
            edge + rnd.choice([-1, 0, 1]) * UPDATE_MARK_MS + rnd.choice([-2, -1, 0, 0, 1, 9000])
        )
        _turn_at(monkeypatch, last[session_id])
        assert api.ask(agent_id, session_id, "hi").status_code == 200
    assert len(set(last.values())) < len(last)  # ties, broken by id
    assert {t - m for t, m in _marks(api, agent_id)} <= set(range(UPDATE_MARK_MS))
    assert all(m % UPDATE_MARK_MS == 0 for _, m in _marks(api, agent_id))

    for user in (None, "alice"):
        ids = [s for s in users if user is None or users[s] == user]
        oldest = sorted(ids, key=lambda s: (last[s], s))
        latest = oldest[::-1]
        for page_size in (1, 4, 7, 30):
            params = {"user_id": user} if user else {}
            assert _listed(api, agent_id, page_size, **params) == latest
            assert _listed(api, agent_id, page_size, desc="false", **params) == oldest
            assert _listed(api, agent_id, page_size, orderby="update_time", desc="true", **params) == latest
        total = api.get(f"/agents/{agent_id}/sessions", query_string={"user_id": user or ""}).json["total"]
        assert total == len(ids)


def test_every_write_of_a_sessions_update_time_moves_its_update_mark(api: Api, monkeypatch):
    """A turn that succeeds or fails, an undo, a regenerate and a variable saved over
    REST each set update_time; update_mark is its 10-minute step after each (written
    only when the step changed), so the listing by update_time stays in order."""
    counter = api.create_agent(counter_dsl())
    failing = api.create_agent(dsl_of({"TestFail:Call": ("TestFail", {"error": "LLMError"}, [])}))
    counted, failed = api.create_session(counter), api.create_session(failing)
    start = update_mark(now_ms()) + UPDATE_MARK_MS
    steps = [  # (agent, the write, its status)
        (counter, lambda: api.ask(counter, counted, "a"), 200),
        (counter, lambda: api.ask(counter, counted, "b"), 200),
        (
            counter,
            lambda: api.post(f"/agents/{counter}/sessions/{counted}/undo", json={"stream": False}),
            200,
        ),
        (
            counter,
            lambda: api.post(f"/agents/{counter}/sessions/{counted}/regenerate", json={"stream": False}),
            200,
        ),
        (
            counter,
            lambda: api.put(f"/agents/{counter}/sessions/{counted}/variables/n", json={"value": 7}),
            200,
        ),
        (failing, lambda: api.ask(failing, failed, "x"), 502),  # the provider's error, saved as the turn's
    ]
    for i, (agent_id, write, status) in enumerate(steps):
        step = start + 2 * i * UPDATE_MARK_MS
        for when in (step + 5, step + 99):  # in a new step, then in the same one
            _turn_at(monkeypatch, when)
            assert write().status_code == status
            ((time_, mark),) = _marks(api, agent_id)
            assert (time_, mark) == (when, update_mark(when))
    assert api.session(failing, failed)["last_error"]
    assert _listed(api, counter, 10) == [counted]


def test_sessions_made_before_migration_20_are_listed_in_the_order_of_their_last_turns(
    app_factory, database_url, monkeypatch
):
    """Migration 20 gives the sessions of an older schema (no update_mark) the step of
    their update_time, and the index the listing reads."""
    app = app_factory()
    api = Api(app, make_token(app))
    agent_id = api.create_agent(echo_dsl())
    ids = [api.create_session(agent_id) for _ in range(5)]
    edge = update_mark(now_ms()) + 2 * UPDATE_MARK_MS
    for session_id, when in zip(
        ids, (edge + 1, edge - 1, edge + UPDATE_MARK_MS, edge - 7 * UPDATE_MARK_MS, edge), strict=True
    ):
        _turn_at(monkeypatch, when)
        assert api.ask(agent_id, session_id, "hi").status_code == 200
    with app.app_context():
        table = Session._meta.table_name
        migrator = SchemaMigrator.from_database(db.obj)
        index = next(i.name for i in db.get_indexes(table) if i.columns == ["agent_id", "update_mark"])
        run_schema_changes(
            migrator.drop_index(table, index), migrator.drop_column(table, "update_mark", cascade=False)
        )
        SchemaVersion.delete().where(SchemaVersion.version == 20).execute()
    init_database(database_url, max_connections=4)

    with app.app_context():
        assert ["agent_id", "update_mark"] in [i.columns for i in db.get_indexes(Session._meta.table_name)]
    assert all(mark == update_mark(time_) for time_, mark in _marks(api, agent_id))
    assert _listed(api, agent_id, 2) == [ids[2], ids[0], ids[4], ids[1], ids[3]]


def test_delete_sessions_reports_each_bad_id(api: Api):
    agent_id = api.create_agent(echo_dsl())
    keep, drop1, drop2 = (api.create_session(agent_id) for _ in range(3))
    api.ask(agent_id, drop1, "hello")

    resp = api.delete(f"/agents/{agent_id}/sessions", json={"ids": [drop1, "nope", drop2]})
    assert resp.json["code"] == 0
    assert resp.json["data"]["success_count"] == 2
    assert any("'nope'" in e for e in resp.json["data"]["errors"])
    remaining = [s["id"] for s in api.get(f"/agents/{agent_id}/sessions").json["data"]]
    assert remaining == [keep]
    assert api.get(f"/agents/{agent_id}/sessions/{drop1}").status_code == 404

    resp = api.delete(f"/agents/{agent_id}/sessions", json={"ids": ["nope"]})
    assert resp.status_code == 404 and resp.json["code"] == 102
    resp = api.delete(f"/agents/{agent_id}/sessions", json={"ids": "nope"})
    assert resp.status_code == 400 and "ids" in resp.json["message"]
    resp = api.delete(f"/agents/{agent_id}/sessions", json={})
    assert resp.status_code == 400


def test_session_routes_refuse_bad_input(api: Api):
    agent_id = api.create_agent(echo_dsl())
    resp = api.post(f"/agents/{agent_id}/sessions", json={"name": 5})
    assert resp.status_code == 400 and "'name'" in resp.json["message"]
    resp = api.post(f"/agents/{agent_id}/sessions", json={"user_id": "u" * 256})
    assert resp.status_code == 400 and "'user_id'" in resp.json["message"] and "255" in resp.json["message"]
    resp = api.put(f"/agents/{agent_id}/sessions", json={})
    assert resp.status_code == 405 and "DELETE" in resp.json["message"]
    resp = api.post(f"/agents/{agent_id}/sessions", data="{", content_type="application/json")
    assert resp.status_code == 400 and "JSON" in resp.json["message"]
    resp = api.post("/agents/nope/sessions", json={})
    assert resp.status_code == 404 and resp.json["code"] == 102
    assert api.get(f"/agents/{agent_id}/sessions").json["data"] == []
    resp = api.get(f"/agents/{agent_id}/sessions/nope")
    assert resp.status_code == 404 and resp.json["code"] == 102


def test_deleting_the_agent_deletes_its_sessions(api: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    api.delete(f"/agents/{agent_id}")
    assert api.get(f"/agents/{agent_id}/sessions/{session_id}").status_code == 404
    from api.db import MessageLog, Session
    from api.services.retention import RetentionSettings, sweep

    with api.app.app_context():
        assert Session.select().where(Session.id == session_id).count() == 0
        # Its messages go with the sweep.
        assert sweep(RetentionSettings()).purged == 1
        assert MessageLog.select().where(MessageLog.session_id == session_id).count() == 0
