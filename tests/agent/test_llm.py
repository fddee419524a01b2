"""The LLM component through the test LLM server: streaming, usage, retries, errors,
structured output, settings and keeping the API key secret."""

from __future__ import annotations

import json

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError, LLMConfigError
from agent.llm.config import resolve_model
from tests.agent.dsl_helpers import answer, final, finished_nodes, make_dsl, node, run
from tests.llm_server import API_KEY, LLMServer, error, text


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def chat(llm: LLMServer, params: dict | None = None, message: str = "{LLM:A@content}", **settings) -> Canvas:
    """Begin → LLM:A → Message:Out showing ``message``."""
    dsl = make_dsl(
        node("LLM:A", "LLM", {"sys_prompt": "You are terse.", **(params or {})}),
        node("Message:Out", "Message", {"content": [message]}),
    )
    return Canvas(dsl, services={"llm_settings": llm.settings(**settings)})


def messages(events: list[dict]) -> list[str]:
    return [e["data"]["content"] for e in events if e["event"] == "message"]


def test_streamed_answer_arrives_as_ordered_chunks_that_join_to_the_content(llm):
    llm.queue(text("one two three four five"))
    events = run(chat(llm), "count")
    chunks = messages(events)
    assert chunks == ["one ", "two ", "three ", "four ", "five"]
    assert final(events)["status"] == "succeeded"
    end = next(e for e in events if e["event"] == "message_end")
    assert end["data"]["content"] == "".join(chunks)
    body = llm.chat_requests()[0]
    assert body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "count"},
    ]


def test_text_around_a_streamed_answer_goes_out_before_and_after_its_chunks(llm):
    llm.queue(text("one two"))
    events = run(
        chat(llm, message="Answer: {LLM:A@content} ({sys.query}, {sys.user_id})"), "count", user_id="u"
    )
    assert messages(events) == ["Answer: ", "one ", "two", " (count, u)"]


def test_answer_is_read_whole_when_no_message_streams_it(llm):
    dsl = make_dsl(
        node("LLM:A", "LLM", {"prompts": [{"role": "user", "content": "Shout {sys.query}"}]}),
        node("LLM:B", "LLM", {"prompts": "Repeat: {LLM:A@content}"}),
        node("Message:Out", "Message", {"content": ["The model said: {LLM:B@content}!"]}),
    )
    llm.queue(text("HELLO"), text("HELLO AGAIN"))
    events = run(Canvas(dsl, services={"llm_settings": llm.settings()}), "hello")
    assert answer(events) == "The model said: HELLO AGAIN!"
    first, second = llm.chat_requests()
    assert first.get("stream") in (None, False)  # A's answer is read whole for B's prompt
    assert second["stream"] is True  # B's answer streams through the Message
    assert second["messages"][-1]["content"] == "Repeat: HELLO"
    node_data = finished_nodes(events)["LLM:A"]
    assert node_data["outputs"]["content"] == "HELLO"
    assert node_data["inputs"]["prompt"] == "Shout hello"


def test_usage_is_reported_per_node_and_summed_per_turn(llm):
    dsl = make_dsl(
        node("LLM:A", "LLM", {}),
        node("LLM:B", "LLM", {"prompts": "again: {LLM:A@content}"}),
        node("Message:Out", "Message", {"content": ["{LLM:B@content}"]}),
    )
    a_usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    b_usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    llm.queue(text("first", usage=a_usage), text("second", usage=b_usage))
    events = run(Canvas(dsl, services={"llm_settings": llm.settings()}), "go")
    assert finished_nodes(events)["LLM:A"]["usage"] == a_usage
    expected = {"prompt_tokens": 16, "completion_tokens": 10, "total_tokens": 26}
    assert final(events)["usage"] == expected
    end = next(e for e in events if e["event"] == "message_end")
    assert end["data"]["usage"] == expected


def test_usage_is_estimated_when_the_provider_reports_none(llm):
    llm.queue(text("a short answer", no_usage=True))
    events = run(chat(llm, message="{LLM:A@content}."), "question")
    usage = final(events)["usage"]
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_429_is_retried_with_the_configured_backoff_then_succeeds(llm):
    canvas = chat(llm, retry_backoff_seconds=0.25, retry_max_backoff_seconds=10)
    waits: list[float] = []
    canvas.sleep = waits.append
    llm.queue(error(429), error(503), text("finally"))
    events = run(canvas, "hi")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "finally"
    assert waits == [0.25, 0.5]
    assert len(llm.chat_requests()) == 3


def test_retry_after_header_sets_the_wait(llm):
    canvas = chat(llm, retry_backoff_seconds=5, retry_max_backoff_seconds=5)
    waits: list[float] = []
    canvas.sleep = waits.append
    llm.queue(error(429, retry_after_ms=30), text("ok"))
    assert answer(run(canvas, "hi")) == "ok"
    assert waits == [pytest.approx(0.03)]


def test_server_errors_after_the_last_retry_fail_the_turn_with_llm_error(llm):
    canvas = chat(llm, max_retries=1)
    llm.queue(error(500, "the model crashed"), error(500, "the model crashed"))
    events = run(canvas, "hi")
    data = final(events)
    assert data["status"] == "failed"
    assert data["error_type"] == "LLMError"
    assert "LLM:A" in data["error"] and "HTTP 500" in data["error"] and "the model crashed" in data["error"]
    assert len(llm.chat_requests()) == 2


def test_client_errors_are_not_retried(llm):
    llm.queue(error(400, "unknown parameter"))
    data = final(run(chat(llm), "hi"))
    assert data["status"] == "failed" and "HTTP 400" in data["error"] and "unknown parameter" in data["error"]
    assert len(llm.chat_requests()) == 1


def test_a_slow_provider_fails_with_llm_timeout(llm):
    llm.queue(text("too late", delay=2))
    data = final(run(chat(llm, timeout_seconds=0.3), "hi"))
    assert data["status"] == "failed"
    assert data["error_type"] == "LLMTimeout"
    assert "0.3 s" in data["error"]
    assert len(llm.chat_requests()) == 1  # a timeout is not retried


def test_a_stream_that_stalls_fails_with_llm_timeout(llm):
    llm.queue(text("a b c d e f", stall_after=2, stall=2))
    events = run(chat(llm, timeout_seconds=0.3), "hi")
    assert final(events)["error_type"] == "LLMTimeout"


def test_a_stream_cut_midway_fails_the_turn_and_remembers_nothing(llm):
    canvas = chat(llm)
    llm.queue(text("a complete first answer"))
    run(canvas, "first")
    before = json.loads(str(canvas))
    llm.queue(text("a b c d e f", drop_after=3))
    events = run(canvas, "second")
    data = final(events)
    assert data["status"] == "failed" and data["error_type"] == "LLMError"
    assert "before the answer was complete" in data["error"]
    after = json.loads(str(canvas))
    assert after["memory"] == before["memory"] and after["history"] == before["history"]


def test_unreachable_provider_is_a_clear_error(llm):
    dsl = make_dsl(node("LLM:A", "LLM", {}), node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}))
    settings = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key": "k", "max_retries": 0}
    data = final(run(Canvas(dsl, services={"llm_settings": settings}), "hi"))
    assert (
        data["status"] == "failed"
        and "could not be reached" in data["error"]
        and "127.0.0.1:9" in data["error"]
    )


def test_no_provider_configured_names_the_settings_to_add():
    dsl = make_dsl(node("LLM:A", "LLM", {}), node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}))
    data = final(run(Canvas(dsl, services={"llm_settings": {}}), "hi"))
    assert data["status"] == "failed"
    assert data["error_type"] == "LLMConfigError"
    assert "LLM:A" in data["error"] and "AGENTCANVAS_LLM_BASE_URL" in data["error"]


def test_the_api_key_reaches_the_provider_but_never_the_snapshot_or_events(llm):
    canvas = chat(llm)
    events = run(canvas, "hi")
    assert llm.requests[-1]["headers"]["authorization"] == f"Bearer {API_KEY}"
    llm.queue(error(401, f"invalid key {API_KEY}"))
    events += run(canvas, "again")
    assert final(events)["status"] == "failed"
    for blob in (str(canvas), json.dumps(events)):
        assert API_KEY not in blob
    assert "***" in final(events)["error"]


def test_structured_output_is_parsed_and_referenced_downstream(llm):
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}}},
    }
    dsl = make_dsl(
        node("LLM:X", "LLM", {"output_structure": schema}),
        node("Message:Out", "Message", {"content": ["{LLM:X@structured.title}: {LLM:X@structured.items.1}"]}),
    )
    llm.queue(text('```json\n{"title": "Groceries", "items": ["milk", "eggs"]}\n```'))
    events = run(Canvas(dsl, services={"llm_settings": llm.settings()}), "list")
    assert answer(events) == "Groceries: eggs"
    assert finished_nodes(events)["LLM:X"]["outputs"]["structured"] == {
        "title": "Groceries",
        "items": ["milk", "eggs"],
    }
    sent = llm.chat_requests()[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["schema"] == schema


def test_ragflow_outputs_structured_schema_is_used(llm):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    dsl = make_dsl(
        node("LLM:X", "LLM", {"outputs": {"structured": schema}}),
        node("Message:Out", "Message", {"content": ["n={LLM:X@structured.n}"]}),
    )
    events = run(Canvas(dsl, services={"llm_settings": llm.settings()}), "x")
    assert answer(events) == "n=1"  # the server's default answer fits the schema


def test_structured_answer_that_is_not_json_fails_clearly(llm):
    dsl = make_dsl(
        node(
            "LLM:X", "LLM", {"output_structure": {"type": "object", "properties": {"a": {"type": "string"}}}}
        ),
        node("Message:Out", "Message", {"content": ["{LLM:X@structured.a}"]}),
    )
    llm.queue(text("Sure! Here it is: a = 1"))
    data = final(run(Canvas(dsl, services={"llm_settings": llm.settings()}), "x"))
    assert data["status"] == "failed" and "not the JSON" in data["error"] and "LLM:X" in data["error"]


def test_sampling_options_follow_their_enabled_flags(llm):
    params = {
        "temperature": 0.3,
        "temperatureEnabled": True,
        "top_p": 0.9,
        "topPEnabled": False,
        "max_tokens": 64,
        "maxTokensEnabled": True,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.2,
        "frequencyPenaltyEnabled": False,
    }
    run(chat(llm, params), "hi")
    body = llm.chat_requests()[0]
    assert body["temperature"] == 0.3 and body["max_tokens"] == 64
    assert body["presence_penalty"] == 0.5  # no flag: sent because it is set
    assert "top_p" not in body and "frequency_penalty" not in body


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"message_history_window_size": 101}, "message_history_window_size"),
        ({"prompts": []}, "prompts"),
        ({"prompts": [{"role": "robot", "content": "x"}]}, "robot"),
        ({"history_source": "everything"}, "history_source"),
        ({"llm_id": 5}, "llm_id"),
    ],
)
def test_bad_params_are_dsl_errors_naming_the_node(params, fragment):
    with pytest.raises(DSLError) as e:
        Canvas(make_dsl(node("LLM:A", "LLM", params)))
    assert "LLM:A" in str(e.value) and fragment in str(e.value)


def test_prompts_render_the_sys_globals(llm):
    template = (
        "q={sys.query} u={sys.user_id} turns={sys.conversation_turns} dc={sys.dialogue_count} "
        "cid={sys.conversation_id} aid={sys.agent_id} mid={sys.message_id} from={sys.invoke_from} "
        "date={sys.date} files={sys.files} history={sys.history}"
    )
    canvas = chat(llm, {"prompts": template}, message="{LLM:A@content}")
    run(canvas, "first", user_id="u7", conversation_id="s1", agent_id="a1", invoke_from="embed")
    events = run(canvas, "second", user_id="u7", files=["f.txt"], message_id="m2")
    prompt = llm.chat_requests()[-1]["messages"][-1]["content"]
    assert "q=second u=u7 turns=2 dc=2 cid=s1 aid=a1 mid=m2 from=embed" in prompt
    assert 'files=["f.txt"]' in prompt
    assert '"content": "first"' in prompt and "date=20" in prompt
    assert all(e["message_id"] == "m2" for e in events)


def test_provider_resolution():
    settings = {
        "default_provider": "local",
        "providers": [
            {"name": "local", "base_url": "http://l/v1", "models": [{"name": "small", "context_size": 4096}]},
            {
                "name": "big",
                "base_url": "http://b/v1",
                "api_key_env": "BIG_KEY",
                "models": [{"name": "huge"}],
            },
        ],
    }
    env = {"BIG_KEY": "secret"}
    m = resolve_model("", settings, env)
    assert (m.provider, m.model, m.context_size) == ("local", "small", 4096)
    m = resolve_model("huge@big", settings, env)
    assert (m.provider, m.model, m.api_key) == ("big", "huge", "secret")
    assert "secret" not in repr(m)
    m = resolve_model("deepseek-chat@DeepSeek", settings, env)  # a provider we do not have
    assert (m.provider, m.model) == ("local", "small")
    m = resolve_model("other@local", settings, env)
    assert (m.model, m.context_size) == ("other", None)
    with pytest.raises(LLMConfigError, match="BIG_KEY"):
        resolve_model("huge@big", settings, {})
    with pytest.raises(LLMConfigError, match="'nope'"):
        resolve_model("", {**settings, "default_provider": "nope"}, env)
    with pytest.raises(LLMConfigError, match="api_key_env"):
        resolve_model("", {"providers": [{"name": "x", "base_url": "http://x", "api_key": "k"}]}, env)
    env_only = resolve_model(
        "", {"base_url": "http://e/v1", "model": "m", "api_key": "k", "context_size": 8000}
    )
    assert (env_only.provider, env_only.model, env_only.context_size) == ("default", "m", 8000)
    with pytest.raises(LLMConfigError, match="AGENTCANVAS_LLM_MODEL"):
        resolve_model("", {"base_url": "http://e/v1"})


def test_environment_alone_configures_the_default_provider(llm, monkeypatch):
    from agent.settings import load_settings

    monkeypatch.setenv("AGENTCANVAS_LLM_BASE_URL", llm.url)
    monkeypatch.setenv("AGENTCANVAS_LLM_MODEL", "env-model")
    monkeypatch.setenv("AGENTCANVAS_LLM_API_KEY", "env-key-123")
    monkeypatch.setenv("AGENTCANVAS_LLM_CONTEXT_SIZE", "4096")
    assert resolve_model("", load_settings()["llm"]).context_size == 4096
    dsl = make_dsl(node("LLM:A", "LLM", {}), node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}))
    events = run(Canvas(dsl), "from env")  # no llm_settings service: load_settings() is used
    assert answer(events) == "echo: from env"
    assert llm.chat_requests()[0]["model"] == "env-model"
    assert llm.requests[0]["headers"]["authorization"] == "Bearer env-key-123"


def test_a_transport_timeout_at_the_deadline_names_the_limit_that_ran_out():
    """The request's timeout is the time the wait has left, so under load the transport can
    give up a hair before the deadline itself: the error must still name the limit that ran
    out (the turn's ``max_seconds``, else ``llm.timeout_seconds``), not always the latter.
    (Seen in CI: a Retrieval turn with max_seconds=1 answered 'did not answer within 10 s'.)"""
    from agent.deadline import Deadline, raise_if_spent
    from agent.errors import ComponentTimeout, DeadlineExceeded

    with pytest.raises(DeadlineExceeded, match="max_seconds"):
        raise_if_spent(Deadline(0.05).within(10, "llm.timeout_seconds"))
    with pytest.raises(ComponentTimeout, match="llm.timeout_seconds"):
        raise_if_spent(Deadline(60).within(0.05, "llm.timeout_seconds"))
    raise_if_spent(Deadline(60).within(10, "llm.timeout_seconds"))  # far from its end: a connect timeout
