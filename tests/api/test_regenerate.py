"""Regenerate and undo (docs/design.md §15): ordinary turns that take back the last one."""

from __future__ import annotations

import threading
import zlib

import pytest
from peewee import BigAutoField, BigIntegerField, CharField, IntegerField
from playhouse.migrate import SchemaMigrator
from playhouse.migrate import migrate as run_schema_changes

from api.db import SchemaVersion, Session, SessionSnapshot, db, init_database
from api.db.models import BaseModel, LongBlobField, LongTextField
from api.services.history import unpack
from tests.api.conftest import Api, dsl_of, echo_dsl, make_token, parse_sse, sample
from tests.api.test_memory_api import keyed_dsl, remembered, sent_history
from tests.llm_server import LLMServer, text


def counter_dsl() -> dict:
    """Counts its turns in ``env.n`` and answers ``"<n>: <query>"``."""
    return dsl_of(
        {
            "VariableAssigner:Count": (
                "VariableAssigner",
                {"variables": [{"variable": "env.n", "operator": "+=", "parameter": 1}]},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{env.n}: {sys.query}"]}, []),
        },
        variables={"n": {"type": "number", "value": 0}},
    )


def answer(resp) -> str:
    assert resp.status_code == 200, resp.json
    return resp.json["data"]["data"]["content"]


def transcript(api: Api, agent_id: str, session_id: str) -> list[tuple]:
    data = api.session(agent_id, session_id)
    return [(m["role"], m["content"], bool(m.get("abandoned"))) for m in data["message"]]


def test_undo_restores_the_state_before_the_last_turn(api: Api):
    agent_id = api.create_agent(counter_dsl())
    session_id = api.create_session(agent_id)
    assert answer(api.ask(agent_id, session_id, "a")) == "1: a"
    assert answer(api.ask(agent_id, session_id, "b")) == "2: b"
    before = api.session(agent_id, session_id)

    resp = api.post(f"/agents/{agent_id}/sessions/{session_id}/undo", json={"stream": False})
    assert resp.status_code == 200, resp.json
    assert resp.json["data"]["event"] == "message_end"
    assert resp.json["data"]["data"]["content"] == "1: a"  # the last answer that stands

    after = api.session(agent_id, session_id)
    assert after["round"] == 1 and after["version"] == before["version"] + 1
    assert transcript(api, agent_id, session_id) == [
        ("assistant", "Hi!", False),
        ("user", "a", False),
        ("assistant", "1: a", False),
        ("user", "b", True),
        ("assistant", "2: b", True),
    ]
    # The state follows the active branch: the counter is back at 1.
    assert answer(api.ask(agent_id, session_id, "c")) == "2: c"
    dsl = api.session(agent_id, session_id, dsl="true")["dsl"]
    assert [m for m in dsl["history"]] == [
        ["user", "a"],
        ["assistant", "1: a"],
        ["user", "c"],
        ["assistant", "2: c"],
    ]


def test_regenerate_reruns_the_last_turn_from_the_state_before_it(api: Api):
    agent_id = api.create_agent(counter_dsl())
    session_id = api.create_session(agent_id)
    api.ask(agent_id, session_id, "a")
    api.ask(agent_id, session_id, "b")

    frames = parse_sse(
        api.post(f"/agents/{agent_id}/sessions/{session_id}/regenerate", json={}).get_data(as_text=True)
    )
    assert frames[-1] == "[DONE]"
    assert [f["event"] for f in frames[:-1]][-1] == "message_end"
    assert "".join(f["data"].get("content", "") for f in frames[:-1] if f["event"] == "message") == "2: b"

    data = api.session(agent_id, session_id)
    assert data["round"] == 2
    assert transcript(api, agent_id, session_id)[-4:] == [
        ("user", "b", True),
        ("assistant", "2: b", True),
        ("user", "b", False),
        ("assistant", "2: b", False),
    ]
    # Blocking, and twice in a row: each time from the state after turn 1.
    resp = api.post(f"/agents/{agent_id}/sessions/{session_id}/regenerate", json={"stream": False})
    assert answer(resp) == "2: b"
    assert answer(api.ask(agent_id, session_id, "c")) == "3: c"
    # Undo goes back step by step, as far as kept states reach.
    for _ in range(3):
        assert (
            api.post(f"/agents/{agent_id}/sessions/{session_id}/undo", json={"stream": False}).status_code
            == 200
        )
    assert api.session(agent_id, session_id)["round"] == 0
    assert answer(api.ask(agent_id, session_id, "again")) == "1: again"


def test_only_the_last_k_states_are_kept(app_factory):
    app = app_factory(KEEP_SNAPSHOTS=2)
    api = Api(app, make_token(app))
    agent_id = api.create_agent(counter_dsl())
    session_id = api.create_session(agent_id)
    for q in "abcdef":
        api.ask(agent_id, session_id, q)
    with app.app_context():  # the state and the K before it, each turn writing over the oldest
        assert sorted((row.round, row.slot) for row in SessionSnapshot.select()) == [(4, 1), (5, 2), (6, 0)]
    undo = f"/agents/{agent_id}/sessions/{session_id}/undo"
    for _ in range(2):
        assert api.post(undo, json={"stream": False}).status_code == 200
    resp = api.post(undo, json={"stream": False})
    assert resp.status_code == 409 and resp.json["code"] == 102
    assert "session.keep_snapshots" in resp.json["message"]
    assert api.session(agent_id, session_id)["round"] == 4


def test_with_no_kept_states_there_is_nothing_to_take_back(app_factory):
    app = app_factory(KEEP_SNAPSHOTS=0)
    api = Api(app, make_token(app))
    agent_id = api.create_agent(counter_dsl())
    session_id = api.create_session(agent_id)
    api.ask(agent_id, session_id, "a")
    for action in ("undo", "regenerate"):
        resp = api.post(f"/agents/{agent_id}/sessions/{session_id}/{action}", json={"stream": False})
        assert resp.status_code == 409 and "session.keep_snapshots" in resp.json["message"]
    assert api.session(agent_id, session_id)["version"] == 2


class _StateOfMigration10(BaseModel):
    """``session_state`` as migrations 10 to 15 left it: one row per kept state."""

    id = BigAutoField()
    session_id = CharField(max_length=32)
    round = IntegerField()
    packed = LongBlobField()
    create_time = BigIntegerField()

    class Meta:
        table_name = "session_state"
        indexes = ((("session_id", "round"), False),)


#: Text with the characters api.db.pgtext encodes on Postgres.
NONCHARACTERS = "s1 \ufffe\uffff \uffff\ufffe\ufffe"


def _as_before_ring(states: dict[str, dict[int, bytes]], layout: int) -> None:
    """Make this test's database hold ``states`` (session id -> round -> snapshot, the
    last round its current state) as schema ``layout`` kept them: the current state in
    the session row (``session.snapshot``, no ``state_slot``) and the earlier ones, every
    other one zlib-compressed as earlier versions kept them, in ``session_state`` (15:
    one row each, rounds 0 and 1 too) or in ``kept_state`` slots ``round % 10`` (16)."""
    migrator = SchemaMigrator.from_database(db.obj)
    table = Session._meta.table_name
    run_schema_changes(
        migrator.add_column(table, "snapshot", LongTextField(null=True)),
        migrator.drop_column(table, "state_slot", cascade=False),
    )
    SessionSnapshot.delete().execute()
    if layout == 15:
        db.execute_sql(f"DROP TABLE {SessionSnapshot._meta.table_name}")
        _StateOfMigration10.create_table()
    for session_id, kept in states.items():
        current = max(kept)
        db.execute_sql(
            f"UPDATE {table} SET snapshot = {db.obj.param} WHERE id = {db.obj.param}",
            (kept[current].decode("utf-8"), session_id),
        )
        for round_no, snapshot in kept.items():
            if round_no == current:
                continue
            packed = zlib.compress(snapshot, 1) if round_no % 2 else snapshot
            if layout == 15:
                _StateOfMigration10.create(
                    session_id=session_id, round=round_no, packed=packed, create_time=0
                )
            else:
                SessionSnapshot.create(
                    session_id=session_id, slot=round_no % 10, round=round_no, packed=packed, create_time=0
                )
    SchemaVersion.delete().where(SchemaVersion.version >= layout + 1).execute()


@pytest.mark.parametrize("layout", [15, 16])
def test_sessions_of_an_older_schema_move_into_the_ring_and_go_on(app_factory, database_url, layout):
    """Migration 17 moves a session's state from its row into the ring of its kept states
    (and 16, from one row per kept state into slots): its turns, regenerate and undo go
    on from the states the older schema kept, compressed or not."""
    app = app_factory(CANVAS_CACHE_ENTRIES=0)  # every turn reads its session's state
    api = Api(app, make_token(app))
    agent_id = api.create_agent(counter_dsl())
    long, short = api.create_session(agent_id), api.create_session(agent_id)
    for n in range(1, 13):
        assert answer(api.ask(agent_id, long, f"q{n}")) == f"{n}: q{n}"
    assert answer(api.ask(agent_id, short, NONCHARACTERS)) == f"1: {NONCHARACTERS}"
    with app.app_context():
        states: dict[str, dict[int, bytes]] = {long: {}, short: {}}
        for row in SessionSnapshot.select():
            snapshot = unpack(row.packed)
            states[row.session_id][row.round] = (
                snapshot.encode("utf-8") if isinstance(snapshot, str) else snapshot
            )
        assert sorted(states[long]) == list(range(2, 13)) and sorted(states[short]) == [0, 1]
        if layout == 15:  # rounds 0 and 1 were kept too (older, in the slots of 10 and 11)
            states[long] |= {0: b'{"v": "older"}', 1: b'{"v": "older"}'}
        _as_before_ring(states, layout)
    init_database(database_url, max_connections=4)

    with app.app_context():
        assert "snapshot" not in {c.name for c in db.get_columns(Session._meta.table_name)}
        assert "session_state" not in db.get_tables()
        slots = {r.id: r.state_slot for r in Session.select(Session.id, Session.state_slot)}
        assert slots == {long: 2, short: 1}
        moved = {
            (row.slot, row.round)
            for row in SessionSnapshot.select().where(SessionSnapshot.session_id == long)
        }
        # Round 12 went to slot 2, the oldest kept state's (round 2).
        assert moved == {(r % 10, r) for r in range(3, 13)}
    assert api.session(agent_id, long, dsl="true")["dsl"]["globals"]["env.n"] == 12
    resp = api.post(f"/agents/{agent_id}/sessions/{long}/regenerate", json={"stream": False})
    assert answer(resp) == "12: q12"
    undo = f"/agents/{agent_id}/sessions/{long}/undo"
    assert answer(api.post(undo, json={"stream": False})) == "11: q11"
    assert answer(api.post(undo, json={"stream": False})) == "10: q10"  # compressed
    assert answer(api.ask(agent_id, long, "again")) == "11: again"
    history = api.session(agent_id, short, dsl="true")["dsl"]["history"]
    assert history[-1] == ["assistant", f"1: {NONCHARACTERS}"]  # as sent, on Postgres too (api.db.pgtext)
    assert answer(api.ask(agent_id, short, "s2")) == "2: s2"
    assert (
        answer(api.post(f"/agents/{agent_id}/sessions/{short}/undo", json={"stream": False}))
        == f"1: {NONCHARACTERS}"
    )
    assert answer(api.post(f"/agents/{agent_id}/sessions/{short}/undo", json={"stream": False})) == "Hi!"
    assert api.session(agent_id, short)["round"] == 0


def test_the_session_shows_the_task_id_of_its_last_turn_after_an_undo_too(api: Api):
    """A resumed form goes on under the paused turn's task id; after an undo back to the
    paused form (the undo has a task id of its own), the resumed turn's is shown again."""
    agent_id = api.create_agent(sample("intake_form"))
    session_id = api.create_session(agent_id)
    paused = api.ask(agent_id, session_id, "sign me up").json["data"]
    task_id = paused["task_id"]
    partial = api.ask(agent_id, session_id, inputs={"name": "Ann", "age": 41}).json["data"]
    assert partial["task_id"] == task_id and api.session(agent_id, session_id)["task_id"] == task_id

    undone = api.post(f"/agents/{agent_id}/sessions/{session_id}/undo", json={"stream": False})
    assert undone.status_code == 200 and undone.json["data"]["task_id"] != task_id
    assert api.session(agent_id, session_id)["task_id"] == undone.json["data"]["task_id"]

    done = api.ask(agent_id, session_id, inputs={"name": "Bo", "age": 70, "plan": "pro"})
    assert done.status_code == 200 and "Thanks Bo" in done.json["data"]["data"]["content"]
    assert done.json["data"]["task_id"] == task_id
    session = api.session(agent_id, session_id)
    assert session["task_id"] == task_id and session["round"] == 2 and session["status"] == "idle"


def test_sessions_taking_turns_at_once_all_keep_their_states_and_save(app_factory):
    """Sessions taking turns at once each write their kept states over their own oldest.
    (When the oldest were deleted every K turns, on MySQL a DELETE by session and round
    could be planned as a scan of the whole table, a young table's statistics, and lock
    other sessions' kept rows: turns deadlocked and some were answered "not saved", seen
    with the turn service called from 8 threads, 4-5 of 160 requests; through the test
    client the turns overlap less and it did not show.)"""
    app = app_factory(KEEP_SNAPSHOTS=2)
    api = Api(app, make_token(app))
    agent_id = api.create_agent(counter_dsl())
    sessions = [api.create_session(agent_id) for _ in range(8)]
    failures: list = []

    def talk(session_id: str) -> None:
        mine = Api(app, api.token)
        for n in range(1, 11):
            resp = mine.ask(agent_id, session_id, f"q{n}")
            if resp.status_code != 200 or resp.json["data"]["data"]["content"] != f"{n}: q{n}":
                failures.append((session_id, n, resp.status_code, resp.json))

    threads = [threading.Thread(target=talk, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    for session_id in sessions:  # the last K states are there to go back to
        undo = f"/agents/{agent_id}/sessions/{session_id}/undo"
        assert answer(api.post(undo, json={"stream": False})) == "9: q9"
        assert answer(api.post(undo, json={"stream": False})) == "8: q8"


@pytest.mark.parametrize("action", ["undo", "regenerate"])
def test_rewind_errors(api: Api, other: Api, action: str):
    agent_id = api.create_agent(echo_dsl())
    session_id = api.create_session(agent_id)
    fresh = api.post(f"/agents/{agent_id}/sessions/{session_id}/{action}", json={"stream": False})
    assert fresh.status_code == 409 and fresh.json["code"] == 102
    assert "no turn to take back" in fresh.json["message"]
    missing = api.post(f"/agents/{agent_id}/sessions/{'0' * 32}/{action}", json={})
    assert missing.status_code == 404 and missing.json["code"] == 102
    api.ask(agent_id, session_id, "a")
    foreign = other.post(f"/agents/{agent_id}/sessions/{session_id}/{action}", json={})
    assert foreign.status_code == 404
    bad = api.post(f"/agents/{agent_id}/sessions/{session_id}/{action}", json={"stream": "maybe"})
    assert bad.status_code == 400 and "stream" in bad.json["message"]
    assert api.session(agent_id, session_id)["version"] == 2


def gate_dsl() -> dict:
    return dsl_of(
        {
            "TestGate:Wait": ("TestGate", {}, ["Message:Out"]),
            "Message:Out": ("Message", {"content": ["done: {sys.query}"]}, []),
        }
    )


def test_regenerate_racing_a_turn_one_wins_one_is_busy(app, api: Api):
    gate = app.config["SERVICES"]["gate"]
    agent_id = api.create_agent(gate_dsl())
    session_id = api.create_session(agent_id)
    gate.set()
    api.ask(agent_id, session_id, "a")
    api.ask(agent_id, session_id, "b")
    gate.clear()

    calls = {
        "turn": lambda: api.post(
            f"/agents/{agent_id}/completions",
            json={"question": "c", "session_id": session_id, "stream": True},
        ),
        "regenerate": lambda: api.post(f"/agents/{agent_id}/sessions/{session_id}/regenerate", json={}),
    }
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def run(name: str) -> None:
        barrier.wait()
        results[name] = calls[name]()

    threads = [threading.Thread(target=run, args=(n,)) for n in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in results.values())
    assert statuses == [200, 409]
    loser = next(r for r in results.values() if r.status_code == 409)
    assert loser.json["code"] == 106
    winner = next(n for n, r in results.items() if r.status_code == 200)
    gate.set()
    results[winner].get_data()  # the stream to its end: the turn committed
    app.extensions["agentcanvas.turns"].wait_idle(30)

    said = "started released\n\ndone: {}".format
    log = transcript(api, agent_id, session_id)
    active = [(role, content) for role, content, abandoned in log if not abandoned]
    if winner == "turn":
        assert active[-4:] == [
            ("user", "b"),
            ("assistant", said("b")),
            ("user", "c"),
            ("assistant", said("c")),
        ]
        assert not any(abandoned for _, _, abandoned in log)
    else:
        assert active[-2:] == [("user", "b"), ("assistant", said("b"))]
        assert [entry for entry in log if entry[2]] == [("user", "b", True), ("assistant", said("b"), True)]
    assert api.session(agent_id, session_id)["round"] == (3 if winner == "turn" else 2)


# -- with a model ------------------------------------------------------------------------------


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


@pytest.fixture
def llm_api(app_factory, llm) -> Api:
    app = app_factory(SETTINGS={"llm": llm.settings(max_retries=0)})
    return Api(app, make_token(app))


def chat_dsl() -> dict:
    return dsl_of(
        {
            "LLM:Chat": (
                "LLM",
                {"sys_prompt": "Be brief.", "message_history_window_size": 10},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{LLM:Chat@content}"]}, []),
        }
    )


@pytest.mark.parametrize("dsl", [chat_dsl, keyed_dsl], ids=["node memory", "keyed memory"])
def test_after_a_regenerate_the_model_hears_the_new_answer_only(llm_api: Api, llm: LLMServer, dsl):
    api = llm_api
    agent_id = api.create_agent(dsl())
    session_id = api.create_session(agent_id, user_id="u1")
    llm.queue(text("first answer"), text("abandoned answer"), text("regenerated answer"))
    api.ask(agent_id, session_id, "one")
    assert answer(api.ask(agent_id, session_id, "two")) == "abandoned answer"
    resp = api.post(f"/agents/{agent_id}/sessions/{session_id}/regenerate", json={"stream": False})
    assert answer(resp) == "regenerated answer"
    # The regenerate itself was asked from the state before turn two.
    assert sent_history(llm) == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "first answer"},
    ]

    api.ask(agent_id, session_id, "three")
    history = sent_history(llm)
    assert {"role": "assistant", "content": "regenerated answer"} in history
    assert all(m["content"] != "abandoned answer" for m in history)
    if dsl is keyed_dsl:
        kept = [m["content"] for m in remembered(api, agent_id, "u1")["LLM:Chat"]]
        assert "abandoned answer" not in kept and "regenerated answer" in kept


def test_an_embed_visitor_regenerates_their_own_last_answer(app, api: Api):
    from tests.api.test_embed import Bot

    bot = Bot(app, make_token(app, "tenant-a", "embed"))
    stranger = Bot(app, bot.token)
    agent_id = api.create_agent(counter_dsl())
    _, session_id = bot.chat(agent_id, "a")
    bot.chat(agent_id, "b", session_id=session_id)
    path = f"/api/v1/agentbots/{agent_id}/sessions/{session_id}/regenerate"

    theirs = stranger.client.post(path, json={"user_id": stranger.user_id}, headers=stranger.headers())
    assert theirs.status_code == 404
    no_user = bot.client.post(path, json={}, headers=bot.headers())
    assert no_user.status_code == 400 and "user_id" in no_user.json["message"]

    resp = bot.client.post(path, json={"user_id": bot.user_id, "stream": False}, headers=bot.headers())
    assert answer(resp) == "2: b" and resp.headers["X-Session-Id"] == session_id
    shown = bot.history(agent_id, session_id).json["data"]["message"]
    # The page shows the active branch only.
    assert [m["content"] for m in shown] == ["Hi!", "a", "1: a", "b", "2: b"]
    assert not any(m.get("abandoned") for m in shown)
