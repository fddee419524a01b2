"""Retention (docs/design.md §15): idle sessions expire, deleted ones are swept in batches, keyed
memory ages out; one worker sweeps at a time; a turn never waits for more than one batch."""

from __future__ import annotations

import threading

import pytest
from playhouse.migrate import SchemaMigrator
from playhouse.migrate import migrate as run_schema_changes

from api.db import (
    MessageLog,
    SchemaVersion,
    Session,
    SessionSnapshot,
    WorkerLease,
    db,
    init_database,
    now_ms,
    update_mark,
)
from api.services.memory import DatabaseMemoryStore
from api.services.retention import RetentionSettings, sweep
from tests.api.conftest import Api, echo_dsl, make_token
from tests.api.test_cli import cli  # noqa: F401 - the `agentcanvas` fixture
from tests.api.test_regenerate import gate_dsl
from tests.bulk import idle_sessions

HOUR = 3600


@pytest.fixture
def retention_api(app_factory) -> Api:
    app = app_factory(SESSION_TTL_SECONDS=HOUR, SWEEP_INTERVAL_SECONDS=0)
    return Api(app, make_token(app))


def settings(**overrides) -> RetentionSettings:
    return RetentionSettings(**{"session_ttl_seconds": HOUR, **overrides})


def later(seconds: float) -> int:
    """The test's clock: this many seconds from now, in ms."""
    return now_ms() + int(seconds * 1000)


def sweep_at(api: Api, when: int, **overrides):
    with api.app.app_context(), db.connection_context():
        return sweep(settings(**overrides), now=when)


def rows(api: Api, model, session_id: str) -> int:
    with api.app.app_context(), db.connection_context():
        return model.select().where(model.session_id == session_id).count()


def test_idle_sessions_expire_with_everything_they_hold(retention_api: Api):
    api = retention_api
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    api.ask(agent_id, session_id, "hello")

    assert sweep_at(api, later(HOUR - 60)).expired == 0
    assert api.get(f"/agents/{agent_id}/sessions/{session_id}").status_code == 200

    report = sweep_at(api, later(HOUR + 60))
    assert (report.expired, report.purged) == (1, 1)
    assert api.get(f"/agents/{agent_id}/sessions/{session_id}").status_code == 404
    assert rows(api, MessageLog, session_id) == 0 and rows(api, SessionSnapshot, session_id) == 0
    # A turn keeps a session alive: its idle time starts again.
    kept = api.create_session(agent_id)
    assert sweep_at(api, later(HOUR / 2)).expired == 0
    api.ask(agent_id, kept, "still here")
    assert api.session(agent_id, kept)["round"] == 1


def test_an_agent_sets_its_own_lifetime(retention_api: Api):
    api = retention_api
    short, forever, default = (api.create_agent(echo_dsl()) for _ in range(3))
    assert (
        api.put(f"/agents/{short}", json={"session_ttl_seconds": 60}).json["data"]["session_ttl_seconds"]
        == 60
    )
    api.put(f"/agents/{forever}", json={"session_ttl_seconds": 0})
    sessions = {agent: api.create_session(agent) for agent in (short, forever, default)}

    assert sweep_at(api, later(120)).expired == 1
    assert api.get(f"/agents/{short}/sessions/{sessions[short]}").status_code == 404
    assert sweep_at(api, later(10 * HOUR)).expired == 1
    assert api.get(f"/agents/{default}/sessions/{sessions[default]}").status_code == 404
    assert api.get(f"/agents/{forever}/sessions/{sessions[forever]}").status_code == 200
    # Back to the server's lifetime.
    assert (
        api.put(f"/agents/{forever}", json={"session_ttl_seconds": None}).json["data"]["session_ttl_seconds"]
        is None
    )


@pytest.mark.parametrize("value", [-1, "60", 1.5, True])
def test_a_bad_lifetime_is_a_400_naming_the_field(retention_api: Api, value):
    agent_id = retention_api.create_agent(echo_dsl())
    resp = retention_api.put(f"/agents/{agent_id}", json={"session_ttl_seconds": value})
    assert resp.status_code == 400 and "session_ttl_seconds" in resp.json["message"]
    assert retention_api.get(f"/agents/{agent_id}").json["data"]["session_ttl_seconds"] is None


def test_a_running_session_is_not_expired(retention_api: Api):
    api = retention_api
    gate = api.app.config["SERVICES"]["gate"]
    agent_id = api.create_agent(gate_dsl())
    session_id = api.create_session(agent_id)
    resp = api.post(f"/agents/{agent_id}/completions", json={"question": "x", "session_id": session_id})
    assert sweep_at(api, later(HOUR + 60)).expired == 0
    gate.set()
    resp.get_data()
    api.app.extensions["agentcanvas.turns"].wait_idle(30)
    assert api.session(agent_id, session_id)["round"] == 1


def test_deleted_sessions_are_gone_at_once_and_swept_later(api: Api):
    agent_id = api.create_agent(echo_dsl())
    gone, kept = api.create_session(agent_id), api.create_session(agent_id)
    api.ask(agent_id, gone, "secret")
    assert api.delete(f"/agents/{agent_id}/sessions", json={"ids": [gone]}).json["data"]["success_count"] == 1

    assert api.get(f"/agents/{agent_id}/sessions/{gone}").status_code == 404
    assert [s["id"] for s in api.get(f"/agents/{agent_id}/sessions").json["data"]] == [kept]
    assert api.ask(agent_id, gone, "again").status_code == 404
    assert rows(api, MessageLog, gone) == 3  # until the sweep
    report = sweep_at(api, now_ms(), session_ttl_seconds=0)
    assert (report.expired, report.purged) == (0, 1)
    assert rows(api, MessageLog, gone) == 0 and rows(api, MessageLog, kept) == 1


def test_keyed_memory_has_its_own_lifetime(api: Api):
    agent_id = api.create_agent(echo_dsl())
    tenant = api.get(f"/agents/{agent_id}").json["data"]["user_id"]
    with api.app.app_context(), db.connection_context():
        DatabaseMemoryStore(tenant, agent_id).commit(
            {("LLM:A", "u1"): [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
        )
    assert sweep_at(api, later(50), memory_ttl_seconds=60).memory_entries == 0
    assert api.get(f"/agents/{agent_id}/memory/u1").json["data"]["total"] == 2
    assert sweep_at(api, later(61), memory_ttl_seconds=60).memory_entries == 2
    assert api.get(f"/agents/{agent_id}/memory/u1").json["data"]["total"] == 0


def test_one_worker_sweeps_at_a_time(retention_api: Api):
    api = retention_api
    agent_id = api.create_agent(echo_dsl())
    api.create_session(agent_id)
    with api.app.app_context(), db.connection_context():
        WorkerLease.insert(name="sweep").on_conflict_ignore().execute()
        WorkerLease.update(lease_owner="elsewhere", lease_expires=later(30)).execute()
    report = sweep_at(api, later(HOUR + 60))
    assert report.skipped and report.expired == 0
    with api.app.app_context(), db.connection_context():
        WorkerLease.update(lease_expires=now_ms() - 1).execute()  # that worker died
    assert sweep_at(api, later(HOUR + 60)).expired == 1


def _old_sessions(api: Api, agent_id: str, count: int) -> None:
    """``count`` sessions of the agent idle for two hours, each with a message."""
    agent = api.get(f"/agents/{agent_id}").json["data"]
    with api.app.app_context(), db.connection_context():
        idle_sessions(agent["user_id"], agent_id, agent["version_id"], count, now_ms() - 2 * HOUR * 1000)


def test_sweeping_10000_sessions_goes_in_batches_that_let_a_turn_through(retention_api: Api):
    api = retention_api
    agent_id = api.create_agent(echo_dsl())
    live = api.create_session(agent_id)
    _old_sessions(api, agent_id, 10_000)

    first_batch = threading.Event()
    turn_done = threading.Event()
    seen: list[int] = []
    result: dict = {}

    def pause_after_the_first(report) -> None:
        seen.append(report.batches)
        if report.batches == 1:
            first_batch.set()
            assert turn_done.wait(60), "the turn did not finish while the sweep waited between batches"

    def run_sweep() -> None:
        with api.app.app_context(), db.connection_context():
            result["report"] = sweep(
                settings(batch=1000), now=now_ms(), between_batches=pause_after_the_first
            )

    sweeper = threading.Thread(target=run_sweep)
    sweeper.start()
    assert first_batch.wait(60)
    # The sweep is between its batches and holds no lock: a turn goes through now.
    resp = api.ask(agent_id, live, "not blocked")
    turn_done.set()
    sweeper.join(120)
    assert resp.status_code == 200, resp.json
    report = result["report"]
    assert (report.expired, report.purged) == (10_000, 10_000)
    assert report.batches == 20 and seen == list(range(1, 21))
    listed = api.get(f"/agents/{agent_id}/sessions").json
    assert listed["total"] == 1 and listed["data"][0]["id"] == live
    assert rows(api, MessageLog, live) == 3


def test_agentcanvas_sweep(cli, retention_api: Api):  # noqa: F811
    api = retention_api
    agent_id = api.create_agent(echo_dsl())
    api.put(f"/agents/{agent_id}", json={"session_ttl_seconds": HOUR})  # the CLI has no server default
    _old_sessions(api, agent_id, 5)
    gone = api.create_session(agent_id)
    api.delete(f"/agents/{agent_id}/sessions", json={"ids": [gone]})
    out = cli("sweep", "--batch", "2").stdout
    assert "removed 6 sessions (5 expired, 1 deleted)" in out
    assert "in 6 batches" in out
    bad = cli("sweep", "--batch", "0", ok=False)
    assert bad.returncode == 2 and "--batch" in bad.stderr


def _made_earlier(api: Api, session_ids: list[str], seconds: float) -> None:
    """Make these sessions look made and last used this many seconds ago."""
    when = later(-seconds)
    with api.app.app_context(), db.connection_context():
        Session.update(
            create_time=when, update_time=when, update_mark=update_mark(when), expiry_mark=when
        ).where(Session.id.in_(session_ids)).execute()


def test_a_session_used_since_the_sweep_last_saw_it_expires_a_lifetime_after_its_last_turn(
    retention_api: Api,
):
    """The sweep finds sessions that may have expired by a mark turns do not move (their
    update_time has no index: api.services.retention); a session in use again is kept,
    and expires one lifetime after its last turn."""
    api = retention_api
    agent_id = api.create_agent(echo_dsl())
    idle = [api.create_session(agent_id) for _ in range(3)]
    used = [api.create_session(agent_id) for _ in range(3)]
    _made_earlier(api, idle + used, 2 * HOUR)
    for session_id in used:
        assert api.ask(agent_id, session_id, "still here").status_code == 200

    report = sweep_at(api, now_ms(), batch=1)
    assert report.expired_ids == set(idle)
    assert report.batches == 6 + 3  # expiry (each session found once), then the trash
    for session_id in used:
        assert api.session(agent_id, session_id)["round"] == 1
    assert sweep_at(api, later(HOUR - 60)).expired == 0
    assert sweep_at(api, later(HOUR + 60)).expired_ids == set(used)


def test_sessions_made_before_migration_18_expire_by_their_last_turn(app_factory, database_url):
    """Migration 18 gives the sessions of an older schema (update_time indexed, no
    expiry_mark) a mark from their update_time: idle ones expire, used ones are kept."""
    app = app_factory(SESSION_TTL_SECONDS=HOUR)
    api = Api(app, make_token(app))
    agent_id = api.create_agent(echo_dsl())
    idle, used = api.create_session(agent_id), api.create_session(agent_id)
    _made_earlier(api, [idle, used], 2 * HOUR)
    assert api.ask(agent_id, used, "still here").status_code == 200
    with app.app_context():
        table = Session._meta.table_name
        migrator = SchemaMigrator.from_database(db.obj)
        mark = next(i.name for i in db.get_indexes(table) if i.columns == ["expiry_mark"])
        run_schema_changes(
            migrator.drop_index(table, mark),
            migrator.drop_column(table, "expiry_mark", cascade=False),
            migrator.add_index(table, ("update_time",), False),
        )
        SchemaVersion.delete().where(SchemaVersion.version == 18).execute()
    init_database(database_url, max_connections=4)

    with app.app_context():
        indexed = [i.columns for i in db.get_indexes(Session._meta.table_name)]
        assert ["expiry_mark"] in indexed and ["update_time"] not in indexed
    assert sweep_at(api, now_ms()).expired_ids == {idle}
    assert api.session(agent_id, used)["round"] == 1
    assert sweep_at(api, later(HOUR + 60)).expired_ids == {used}
