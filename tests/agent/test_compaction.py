"""Compaction (docs/design.md §15): what an LLM node's window drops is summarised, within budget."""

from __future__ import annotations

import json

import pytest

from agent.canvas import Canvas
from agent.compaction import SUMMARY_INTRO, clear_old_tool_results, parse_setting
from agent.errors import DSLError
from agent.llm.tokens import count_tokens, messages_tokens
from tests.agent.dsl_helpers import answer, make_dsl, node, run
from tests.llm_server import LLMServer, error, text

CONTEXT = 400
MAX_TOKENS = 100


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def chat_dsl(**params) -> dict:
    return make_dsl(
        node("LLM:A", "LLM", {"sys_prompt": "Be brief.", "max_tokens": MAX_TOKENS, **params}),
        node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}),
    )


def canvas_for(llm: LLMServer, **params) -> Canvas:
    settings = llm.settings(context_size=CONTEXT)
    return Canvas(chat_dsl(**params), services={"llm_settings": settings})


def is_summary_call(request: dict) -> bool:
    return request["messages"][0]["content"].startswith("You keep a running summary")


def answer_calls(llm: LLMServer) -> list[dict]:
    return [r for r in llm.chat_requests() if not is_summary_call(r)]


def test_a_200_turn_conversation_stays_within_budget_and_carries_the_summary(llm):
    canvas = canvas_for(llm, compaction={"max_summary_tokens": 120}, message_history_window_size=100)
    for i in range(200):
        # Each question is long enough that the 100-message window does not fit the budget.
        run(canvas, f"turn {i}: the quick brown fox")

    calls = answer_calls(llm)
    assert len(calls) == 200
    for request in calls:
        assert messages_tokens(request["messages"]) <= CONTEXT - MAX_TOKENS
    with_summary = [r for r in calls if any(m["content"].startswith(SUMMARY_INTRO) for m in r["messages"])]
    assert with_summary and with_summary[-1] is calls[-1]
    summary = next(m for m in calls[-1]["messages"] if m["content"].startswith(SUMMARY_INTRO))
    assert count_tokens(summary["content"][len(SUMMARY_INTRO) :]) <= 120
    # The summary sits between the system prompt and the history.
    assert [m["role"] for m in calls[-1]["messages"][:2]] == ["system", "system"]
    summaries = [r for r in llm.chat_requests() if is_summary_call(r)]
    # Compaction keeps half a window free, so it is not a second call per turn.
    assert 0 < len(summaries) < 50
    assert all(r["max_tokens"] == 120 for r in summaries)
    # Its cost is in the usage; memory holds the summary and a bounded tail.
    snapshot = json.loads(str(canvas))
    assert snapshot["memory"]["LLM:A#summary"][0]["content"]
    assert len(snapshot["memory"]["LLM:A"]) < 100


def test_summary_usage_is_counted(llm):
    canvas = canvas_for(llm, compaction=True, message_history_window_size=2)
    run(canvas, "one")
    run(canvas, "two")
    events = run(canvas, "three")
    summaries = [r for r in llm.chat_requests() if is_summary_call(r)]
    assert len(summaries) == 1
    finished = events[-1]["data"]
    # The test server counts words: the summary call's words are in the turn's usage.
    one_call = sum(len(m["content"].split()) for m in llm.chat_requests()[-1]["messages"])
    assert finished["usage"]["prompt_tokens"] > one_call


def test_a_failed_summary_call_makes_no_summary(llm):
    canvas = canvas_for(llm, compaction=True, message_history_window_size=2)
    run(canvas, "one")
    run(canvas, "two")
    llm.queue(error(400, "no summary today"), text("still answered"))
    events = run(canvas, "three")
    assert answer(events) == "still answered"
    memory = json.loads(str(canvas))["memory"]
    assert "LLM:A#summary" not in memory
    assert [e["content"] for e in memory["LLM:A"]][-2:] == ["three", "still answered"]
    assert len(memory["LLM:A"]) == 6
    # The next turn tries again, and succeeds.
    run(canvas, "four")
    assert json.loads(str(canvas))["memory"]["LLM:A#summary"][0]["content"]


@pytest.mark.parametrize(
    "value, message",
    [
        ("yes", "compaction must be true, false"),
        ({"max_summary_tokens": 0}, "from 1 to"),
        ({"max_tokens": 5}, "only 'max_summary_tokens'"),
    ],
)
def test_bad_compaction_settings_are_load_errors(value, message):
    with pytest.raises(DSLError, match=message):
        Canvas(chat_dsl(compaction=value))


def test_compaction_needs_the_nodes_own_memory():
    with pytest.raises(DSLError, match="memory_key"):
        Canvas(chat_dsl(compaction=True, memory_key="{sys.user_id}"))
    assert parse_setting(True) == 500 and parse_setting(False) is None


def test_old_tool_results_are_cleared_first():
    big = "data " * 400
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "1", "content": big},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "2", "content": big},
    ]
    cleared = clear_old_tool_results(messages, 600)
    assert cleared == 1
    assert messages[3]["content"].startswith("[tool result cleared")
    assert messages[5]["content"] == big  # the latest round's result stays
