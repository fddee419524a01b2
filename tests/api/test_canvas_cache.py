"""The per-process cache of canvases (api/services/canvas_cache.py): turns served from it
commit exactly what turns that read the snapshot commit; a write from elsewhere is seen;
a turn that does not commit leaves nothing to reuse."""

from __future__ import annotations

import json
import random
import threading

import pytest

from agent.canvas import Canvas
from api.db import MessageLog, Session, SessionSnapshot, db
from api.services import history
from api.services.canvas_cache import CanvasCache
from tests.agent.test_loop import loop_dsl
from tests.api.components import PURE_GATE_ENTERED
from tests.api.conftest import Api, dsl_of, make_token, sample
from tests.api.test_datasets import parsed_dataset
from tests.api.test_memory_api import keyed_dsl
from tests.api.test_regenerate import chat_dsl, counter_dsl
from tests.llm_server import LLMServer, Reply

#: Values that differ between two plays of one script (ids, clocks).
VOLATILE = {
    "message_id",
    "task_id",
    "created_at",
    "elapsed_time",
    "started_at",
    "sys.date",
    "sys.message_id",
    "sys.agent_id",
    "id",
}
FORM = {"name": "Ann", "age": 41, "plan": "pro", "notes": "a short note"}


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def make_api(app_factory, llm: LLMServer, **config) -> Api:
    app = app_factory(SETTINGS={"llm": llm.settings(max_retries=0)}, **config)
    return Api(app, make_token(app))


def cache_of(api: Api) -> CanvasCache:
    return api.app.extensions["agentcanvas.turns"].canvases


def scrub(value, *ids: str):
    """``value`` with the volatile values left out and the ids (agent, session) written ``<id>``."""
    if isinstance(value, dict):
        return {k: scrub(v, *ids) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, (list, tuple)):
        return [scrub(v, *ids) for v in value]
    if isinstance(value, str):
        for known in ids:
            value = value.replace(known, "<id>")
    return value


def stored(api: Api, session_id: str) -> tuple[int, dict]:
    with api.app.app_context():
        row = history.select_with_state(Session.version, history.STATE).where(Session.id == session_id).get()
    return row.version, json.loads(history.unpack(row.snapshot))


def q(text: str, stream: bool = False) -> dict:
    return {"question": text, "stream": stream}


def answers(inputs: dict, stream: bool = False) -> dict:
    return {"question": "", "inputs": inputs, "stream": stream}


# Sample agents and what is said to them, turn by turn: blocking and streamed turns,
# forms paused and resumed (and answers refused), variables, memory, loops.
SCRIPTS = {
    "greeting": lambda: (sample("greeting"), [q("hello"), q("again", True), q("third"), q("ünï ✓")]),
    "counter": lambda: (sample("counter"), [q("a"), q("b", True), q("c"), q("d"), q("e", True), q("f")]),
    "intake_form": lambda: (
        sample("intake_form"),
        [
            q("hi"),
            answers({"age": "forty"}),  # refused: nothing committed
            answers(FORM),
            q("again", True),
            answers({**FORM, "age": 12}, True),
            q("third"),
            answers({"name": "Bo"}),  # partial answers: still paused
            answers(FORM),
        ],
    ),
    "iteration_demo": lambda: (sample("iteration_demo"), [q("a b c"), q("d e", True), q("f"), q("")]),
    "loop": lambda: (loop_dsl(), [q("one"), q("two", True), q("three")]),
    "planner": lambda: (
        sample("planner"),
        [
            q("bake bread"),
            answers({"approve": "yes"}),
            q("paint", True),
            answers({"approve": "no", "notes": "x"}),
        ],
    ),
    "support_assistant": lambda: (
        sample("support_assistant"),
        [q("my invoice is wrong"), q("the app crashes", True), q("thanks"), q("refund please")],
    ),
    "node memory": lambda: (chat_dsl(), [q("one"), q("two", True), q("three"), q("four")]),
    "keyed memory": lambda: (keyed_dsl(), [q("one"), q("two"), q("three", True)]),
}


def play(api: Api, dsl: dict, script: list[dict], user_id: str = "u1") -> list[tuple]:
    """Each turn's reply, and the session's stored version and snapshot after it (scrubbed)."""
    agent_id = api.create_agent(dsl)
    session_id = api.create_session(agent_id, user_id=user_id)
    played = []
    for n, body in enumerate(script):
        random.seed(n)  # a Message with several contents picks one at random
        resp = api.post(f"/agents/{agent_id}/completions", json={**body, "session_id": session_id})
        if body["stream"]:
            reply = resp.get_data(as_text=True)
            reply = [json.loads(b[5:]) if b[5:] != "[DONE]" else b for b in reply.split("\n\n") if b]
        else:
            reply = resp.json
        played.append(
            (resp.status_code, scrub(reply, session_id), *scrub(stored(api, session_id), session_id))
        )
    return played


def first_difference(a, b, where: str = "") -> str:
    """Where two played turns first differ, and how (the message of a failed comparison)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in {**a, **b}:
            if a.get(key, "<missing>") != b.get(key, "<missing>"):
                return first_difference(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{where}/{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{where}[{i}]")
    return f"at {where or '/'}: {a!r:.300} (cache off) != {b!r:.300} (cache on)"


def committed(turn: tuple) -> bool:
    """Whether a played turn committed a new snapshot (what the cache keeps)."""
    status, reply = turn[0], turn[1]
    if status != 200:
        return False
    ends = reply if isinstance(reply, list) else [reply["data"]]
    return not any(
        isinstance(e, dict)
        and e.get("event") == "workflow_finished"
        and e["data"].get("status") != "succeeded"
        for e in ends
    )


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_turns_from_the_cache_commit_what_turns_from_the_snapshot_commit(app_factory, llm, name):
    plain = make_api(app_factory, llm, CANVAS_CACHE_ENTRIES=0)
    cached = make_api(app_factory, llm)
    dsl, script = SCRIPTS[name]()

    without = play(plain, dsl, script)
    with_cache = play(cached, dsl, script)

    for n, (a, b) in enumerate(zip(without, with_cache, strict=True)):
        assert a == b, f"turn {n + 1} of {name}: {script[n]}: {first_difference(a, b)}"
    assert cache_of(plain).hits == 0 and len(cache_of(plain)) == 0
    # Every turn that follows a committed turn was served from the cache.
    expected = sum(committed(before) for before in with_cache[:-1])
    assert expected >= 2
    assert cache_of(cached).hits == expected
    assert sum(committed(t) for t in with_cache) >= len(script) - 1


def test_a_retrieval_agent_from_the_cache_answers_and_cites_the_same(app_factory, llm):
    plain = make_api(app_factory, llm, CANVAS_CACHE_ENTRIES=0)
    cached = make_api(app_factory, llm)
    ds, _ = parsed_dataset(plain)
    dsl = sample("docs_assistant")
    dsl["variables"]["dataset"]["value"] = ds
    script = [q("How are documents parsed?"), q("What is a dataset?", True), q("How are documents parsed?")]
    without, with_cache = play(plain, dsl, script), play(cached, dsl, script)
    assert without == with_cache
    assert "[ID:" in json.dumps(with_cache[0][1]) and with_cache[-1][3]["retrieval"]
    assert cache_of(cached).hits == 2


def counter_agent(api: Api) -> tuple[str, str]:
    agent_id = api.create_agent(counter_dsl())
    return agent_id, api.create_session(agent_id)


def said(resp) -> str:
    assert resp.status_code == 200, resp.json
    return resp.json["data"]["data"]["content"]


def test_a_write_from_another_worker_is_read_not_the_kept_canvas(app_factory, llm):
    one = make_api(app_factory, llm)
    two = Api(make_api(app_factory, llm).app, one.token)  # another worker process, same database
    agent_id, session_id = counter_agent(one)
    assert said(one.ask(agent_id, session_id, "a")) == "1: a"
    assert cache_of(one).version_of(session_id) is not None

    assert said(two.ask(agent_id, session_id, "b")) == "2: b"  # the other worker's turn
    assert said(one.ask(agent_id, session_id, "c")) == "3: c"  # not "2: c" from the kept canvas
    assert cache_of(one).hits == 0 and cache_of(one).misses == 1

    # A variable saved over REST (by either worker) is a write the next turn sees.
    assert (
        two.put(f"/agents/{agent_id}/sessions/{session_id}/variables/n", json={"value": 10}).status_code
        == 200
    )
    assert said(one.ask(agent_id, session_id, "d")) == "11: d"
    assert (
        one.put(f"/agents/{agent_id}/sessions/{session_id}/variables/n", json={"value": 20}).status_code
        == 200
    )
    assert said(one.ask(agent_id, session_id, "e")) == "21: e"
    assert cache_of(one).hits == 0

    # Undo and regenerate write a new version too; after them, turns are cached again.
    # (Undo restores the state before "e": the variable saved as 20.)
    assert said(one.post(f"/agents/{agent_id}/sessions/{session_id}/undo", json={"stream": False})) == "11: d"
    assert said(one.ask(agent_id, session_id, "f")) == "21: f"
    regenerated = one.post(f"/agents/{agent_id}/sessions/{session_id}/regenerate", json={"stream": False})
    assert said(regenerated) == "21: f"
    assert said(one.ask(agent_id, session_id, "g")) == "22: g"
    assert said(one.ask(agent_id, session_id, "h")) == "23: h"
    assert cache_of(one).hits == 2  # "g" after the regenerate, "h" after "g"


def test_a_failed_turn_leaves_nothing_to_reuse(app_factory, llm):
    api = make_api(app_factory, llm)
    agent_id = api.create_agent(chat_dsl())
    session_id = api.create_session(agent_id)
    assert said(api.ask(agent_id, session_id, "one")) == "echo: one"
    kept = cache_of(api).version_of(session_id)
    assert kept == stored(api, session_id)[0]

    llm.queue(Reply(status=500))
    failed = api.ask(agent_id, session_id, "two")
    assert failed.json["data"]["data"]["status"] == "failed"
    assert cache_of(api).version_of(session_id) is None
    # The failure bumped the version (its error is recorded); the next turn reads the row.
    assert said(api.ask(agent_id, session_id, "three")) == "echo: three"
    history = stored(api, session_id)[1]["history"]
    assert [text for _, text in history] == ["one", "echo: one", "three", "echo: three"]


def test_a_refused_or_busy_turn_leaves_nothing_to_reuse(app_factory, llm):
    api = make_api(app_factory, llm)
    agent_id = api.create_agent(sample("intake_form"))
    session_id = api.create_session(agent_id)
    assert api.ask(agent_id, session_id, "hi").json["data"]["event"] == "user_inputs"
    assert cache_of(api).version_of(session_id) is not None
    refused = api.ask(agent_id, session_id, "", inputs={"age": "forty"})
    assert refused.status_code == 400
    assert cache_of(api).version_of(session_id) is None
    done = api.ask(agent_id, session_id, "", inputs=FORM)
    assert done.status_code == 200 and "Ann" in done.json["data"]["data"]["content"]


def held_turn(api: Api, agent_id: str, session_id: str):  # noqa: ANN201 - the response's chunks
    """A streamed turn "long" of a TestTicker agent, held at its app's gate (closed here)
    once it has taken the lease; its response's chunks, unread."""
    api.app.config["SERVICES"]["gate"].clear()
    resp = api.post(
        f"/agents/{agent_id}/completions",
        json={"question": "long", "stream": True, "session_id": session_id},
        buffered=False,
    )
    return iter(resp.response)


def test_a_cancelled_turn_leaves_nothing_to_reuse(app_factory, llm):
    api = make_api(app_factory, llm)
    gate = api.app.config["SERVICES"]["gate"]
    agent_id = api.create_agent(dsl_of({"TestTicker:T": ("TestTicker", {}, [])}))
    session_id = api.create_session(agent_id)
    gate.set()
    assert said(api.ask(agent_id, session_id, "x")) == "tick "
    assert cache_of(api).version_of(session_id) is not None
    chunks = held_turn(api, agent_id, session_id)
    task_id = json.loads(next(chunks).decode()[len("data:") :])["task_id"]
    assert api.post(f"/tasks/{task_id}/cancel").json["data"]["cancelled"] is True
    frames = b"".join(chunks).decode()
    assert '"status":"cancelled"' in frames.replace(" ", "")
    api.app.extensions["agentcanvas.turns"].wait_idle(30)
    assert cache_of(api).version_of(session_id) is None
    gate.set()
    assert said(api.ask(agent_id, session_id, "y")) == "tick "
    assert [text for _, text in stored(api, session_id)[1]["history"]] == ["x", "tick ", "y", "tick "]


def test_two_turns_of_one_session_never_share_a_kept_canvas(app_factory, llm):
    api = make_api(app_factory, llm)
    gate = api.app.config["SERVICES"]["gate"]
    agent_id = api.create_agent(
        dsl_of(
            {
                "TestPureGate:Wait": ("TestPureGate", {}, ["Message:Echo"]),
                "Message:Echo": ("Message", {"content": ["{sys.query}"]}, []),
            }
        )
    )
    session_id = api.create_session(agent_id)
    gate.set()
    assert said(api.ask(agent_id, session_id, "a")) == "a"
    gate.clear()
    PURE_GATE_ENTERED.clear()
    replies = {}
    first = threading.Thread(
        target=lambda: replies.setdefault("b", Api(api.app, api.token).ask(agent_id, session_id, "b"))
    )
    first.start()
    assert PURE_GATE_ENTERED.wait(30)
    # The first turn took the kept canvas; the second reads the row, runs, and commits
    # first (the gate is open for it); the first then finds the session moved on.
    assert cache_of(api).version_of(session_id) is None
    gate.set()
    second = api.ask(agent_id, session_id, "c")
    first.join()
    statuses = sorted([replies["b"].status_code, second.status_code])
    assert statuses in ([200, 200], [200, 409])
    history = [text for _, text in stored(api, session_id)[1]["history"]]
    assert history[:2] == ["a", "a"] and len(history) == 2 + 2 * statuses.count(200)


def test_the_cache_is_bounded_and_keeps_the_latest_version():
    def kept(pad: int):
        canvas = Canvas(sample("greeting"))
        canvas.globals["env.pad"] = "x" * pad
        text = str(canvas)
        loaded = Canvas(text)
        return loaded.keep(loaded.dump(keepable=True))

    small = len(kept(0).text)
    cache = CanvasCache(max_entries=2, max_bytes=3 * small - 1)
    cache.put("a", 1, kept(0))
    cache.put("b", 1, kept(0))
    cache.put("c", 1, kept(0))  # past 2 entries: the least recently used goes
    assert [cache.version_of(s) for s in "abc"] == [None, 1, 1]
    cache.put("b", 3, kept(0))
    cache.put("b", 2, kept(0))  # an older turn's commit, put later: the newer entry stays
    assert cache.version_of("b") == 3
    assert cache.take("b", 2) is None and cache.version_of("b") is None  # another version: dropped
    big = kept(small)  # about twice the size of the others: with "c", past the byte bound
    cache.put("d", 1, big)
    assert cache.version_of("c") is None and len(cache) == 1
    assert cache.take("d", 1) is big and cache.take("d", 1) is None  # taken out: once
    cache.put("e", 1, kept(3 * small))  # larger than the whole cache: not kept
    assert len(cache) == 0
    off = CanvasCache(max_entries=0, max_bytes=10_000)
    off.put("a", 1, kept(0))
    assert len(off) == 0 and not off.enabled


def test_an_embed_visitors_turns_are_cached_and_stay_theirs(app_factory, llm):
    from tests.api.test_embed import Bot

    api = make_api(app_factory, llm)
    bot = Bot(api.app, make_token(api.app, "tenant-a", "embed"))
    stranger = Bot(api.app, bot.token)
    agent_id = api.create_agent(counter_dsl())
    _, session_id = bot.chat(agent_id, "a")
    frames, _ = bot.chat(agent_id, "b", session_id=session_id)
    assert frames[-2]["data"]["content"] == "2: b" and cache_of(api).hits == 1
    # The kept canvas is looked for only once the row is this visitor's.
    theirs = stranger.complete(agent_id, "c", session_id=session_id)
    assert theirs.status_code == 404
    assert cache_of(api).version_of(session_id) is not None
    frames, _ = bot.chat(agent_id, "c", session_id=session_id)
    assert frames[-2]["data"]["content"] == "3: c" and cache_of(api).hits == 2


def test_a_fault_in_the_cache_never_fails_a_turn(app_factory, llm, monkeypatch):
    from agent.canvas import KeptCanvas

    api = make_api(app_factory, llm)
    agent_id, session_id = counter_agent(api)
    assert said(api.ask(agent_id, session_id, "a")) == "1: a"

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(KeptCanvas, "load", broken)  # the turn loads the snapshot instead
    assert said(api.ask(agent_id, session_id, "b")) == "2: b"
    monkeypatch.setattr(Canvas, "keep", broken)  # the turn is saved all the same, and not kept
    assert said(api.ask(agent_id, session_id, "c")) == "3: c"
    assert cache_of(api).version_of(session_id) is None
    monkeypatch.undo()
    assert said(api.ask(agent_id, session_id, "d")) == "4: d"
    assert said(api.ask(agent_id, session_id, "e")) == "5: e"
    assert stored(api, session_id)[1]["globals"]["env.n"] == 5


# ---------------------------------------------------------------- turns that read nothing
def session_reads(api: Api, monkeypatch) -> list[str]:
    """The statements that read the ``session`` table from now on (appended as they run)."""
    with api.app.app_context():
        cls = type(db.obj)
    run = cls.execute_sql
    seen: list[str] = []

    def counted(self, sql, params=None):  # noqa: ANN001, ANN202 - peewee's signature
        if sql.startswith("SELECT") and ('FROM "session"' in sql or "FROM `session`" in sql):
            seen.append(sql)
        return run(self, sql, params)

    monkeypatch.setattr(cls, "execute_sql", counted)
    return seen


def test_a_blocking_turn_after_one_committed_here_reads_no_session_row(app_factory, llm, monkeypatch):
    api = make_api(app_factory, llm)
    agent_id = api.create_agent(sample("intake_form"))
    session_id = api.create_session(agent_id)
    assert api.ask(agent_id, session_id, "hi").json["data"]["event"] == "user_inputs"
    reads = session_reads(api, monkeypatch)

    done = api.ask(agent_id, session_id, "", inputs=FORM)
    assert "Thanks Ann!" in said(done)
    assert reads == []  # the form's answers ran on the row the paused turn committed
    assert api.ask(agent_id, session_id, "again").json["data"]["event"] == "user_inputs"
    assert reads == []
    # A streamed turn sends events as they come: it reads the row first (the snapshot left out).
    frames = api.ask_stream(agent_id, session_id, "", inputs=FORM)
    assert any("Thanks Ann!" in json.dumps(f) for f in frames)
    assert len(reads) == 1 and "CASE WHEN" in reads[0]
    assert cache_of(api).hits == 3 and cache_of(api).misses == 0
    version, snapshot = stored(api, session_id)
    assert [text for _, text in snapshot["history"]][-1].startswith("Thanks Ann!")
    assert api.session(agent_id, session_id)["message"][-1]["content"].startswith("Thanks Ann!")


def two_forms_dsl() -> dict:
    def form(field: str) -> dict:
        return {"inputs": {field: {"name": field, "type": "line", "optional": False}}}

    return dsl_of(
        {
            "UserFillUp:A": ("UserFillUp", form("a"), ["UserFillUp:B"]),
            "UserFillUp:B": ("UserFillUp", form("b"), ["Message:Done"]),
            "Message:Done": ("Message", {"content": ["{UserFillUp:A@a} then {UserFillUp:B@b}"]}, []),
        }
    )


def test_answers_refused_on_the_row_kept_here_are_asked_again_on_the_row_as_it_is(app_factory, llm):
    one = make_api(app_factory, llm)
    two = Api(make_api(app_factory, llm).app, one.token)  # another worker process, same database
    agent_id = one.create_agent(two_forms_dsl())
    session_id = one.create_session(agent_id)
    assert one.ask(agent_id, session_id, "hi").json["data"]["event"] == "user_inputs"  # form A, kept by one
    paused_at_b = two.ask(agent_id, session_id, "", inputs={"a": "x"}).json["data"]
    assert paused_at_b["event"] == "user_inputs" and "b" in paused_at_b["data"]["inputs"]

    # One's kept canvas still waits at form A, which refuses these answers; the row as it
    # is waits at form B, which takes them.
    done = one.ask(agent_id, session_id, "", inputs={"b": "y"})
    assert said(done) == "x then y"
    assert cache_of(one).version_of(session_id) == stored(one, session_id)[0]


def test_a_session_deleted_elsewhere_is_not_found_by_a_turn_on_the_row_kept_here(app_factory, llm):
    one = make_api(app_factory, llm)
    two = Api(make_api(app_factory, llm).app, one.token)
    agent_id, session_id = counter_agent(one)
    assert said(one.ask(agent_id, session_id, "a")) == "1: a"
    assert two.delete(f"/agents/{agent_id}/sessions", json={"ids": [session_id]}).json["code"] == 0

    def left() -> tuple[int, int, int]:  # the session's rows (its states and messages go when it is swept)
        with one.app.app_context():
            return (
                Session.select().where(Session.id == session_id).count(),
                SessionSnapshot.select().where(SessionSnapshot.session_id == session_id).count(),
                MessageLog.select().where(MessageLog.session_id == session_id).count(),
            )

    before = left()
    gone = one.ask(agent_id, session_id, "b")
    assert gone.status_code == 404, gone.json
    assert before[0] == 0 and left() == before


def test_a_turn_on_the_row_kept_here_is_busy_while_another_worker_holds_the_lease(app_factory, llm):
    one = make_api(app_factory, llm)
    two = Api(make_api(app_factory, llm).app, one.token)
    agent_id = one.create_agent(dsl_of({"TestTicker:T": ("TestTicker", {}, [])}))
    session_id = one.create_session(agent_id)
    one.app.config["SERVICES"]["gate"].set()
    assert said(one.ask(agent_id, session_id, "x")) == "tick "
    before = stored(one, session_id)

    chunks = held_turn(two, agent_id, session_id)
    next(chunks)  # the turn has started: it holds the lease
    try:
        busy = one.ask(agent_id, session_id, "y")
        assert busy.status_code == 409, busy.json
        assert stored(one, session_id) == before
    finally:
        two.app.config["SERVICES"]["gate"].set()
        b"".join(chunks)
        two.app.extensions["agentcanvas.turns"].wait_idle(30)
    assert said(one.ask(agent_id, session_id, "z")) == "tick "
    texts = [text for _, text in stored(one, session_id)[1]["history"]]
    # The other worker's turn ticked while it waited; the refused "y" is nowhere.
    assert texts[:3] == ["x", "tick ", "long"] and texts[4:] == ["z", "tick "] and len(texts) == 6


@pytest.mark.parametrize("name", ["intake_form", "counter", "planner", "keyed memory"])
def test_the_row_kept_with_a_canvas_is_the_row_the_database_holds(app_factory, llm, name):
    """What a turn runs on unread is exactly what it would have read: after every turn the
    row kept with the session's canvas equals the session row (version, round, state
    slot, pending form, transcript bytes, update mark...)."""
    from api.services import turns

    api = make_api(app_factory, llm)
    dsl, script = SCRIPTS[name]()
    agent_id = api.create_agent(dsl)
    session_id = api.create_session(agent_id, user_id="u1")
    compared = 0
    for n, body in enumerate(script):
        random.seed(n)
        api.post(f"/agents/{agent_id}/completions", json={**body, "session_id": session_id})
        entry = cache_of(api)._entries.get(session_id)  # looked at, not taken
        if entry is None or entry[3] is None:
            continue
        (tenant, agent, end_user), kept_row = entry[3]
        assert (agent, end_user) == (agent_id, None)
        with api.app.app_context():
            read = turns._READ_SESSION.row(id=session_id, agent=agent_id, tenant=tenant, user=None)
        assert kept_row._replace(snapshot=None) == turns._SessionRow(*read)._replace(snapshot=None), body
        compared += 1
    assert compared >= len(script) // 2


def test_the_row_kept_by_a_first_message_is_the_row_it_made(app_factory, llm):
    """A first message (no session id) makes its session in its commit: the next turn
    runs on the row that commit wrote, unread, and it is the row the database holds."""
    from api.services import turns

    api = make_api(app_factory, llm)
    agent_id = api.create_agent(sample("intake_form"))
    first = api.ask(agent_id, None, "hi").json["data"]
    session_id = first["session_id"]
    assert first["event"] == "user_inputs"
    (tenant, _, _), kept_row = cache_of(api)._entries[session_id][3]
    with api.app.app_context():
        read = turns._READ_SESSION.row(id=session_id, agent=agent_id, tenant=tenant, user=None)
    assert kept_row._replace(snapshot=None) == turns._SessionRow(*read)._replace(snapshot=None)
    assert "Thanks Ann!" in said(api.ask(agent_id, session_id, "", inputs=FORM))
    assert cache_of(api).hits == 1
