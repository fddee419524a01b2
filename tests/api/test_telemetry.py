"""Health, metrics and traces in one process (the several-worker case is in tests/e2e/test_telemetry.py)."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from api.db import bind_database, open_database
from tests.api.conftest import Api, dsl_of, echo_dsl, make_token
from tests.api.test_turns import _gate_agent, _rest, _start_stream
from tests.llm_server import LLMServer


def sample(client, name: str, **labels: str) -> float:
    """The value of metric sample ``name`` with ``labels`` in ``/metrics`` (0 when absent)."""
    text = client.get("/metrics").get_data(as_text=True)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_healthz_and_readyz(app):
    client = app.test_client()
    assert client.get("/healthz").json == {"status": "ok"}
    assert client.get("/readyz").json == {"status": "ok", "database": "ok"}


# On SQLite only: the test swaps the process's database handle for an unreachable one,
# and closing a server pool under the app's background threads (sweeper) is a race of
# its own (it failed once on Postgres under -n 2). What is tested is the reply, not a backend.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_readyz_answers_503_while_the_database_is_unreachable(app):
    client = app.test_client()
    # The parse threads must not be using a connection of the pool closed here.
    app.extensions["agentcanvas.parsing"].stop()
    bind_database(open_database("mysql://root@127.0.0.1:1/agentcanvas"))  # nothing listens there
    reply = client.get("/readyz")
    assert reply.status_code == 503 and reply.headers["Retry-After"]
    assert reply.json == {"status": "unavailable", "database": "not reachable"}
    assert client.get("/healthz").status_code == 200


def test_metrics_count_turns_by_outcome_busy_answers_and_leases(api: Api):
    client = api.client
    before = sample(client, "agentcanvas_turns_total", outcome="succeeded")
    seconds_before = sample(client, "agentcanvas_turn_seconds_count", outcome="succeeded")
    busy_before = sample(client, "agentcanvas_busy_total")
    agent_id = api.create_agent(echo_dsl())
    for i in range(3):
        assert api.ask(agent_id, None, f"q{i}").status_code == 200
    assert sample(client, "agentcanvas_turns_total", outcome="succeeded") == before + 3
    assert sample(client, "agentcanvas_turn_seconds_count", outcome="succeeded") == seconds_before + 3

    gate = api.app.config["SERVICES"]["gate"]
    gated = _gate_agent(api)
    session_id = api.create_session(gated)
    _, chunks, _ = _start_stream(api, gated, session_id)
    assert sample(client, "agentcanvas_leases_held") >= 1
    assert api.ask(gated, session_id, "me too").status_code == 409
    assert sample(client, "agentcanvas_busy_total") == busy_before + 1
    gate.set()
    _rest(chunks)
    api.app.extensions["agentcanvas.turns"].wait_idle(30)
    assert sample(client, "agentcanvas_leases_held") == 0


@pytest.mark.parametrize("internals", [True, False], ids=["values", "public-methods"])
def test_turn_metrics_written_directly_read_as_prometheus_clients_own(internals: bool):
    """A turn's counter and histogram children are written through their values
    (api.telemetry._turn_recorder, _counter_adder), or, where a prometheus_client
    lacks them, through inc() and observe(): /metrics reads the same either way."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from api import telemetry

    def pair() -> tuple[CollectorRegistry, Counter, Histogram, Counter]:
        registry = CollectorRegistry()
        buckets = (0.005, 0.01, 0.5, 1, 600)
        return (
            registry,
            Counter("t_total", "turns", ["outcome"], registry=registry),
            Histogram("t_seconds", "seconds", ["outcome"], buckets=buckets, registry=registry),
            Counter("c_total", "cache", ["outcome"], registry=registry),
        )

    own, turns, seconds, cache = pair()
    direct, d_turns, d_seconds, d_cache = pair()
    labelled = telemetry._Labelled(d_cache)
    children = d_turns.labels("paused"), d_seconds.labels("paused")
    if not internals:

        class Public:
            """A child with the public methods only."""

            def __init__(self, child: object):
                self.inc = getattr(child, "inc", None)
                self.observe = getattr(child, "observe", None)

        children = Public(children[0]), Public(children[1])
        labelled._children[("hit",)] = Public(d_cache.labels("hit"))
    record = telemetry._turn_recorder(*children)
    for value in (0.0, 0.001, 0.005, 0.0051, 0.01, 0.3, 1.0, 599.9, 600, 600.5, 1e12):
        turns.labels("paused").inc()
        seconds.labels("paused").observe(value)
        cache.labels("hit").inc()
        record(value)
        labelled.adder("hit")(1)

    def text(registry: CollectorRegistry) -> list[str]:  # every line but the creation times
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    assert text(direct) == text(own)
    assert 'c_total{outcome="hit"} 11.0' in text(direct)


_FORKED_COUNTS = """
import os, sys
folder = sys.argv[1]
os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
from api import telemetry
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
hits = telemetry.metrics().canvas_cache
hits.adder("hit")(1)
child = os.fork()
if child == 0:
    hits.adder("hit")(2)
    os._exit(0)
os.waitpid(child, 0)
hits.adder("hit")(4)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
print(generate_latest(registry).decode())
print(sorted(os.listdir(folder)), os.getpid(), child)
"""


def test_under_gunicorn_a_forked_worker_counts_in_its_own_file(tmp_path):
    """With PROMETHEUS_MULTIPROC_DIR each process writes its counts to a file of its own
    (the process id learnt without asking the kernel each time, api.telemetry._process_id):
    a forked process's counts start in its own file and add up with its parent's."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _FORKED_COUNTS, str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'agentcanvas_canvas_cache_total{outcome="hit"} 7.0' in out
    *_, last = out.strip().splitlines()
    files, parent, child = last.rsplit(" ", 2)
    assert f"counter_{parent}.db" in files and f"counter_{child}.db" in files


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    """Finished spans of this process, as an exporter configured by the operator would get them."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_a_turn_is_a_trace_with_a_span_per_node_and_per_llm_call(app_factory, spans):
    with LLMServer() as llm:
        app = app_factory(SETTINGS={"llm": llm.settings(max_retries=0)})
        api = Api(app, make_token(app))
        agent_id = api.create_agent(
            dsl_of(
                {
                    "LLM:Chat": ("LLM", {"sys_prompt": "Be brief."}, ["Message:Out"]),
                    "Message:Out": ("Message", {"content": ["{LLM:Chat@content}"]}, []),
                }
            )
        )
        spans.clear()
        tokens_before = sample(api.client, "agentcanvas_llm_tokens_total", kind="prompt")
        reply = api.ask(agent_id, None, "hello")
        assert reply.status_code == 200, reply.json
    finished = spans.get_finished_spans()
    turn = next(s for s in finished if s.name == "turn")
    assert turn.attributes["agentcanvas.session_id"] == reply.json["data"]["session_id"]
    assert turn.attributes["agentcanvas.outcome"] == "succeeded"
    in_turn = [s for s in finished if s.context.trace_id == turn.context.trace_id]
    by_name = {s.name: s for s in in_turn}
    assert {"node begin", "node LLM:Chat", "node Message:Out", "llm.chat"} <= set(by_name)
    assert by_name["node LLM:Chat"].parent.span_id == turn.context.span_id
    assert by_name["llm.chat"].parent.span_id == by_name["node LLM:Chat"].context.span_id
    assert by_name["llm.chat"].attributes["gen_ai.usage.input_tokens"] > 0
    assert sample(api.client, "agentcanvas_llm_tokens_total", kind="prompt") > tokens_before


def test_a_turn_writes_one_json_log_line_with_its_ids_and_trace(api: Api, spans):
    """The line each turn logs (JSON format): its session and task, and its trace ids
    when tracing is on, as the operator's log shipper reads them."""
    import io
    import json
    import logging
    import re

    from api.telemetry import JsonFormatter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("agentcanvas.turns")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        agent_id = api.create_agent(echo_dsl())
        spans.clear()
        reply = api.ask(agent_id, None, "hello")
        assert reply.status_code == 200, reply.json
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    line = next(line for line in lines if line["message"].startswith("turn succeeded in "))
    turn = next(s for s in spans.get_finished_spans() if s.name == "turn")
    assert line["session_id"] == reply.json["data"]["session_id"]
    assert line["task_id"] == reply.json["data"]["task_id"]
    assert line["trace_id"] == format(turn.context.trace_id, "032x")
    assert line["level"] == "info" and line["logger"] == "agentcanvas.turns"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])


@contextlib.contextmanager
def server_logging() -> Iterator[tuple[logging.Handler, io.StringIO]]:
    """The ``agentcanvas`` loggers as a server sets them up (JSON), writing to a text
    buffer meanwhile: ``(handler, buffer)``; the loggers as they were afterwards."""
    from api.telemetry import configure_logging

    root = logging.getLogger("agentcanvas")
    saved = (list(root.handlers), root.level, root.propagate)
    configure_logging("json", "info")
    out = io.StringIO()
    root.handlers[0].setStream(out)
    try:
        yield root.handlers[0], out
    finally:
        for old in list(root.handlers):
            root.removeHandler(old)
        for old in saved[0]:
            root.addHandler(old)
        root.setLevel(saved[1])
        root.propagate = saved[2]


def test_the_turn_line_written_directly_is_the_line_logging_writes(api: Api, spans):
    """configure_logging's handler gets the turn's line written straight to it; any other
    set-up (here a filter on the handler) goes through logging. Same line either way."""
    import json

    seen = []
    with server_logging() as (handler, out):
        agent_id = api.create_agent(echo_dsl())
        direct = api.ask(agent_id, None, "hello").json["data"]
        handler.addFilter(lambda record: seen.append(record.getMessage()) or True)
        logged = api.ask(agent_id, None, "hello").json["data"]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    turns = [line for line in lines if line["message"].startswith("turn succeeded in ")]
    assert [line["session_id"] for line in turns] == [direct["session_id"], logged["session_id"]]
    assert [line["task_id"] for line in turns] == [direct["task_id"], logged["task_id"]]
    assert list(turns[0]) == list(turns[1])  # the same fields, in the same order
    assert turns[0]["trace_id"] != turns[1]["trace_id"]
    assert {
        k: v
        for k, v in turns[0].items()
        if k not in ("time", "message", "task_id", "session_id", "trace_id", "span_id")
    } == {
        k: v
        for k, v in turns[1].items()
        if k not in ("time", "message", "task_id", "session_id", "trace_id", "span_id")
    }
    assert seen and seen[-1] == turns[1]["message"]  # the second went through logging


@pytest.mark.parametrize(
    "line",
    [
        {},
        {"message": "plain", "pid": 12, "n": -3, "none": None},
        {"message": 'quotes " and \\ back\nslash\t\x01', "é": "non-ASCII kept: ü 日本 \U0001f600"},
        {"flag": True},  # not written straight: a boolean
        {"ratio": 0.5},
        {"nested": {"a": [1, 2]}},
        {"obj": object()},  # as str(), by the json module's default
        {1: "a number for a key"},
    ],
)
def test_a_log_line_is_written_as_the_json_module_writes_it(line):
    import json

    from api.telemetry import JsonFormatter

    assert JsonFormatter.encode(line) == json.JSONEncoder(ensure_ascii=False, default=str).encode(line)


@pytest.mark.parametrize(
    "context",
    [
        None,
        {"request_id": "r-1"},
        {"session_id": "outer", "note": 'ü "x"'},
        {"message": "shadows"},
        {"n": 3.5},
    ],
)
def test_the_turn_line_without_tracing_is_the_line_made_from_its_fields(monkeypatch, context):
    """While not tracing the turn's line is written without making its fields first; the
    text is the same as from the fields (a context key that replaces a fixed field, or a
    value that is not text, is written from the fields)."""
    from api import telemetry

    monkeypatch.setattr(telemetry.agent_telemetry, "tracing_enabled", lambda: False)
    own = {"task_id": "t-1", "session_id": "s-1"}
    created = 1_764_547_200.0421
    with telemetry.log_context(**context) if context else telemetry.log_context():
        for pid in (1234, None):
            fields = telemetry._json_line(
                created, None, "info", "agentcanvas.turns", pid, "turn paused in 0.002 s", own
            )
            expected = telemetry.JsonFormatter.encode(fields)
            text = telemetry._json_line_text(
                created, "info", "agentcanvas.turns", pid, "turn paused in 0.002 s", own
            )
            assert text == expected


def test_the_turn_line_without_tracing_carries_the_turn_ids(api: Api, monkeypatch):
    import json

    from api import telemetry

    monkeypatch.setattr(telemetry.agent_telemetry, "tracing_enabled", lambda: False)
    with server_logging() as (_, out):
        agent_id = api.create_agent(echo_dsl())
        with telemetry.log_context(request_id="r-7"):
            data = api.ask(agent_id, None, "hello").json["data"]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    line = next(line for line in lines if line["message"].startswith("turn succeeded in "))
    assert list(line) == ["time", "level", "logger", "pid", "message", "request_id", "task_id", "session_id"]
    assert (line["session_id"], line["task_id"], line["request_id"]) == (
        data["session_id"],
        data["task_id"],
        "r-7",
    )
