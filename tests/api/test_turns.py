"""The turn transaction: leases, busy sessions, cancellation, crashed workers, disconnects."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

import pytest
from playhouse.migrate import SchemaMigrator
from playhouse.migrate import migrate as run_schema_changes

from api.db import MessageLog, SchemaVersion, Session, db, init_database, now_ms
from api.services import turns
from api.services.turns import TurnService, turn_service
from tests.api.components import PURE_GATE_ENTERED
from tests.api.conftest import Api, dsl_of, echo_dsl, make_token, parse_sse


def _gate_agent(api: Api) -> str:
    return api.create_agent(dsl_of({"TestGate:Wait": ("TestGate", {}, [])}))


def _start_stream(api: Api, agent_id: str, session_id: str, question: str = "go"):
    """Start a streamed turn and read its first event; returns (response, first event)."""
    resp = api.post(
        f"/agents/{agent_id}/completions",
        json={"question": question, "stream": True, "session_id": session_id},
        buffered=False,
    )
    assert resp.status_code == 200
    chunks = iter(resp.response)
    first = next(chunks).decode()
    return resp, chunks, json.loads(first[len("data:") :])


def _until(condition, what: str, seconds: float = 30) -> None:
    """Wait for ``condition()``; a safety net so a broken server fails the test instead of hanging it."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def _rest(chunks) -> list:
    return parse_sse("".join(c.decode() for c in chunks))


def test_a_second_turn_while_one_runs_is_busy(api: Api):
    gate = api.app.config["SERVICES"]["gate"]
    agent_id = _gate_agent(api)
    session_id = api.create_session(agent_id)

    resp, chunks, first = _start_stream(api, agent_id, session_id)
    assert first["data"]["content"] == "started "
    assert api.session(agent_id, session_id)["status"] == "running"

    busy = api.ask(agent_id, session_id, "me too")
    assert busy.status_code == 409 and busy.json["code"] == 106
    assert "busy" in busy.json["message"]

    gate.set()
    frames = _rest(chunks)
    assert frames[-1] == "[DONE]" and frames[-2]["event"] == "message_end"
    assert frames[-2]["data"]["content"] == "started released"
    session = api.session(agent_id, session_id)
    assert session["status"] == "idle" and session["round"] == 1
    # The refused turn left no trace.
    assert [m["content"] for m in session["message"] if m["role"] == "user"] == ["go"]
    # Right after [DONE] the next turn gets the session (the commit came first).
    assert api.ask(agent_id, session_id, "next").status_code == 200


def test_concurrent_turns_one_wins_the_rest_are_busy(api: Api):
    gate = api.app.config["SERVICES"]["gate"]
    agent_id = _gate_agent(api)
    session_id = api.create_session(agent_id)
    statuses: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def turn() -> None:
        client = Api(api.app, api.token)
        start.wait()
        resp = client.ask(agent_id, session_id, "race")
        with lock:
            statuses.append(resp.status_code)

    threads = [threading.Thread(target=turn) for _ in range(6)]
    for t in threads:
        t.start()
    # Let the losers come back with 409 before the winner may finish.
    _until(lambda: statuses.count(409) == 5 or len(statuses) == 6, "the five refused turns")
    gate.set()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200] + [409] * 5
    session = api.session(agent_id, session_id)
    assert session["round"] == 1 and session["version"] == 2
    assert [m["role"] for m in session["message"]] == ["assistant", "user", "assistant"]


def _pure_gate_agent(api: Api) -> str:
    dsl = dsl_of(
        {
            "TestPureGate:Wait": ("TestPureGate", {}, ["Message:Echo"]),
            "Message:Echo": ("Message", {"content": ["{sys.query} with count {env.count}"]}, []),
        },
        variables={"count": {"type": "number", "value": 1}},
    )
    return api.create_agent(dsl)


def _ask_until_the_gate(api: Api, agent_id: str, session_id: str, text: str) -> tuple[threading.Thread, dict]:
    """Ask ``text`` in a thread; return once the turn waits in TestPureGate (open it with
    ``api.app.config["SERVICES"]["gate"].set()``, then join the thread; its reply is ``replies["resp"]``)."""
    replies: dict = {}

    def ask() -> None:
        replies["resp"] = Api(api.app, api.token).ask(agent_id, session_id, text)

    PURE_GATE_ENTERED.clear()
    asker = threading.Thread(target=ask)
    asker.start()
    assert PURE_GATE_ENTERED.wait(30)
    return asker, replies


def test_a_turn_without_effects_takes_no_lease_and_commits_once(api: Api):
    agent_id = _pure_gate_agent(api)
    session_id = api.create_session(agent_id)
    asker, replies = _ask_until_the_gate(api, agent_id, session_id, "first")
    # The turn waits inside a side-effect-free component: the session is not held.
    with api.app.app_context():
        row = Session.get_by_id(session_id)
        assert row.lease_owner is None and row.status != "running"
    api.app.config["SERVICES"]["gate"].set()
    asker.join()
    assert replies["resp"].status_code == 200
    assert replies["resp"].json["data"]["data"]["content"] == "first with count 1"
    session = api.session(agent_id, session_id)
    assert session["round"] == 1 and session["version"] == 2 and session["status"] == "idle"
    # Its task is known afterwards (the one write recorded it), and is not running.
    task_id = replies["resp"].json["data"]["task_id"]
    assert api.post(f"/tasks/{task_id}/cancel").json["data"] == {
        "task_id": task_id,
        "session_id": session_id,
        "cancelled": False,
    }


def _count_writes(monkeypatch) -> list[str]:
    """The turn service's writes as they start: ``"transaction"`` (write_transaction) or
    ``"single"`` (one statement under writer_in_line)."""
    started: list[str] = []

    def counting(kind: str, real):
        def spy():
            started.append(kind)
            return real()

        return spy

    monkeypatch.setattr(turns, "write_transaction", counting("transaction", turns.write_transaction))
    monkeypatch.setattr(turns, "writer_in_line", counting("single", turns.writer_in_line))
    return started


def test_a_first_message_makes_its_session_in_the_turns_first_transaction(api: Api, monkeypatch):
    """A completion without a session id writes the new session (row, first state,
    prologue) in the turn's first transaction, not one of its own before it: with the
    claim of a turn that takes the lease (the session is there, running, while the turn
    runs), with the commit of one that needs none (it writes once)."""
    gate = api.app.config["SERVICES"]["gate"]
    leased, pure = _gate_agent(api), _pure_gate_agent(api)
    started = _count_writes(monkeypatch)
    resp = api.post(f"/agents/{leased}/completions", json={"question": "go", "stream": True}, buffered=False)
    chunks = iter(resp.response)
    session_id = json.loads(next(chunks).decode()[len("data:") :])["session_id"]
    assert started == ["transaction"]  # the session and the lease, together
    assert api.session(leased, session_id)["status"] == "running"
    gate.set()
    frames = _rest(chunks)
    assert frames[-2]["event"] == "message_end" and frames[-2]["data"]["content"] == "started released"
    assert started == ["transaction", "transaction"]  # then the commit
    session = api.session(leased, session_id)
    assert session["round"] == 1 and [m["role"] for m in session["message"]] == [
        "assistant",
        "user",
        "assistant",
    ]

    started.clear()
    reply = api.ask(pure, None, "first")
    assert reply.status_code == 200 and reply.json["data"]["data"]["content"] == "first with count 1"
    assert started == ["transaction"]
    session = api.session(pure, reply.json["data"]["session_id"])
    assert session["round"] == 1 and session["status"] == "idle"
    assert [m["content"] for m in session["message"] if m["role"] == "user"] == ["first"]
    assert api.ask(pure, session["id"], "second").json["data"]["data"]["content"] == "second with count 1"


#: A trigger by which the database itself refuses a message log row saying "poison".
_REFUSE_POISON = {
    "sqlite": (
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON message_log WHEN NEW.content = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'poison refused'); END",
    ),
    "mysql": (
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON message_log FOR EACH ROW "
        "IF NEW.content = 'poison' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poison refused'; END IF",
    ),
    "postgres": (
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.content = 'poison' THEN RAISE EXCEPTION 'poison refused'; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON message_log FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
    ),
}
_ALLOW_POISON = {
    "sqlite": ("DROP TRIGGER refuse_poison",),
    "mysql": ("DROP TRIGGER refuse_poison",),
    "postgres": ("DROP TRIGGER refuse_poison ON message_log", "DROP FUNCTION refuse_poison()"),
}


def test_a_first_message_whose_turn_is_not_saved_leaves_the_session_its_reply_names(api: Api, backend):
    """The database refuses to store the turn (a trigger here): nothing of the turn is
    saved, but the session the reply names is there, as it was made (its prologue), and
    takes the next turn, as when the session was made before the turn."""

    def run(statements) -> None:
        with api.app.app_context():
            for sql in statements:
                db.execute_sql(sql)

    agent_id = api.create_agent(echo_dsl())
    run(_REFUSE_POISON[backend])
    try:
        reply = api.ask(agent_id, None, "poison")
        assert reply.status_code in (500, 503), reply.json
        data = reply.json["data"]
        assert data["data"]["error_type"] in ("TurnNotStorable", "TurnNotSaved"), data
        session = api.session(agent_id, data["session_id"])
        assert session["round"] == 0 and [m["role"] for m in session["message"]] == ["assistant"]
        again = api.ask(agent_id, data["session_id"], "fine")
        assert again.status_code == 200 and again.json["data"]["data"]["content"] == "echo: fine"
        assert api.session(agent_id, data["session_id"])["round"] == 1
    finally:
        run(_ALLOW_POISON[backend])


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_connection_the_server_ends_in_a_turns_commit_is_answered_as_what_was_stored(api: Api, backend):
    """Postgres takes a turn's writes and its COMMIT in one round trip, so when the server
    ends the connection in it, the client cannot know whether the COMMIT applied. Here a
    trigger ends its own backend (pg_terminate_backend, as an administrator or a restart
    would) when the message log is given "die", on every try: the turn reads the session
    back, answers "not saved" as stored, leaves the session as it was and free, and the
    next turn is saved."""

    def run(*statements: str) -> None:
        with api.app.app_context():
            for sql in statements:
                db.execute_sql(sql)

    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    assert api.ask(agent_id, session_id, "before").status_code == 200
    run(
        "CREATE FUNCTION end_on_die() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.content = 'die' THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF; "
        "RETURN NEW; END $$",
        "CREATE TRIGGER end_on_die BEFORE INSERT ON message_log FOR EACH ROW EXECUTE FUNCTION end_on_die()",
    )
    try:
        reply = api.ask(agent_id, session_id, "die")
    finally:
        run("DROP TRIGGER end_on_die ON message_log", "DROP FUNCTION end_on_die()")
    assert reply.json["data"]["data"]["error_type"] == "TurnNotSaved", reply.json
    assert "it was not saved" in reply.json["data"]["data"]["content"], reply.json
    session = api.session(agent_id, session_id)
    assert session["round"] == 1 and session["status"] == "idle"
    assert [m["content"] for m in session["message"] if m["role"] == "user"] == ["before"]
    again = api.ask(agent_id, session_id, "after")
    assert again.status_code == 200 and again.json["data"]["data"]["content"] == "echo: after"
    assert api.session(agent_id, session_id)["round"] == 2


def test_tasks_are_found_without_an_index_on_task_id_after_migration_19(app_factory, database_url, caplog):
    """Migration 19 drops the index on session.task_id: a task id begins with its
    session's id, which finds it, and one made before (a form paused then, resumed
    after) is found among the tenant's sessions; another tenant's or an unknown is not."""
    app = app_factory()
    api, other = Api(app, make_token(app)), Api(app, make_token(app, "tenant-b"))
    agent_id = api.create_agent(echo_dsl())
    new, old = api.create_session(agent_id), api.create_session(agent_id)
    task_id = api.ask(agent_id, new, "hi").json["data"]["task_id"]
    made_before = uuid.uuid4().hex
    table = Session._meta.table_name
    with app.app_context():
        Session.update(task_id=made_before).where(Session.id == old).execute()
        run_schema_changes(SchemaMigrator.from_database(db.obj).add_index(table, ("task_id",), False))
        SchemaVersion.delete().where(SchemaVersion.version == 19).execute()
    init_database(database_url, max_connections=4)

    with app.app_context():
        assert ["task_id"] not in [i.columns for i in db.get_indexes(table)]
    for task, session_id in ((task_id, new), (made_before, old)):
        assert api.post(f"/tasks/{task}/cancel").json["data"] == {
            "task_id": task,
            "session_id": session_id,
            "cancelled": False,
        }
        assert other.post(f"/tasks/{task}/cancel").status_code == 404
    assert api.post(f"/tasks/{task_id[:16]}{uuid.uuid4().hex[16:]}/cancel").status_code == 404
    next_task = api.ask(agent_id, new, "again").json["data"]["task_id"]
    assert next_task != task_id
    assert api.post(f"/tasks/{next_task}/cancel").json["data"]["session_id"] == new
    # An earlier turn's task id is not found, by its session alone: the tenant's other
    # sessions are not read (peewee logs each statement it runs).
    with caplog.at_level(logging.DEBUG, logger="peewee"):
        assert api.post(f"/tasks/{task_id}/cancel").status_code == 404
    assert [r for r in caplog.records if "agent_id" in r.getMessage()] == []


@pytest.mark.parametrize("stream", [False, True], ids=["blocking", "streamed"])
@pytest.mark.parametrize("unleased_seconds", [turns.UNLEASED_SECONDS, 0.0], ids=["default", "none"])
def test_a_turn_without_effects_takes_the_lease_only_after_unleased_seconds(
    api: Api, monkeypatch, stream, unleased_seconds
):
    """Side-effect-free components run without the lease for ``UNLEASED_SECONDS``; past
    that the turn takes it before its next component, blocking or streamed alike."""
    taken = []
    take_lease = TurnService._take_lease

    def spy(self, claim, *args):
        taken.append(claim.session_id)
        return take_lease(self, claim, *args)

    monkeypatch.setattr(TurnService, "_take_lease", spy)
    monkeypatch.setattr(turns, "UNLEASED_SECONDS", unleased_seconds)
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    if stream:
        frames = api.ask_stream(agent_id, session_id, "hi")
        assert frames[-2]["event"] == "message_end"
        assert (
            "".join(f["data"]["content"] for f in frames if f != "[DONE]" and f["event"] == "message")
            == "echo: hi"
        )
    else:
        assert api.ask(agent_id, session_id, "hi").json["data"]["data"]["content"] == "echo: hi"
    assert taken == ([] if unleased_seconds else [session_id])
    session = api.session(agent_id, session_id)
    assert session["round"] == 1 and session["status"] == "idle"


def test_a_turn_without_effects_that_loses_the_race_is_busy_and_saves_nothing(api: Api):
    agent_id = _pure_gate_agent(api)
    session_id = api.create_session(agent_id)
    asker, replies = _ask_until_the_gate(api, agent_id, session_id, "late")
    # Another write to the session while the turn runs without a lease: it wins.
    put = api.put(f"/agents/{agent_id}/sessions/{session_id}/variables/count", json={"value": 7})
    assert put.status_code == 200
    api.app.config["SERVICES"]["gate"].set()
    asker.join()
    assert replies["resp"].status_code == 409 and "busy" in replies["resp"].json["message"]
    session = api.session(agent_id, session_id)
    assert session["round"] == 0 and [m["role"] for m in session["message"]] == ["assistant"]
    # The variable write stands, and the next turn runs on it.
    assert api.ask(agent_id, session_id, "again").json["data"]["data"]["content"] == "again with count 7"


def test_cancel_from_another_thread_and_it_does_not_stick(api: Api):
    agent_id = api.create_agent(dsl_of({"TestTicker:T": ("TestTicker", {}, [])}))
    session_id = api.create_session(agent_id)
    resp, chunks, first = _start_stream(api, agent_id, session_id)
    task_id = first["task_id"]

    result = {}

    def cancel() -> None:
        result["resp"] = Api(api.app, api.token).post(f"/tasks/{task_id}/cancel")

    canceller = threading.Thread(target=cancel)
    canceller.start()
    canceller.join()
    assert result["resp"].json["code"] == 0 and result["resp"].json["data"]["cancelled"] is True

    frames = _rest(chunks)
    assert frames[-1] == "[DONE]"
    assert frames[-2]["event"] == "workflow_finished" and frames[-2]["data"]["status"] == "cancelled"
    session = api.session(agent_id, session_id)
    assert session["round"] == 0 and session["status"] == "idle"

    # Nothing is running now: a cancel is reported as such and leaves no flag behind.
    again = api.post(f"/tasks/{task_id}/cancel")
    assert again.json["code"] == 0 and again.json["data"]["cancelled"] is False
    api.app.config["SERVICES"]["gate"].set()  # the ticker now ends after one tick
    after = api.ask(agent_id, session_id, "x")
    assert after.status_code == 200 and after.json["data"]["data"]["content"] == "tick "


def test_cancelled_blocking_turn_reply(api: Api):
    agent_id = api.create_agent(dsl_of({"TestTicker:T": ("TestTicker", {}, [])}))
    session_id = api.create_session(agent_id)
    replies = {}

    def ask() -> None:
        replies["resp"] = Api(api.app, api.token).ask(agent_id, session_id, "long")

    asker = threading.Thread(target=ask)
    asker.start()
    with api.app.app_context():
        _until(lambda: Session.get_by_id(session_id).lease_owner is not None, "the turn to claim the session")
        task_id = Session.get_by_id(session_id).task_id
    assert api.post(f"/tasks/{task_id}/cancel").json["data"]["cancelled"] is True
    asker.join()
    resp = replies["resp"]
    assert resp.status_code == 409 and resp.json["code"] == 103
    assert resp.json["data"]["data"]["status"] == "cancelled"
    assert resp.json["data"]["data"]["content"] == resp.json["message"]


def test_crashed_worker_lease_expires_then_the_next_turn_proceeds(api: Api):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    api.ask(agent_id, session_id, "before the crash")
    committed = api.session(agent_id, session_id, dsl="true")

    # A worker claimed the session and died: its lease is left in the row.
    with api.app.app_context():
        Session.update(
            lease_owner="dead-host:1:abc", lease_expires=now_ms() + 60_000, status="running"
        ).where(Session.id == session_id).execute()
    resp = api.ask(agent_id, session_id, "during")
    assert resp.status_code == 409 and resp.json["code"] == 106
    assert api.session(agent_id, session_id)["status"] == "running"

    # Time passes: the lease is now in the past.
    with api.app.app_context():
        Session.update(lease_expires=now_ms() - 1).where(Session.id == session_id).execute()
    shown = api.session(agent_id, session_id, dsl="true")
    assert shown["status"] == "idle" and shown["dsl"] == committed["dsl"]
    resp = api.ask(agent_id, session_id, "after")
    assert resp.status_code == 200 and resp.json["data"]["data"]["content"] == "echo: after"
    session = api.session(agent_id, session_id)
    assert session["round"] == 2 and session["version"] == committed["version"] + 1


def test_client_disconnect_does_not_stop_or_lose_the_turn(api: Api):
    gate = api.app.config["SERVICES"]["gate"]
    agent_id = _gate_agent(api)
    session_id = api.create_session(agent_id)
    resp, chunks, first = _start_stream(api, agent_id, session_id)
    resp.close()  # the client goes away mid-answer
    gate.set()
    assert turn_service_of(api).wait_idle(30)
    session = api.session(agent_id, session_id)
    assert session["round"] == 1 and session["status"] == "idle"
    assert session["message"][-1]["content"] == "started released"


def test_session_deleted_mid_turn_reports_that_the_turn_was_not_saved(api: Api):
    gate = api.app.config["SERVICES"]["gate"]
    agent_id = _gate_agent(api)
    session_id = api.create_session(agent_id)
    resp, chunks, first = _start_stream(api, agent_id, session_id)
    assert api.delete(f"/agents/{agent_id}/sessions", json={"ids": [session_id]}).json["code"] == 0
    gate.set()
    frames = _rest(chunks)
    assert frames[-2]["event"] == "workflow_finished" and frames[-2]["data"]["status"] == "failed"
    assert "not be saved" in frames[-2]["data"]["content"]
    with api.app.app_context():
        # Nothing of the turn was written (the prologue waits for the sweep).
        assert (
            MessageLog.select().where((MessageLog.session_id == session_id) & (MessageLog.round > 0)).count()
            == 0
        )


def test_lease_is_renewed_while_a_turn_runs(app_factory):
    # A lease of 1 s (renewed every third of it): one of 0.3 s lapsed once in a CI run when
    # the test process stalled longer than two renewal periods; a lapsed lease is then
    # taken over, as it must be, so this test needs slack above such stalls.
    app = app_factory(LEASE_SECONDS=1.0)
    api = Api(app, make_token(app))
    gate = app.config["SERVICES"]["gate"]
    agent_id = _gate_agent(api)
    session_id = api.create_session(agent_id)
    resp, chunks, first = _start_stream(api, agent_id, session_id)
    with app.app_context():
        first_expiry = Session.get_by_id(session_id).lease_expires
    _until(lambda: now_ms() > first_expiry + 500, "the first lease to run out")
    # Past the first expiry the lease is still held: a second turn is refused.
    busy = api.post(
        f"/agents/{agent_id}/completions",
        json={"question": "me too", "session_id": session_id},
        buffered=False,
    )
    assert busy.status_code == 409, busy.get_data(as_text=True)
    gate.set()
    assert _rest(chunks)[-2]["event"] == "message_end"


def turn_service_of(api: Api):
    with api.app.app_context():
        return turn_service()


def test_wait_after_reading_every_event_returns_the_result(api: Api):
    agent_id = api.create_agent(echo_dsl())
    with api.app.app_context():
        from api.db import Tenant
        from api.services.turns import TurnRequest

        tenant_id = Tenant.get(Tenant.name == "tenant-a").id
        turn = turn_service().start(TurnRequest(tenant_id, agent_id, query="hi"))
        names = [e["event"] for e in turn.events()]
        assert names[-2:] == ["message_end", "workflow_finished"]
        assert list(turn.events()) == []
        assert turn.wait().status == "succeeded"


def test_a_non_ascii_snapshot_is_stored_as_its_utf8(api: Api, backend: str):
    """A turn hands the database its snapshot as the UTF-8 JSON writes, and its state (the
    row of the session's ring that the session points at) holds those bytes as they are:
    neither escaped nor compressed."""
    from api.db import db
    from api.services import history

    agent_id = api.create_agent(echo_dsl("≥ échø: {sys.query}"))
    session_id = api.create_session(agent_id)
    for query in ("你好 🙂", "ünï ✓"):  # the second turn runs from the kept canvas
        assert api.ask(agent_id, session_id, query).json["data"]["data"]["content"] == f"≥ échø: {query}"
    with api.app.app_context():
        row = history.select_with_state(Session.id, history.STATE).where(Session.id == session_id).get()
        assert isinstance(row.snapshot, bytes)
        assert "你好 🙂".encode() in row.snapshot
        assert json.loads(row.snapshot)["history"][-2:] == [["user", "ünï ✓"], ["assistant", "≥ échø: ünï ✓"]]
        if backend == "sqlite":
            kind = db.execute_sql(
                "SELECT typeof(packed) FROM kept_state WHERE session_id = ? AND round = 2", (session_id,)
            )
            assert kind.fetchone() == ("blob",)
