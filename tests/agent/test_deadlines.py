"""Every wait of a turn obeys the turn's deadline and cancel (docs/design.md §11, issue 8 point 2).

Against real servers on 127.0.0.1: an HTTP endpoint that sends one byte every half
second (a client whose timeout restarts with each byte would wait minutes), and the
test LLM server stalling a stream or delaying its headers. The bounds on elapsed time
below are far from the far side's minutes: they tell "stopped" from "waited it out".
"""

from __future__ import annotations

import threading
import time

import pytest

from agent.canvas import Canvas, Limits
from agent.deadline import Deadline, iterate
from agent.errors import DeadlineExceeded
from tests.agent.dsl_helpers import final, make_dsl, node, run
from tests.drip_server import DripServer
from tests.llm_server import LLMServer, text

LOCAL = {"allow_hosts": ["127.0.0.1"], "timeout_seconds": 30, "max_response_bytes": 4096}
#: Far less than the minutes the far side would hold a turn; far more than a stop takes.
STOPPED_WITHIN = 8


@pytest.fixture
def drip():
    with DripServer(interval=0.5) as server:
        yield server


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def invoke_canvas(url: str, max_seconds: float = 600, **params) -> Canvas:
    dsl = make_dsl(
        node("Invoke:Call", "Invoke", {"url": url, **params}),
        node("Message:Out", "Message", {"content": ["{Invoke:Call@result}"]}),
    )
    return Canvas(dsl, limits=Limits(max_seconds=max_seconds), services={"invoke": LOCAL})


def timed_run(canvas: Canvas, cancel_after: float | None = None) -> tuple[dict, float]:
    if cancel_after is not None:
        flag = threading.Event()
        threading.Timer(cancel_after, flag.set).start()
        canvas.cancel_check = flag.is_set
    started = time.monotonic()
    events = run(canvas, "go")
    return final(events), time.monotonic() - started


def test_a_dripping_answer_is_cut_at_the_component_timeout(drip):
    ending, took = timed_run(invoke_canvas(drip.url, timeout=1))
    assert ending["status"] == "failed"
    assert "Invoke:Call: '127.0.0.1' did not answer within 1 s (timeout)" in ending["error"]
    assert took < STOPPED_WITHIN
    drip.wait_closed()


def test_a_dripping_answer_is_cut_at_the_turns_max_seconds(drip):
    ending, took = timed_run(invoke_canvas(drip.url, max_seconds=1, timeout=60))
    assert ending["status"] == "failed"
    assert ending["error"] == "the turn ran longer than 1 s (limit max_seconds)"
    assert took < STOPPED_WITHIN


def test_a_cancel_stops_a_dripping_call(drip):
    ending, took = timed_run(invoke_canvas(drip.url, timeout=60), cancel_after=0.5)
    assert ending["status"] == "cancelled"
    assert took < STOPPED_WITHIN
    drip.wait_closed()


def test_a_cancel_stops_the_pause_between_retries():
    canvas = invoke_canvas("http://127.0.0.1:9/", max_retries=2, delay_after_error=120)
    ending, took = timed_run(canvas, cancel_after=0.5)
    assert ending["status"] == "cancelled"
    assert took < STOPPED_WITHIN


def test_a_retry_pause_longer_than_the_turn_ends_at_max_seconds():
    canvas = invoke_canvas("http://127.0.0.1:9/", max_seconds=1, max_retries=2, delay_after_error=120)
    ending, took = timed_run(canvas)
    assert ending["error"] == "the turn ran longer than 1 s (limit max_seconds)"
    assert took < STOPPED_WITHIN


def llm_canvas(llm: LLMServer, max_seconds: float, **settings) -> Canvas:
    dsl = make_dsl(
        node("LLM:A", "LLM", {"prompts": [{"role": "user", "content": "{sys.query}"}]}),
        node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}),
    )
    return Canvas(
        dsl, limits=Limits(max_seconds=max_seconds), services={"llm_settings": llm.settings(**settings)}
    )


def test_a_stalled_llm_stream_ends_at_max_seconds(llm):
    llm.queue(text("one two three four", stall_after=2, stall=120))
    ending, took = timed_run(llm_canvas(llm, max_seconds=1.5))
    assert ending["status"] == "failed"
    assert ending["error"] == "the turn ran longer than 1.5 s (limit max_seconds)"
    assert took < STOPPED_WITHIN


def test_an_llm_that_holds_its_headers_ends_at_max_seconds(llm):
    llm.queue(text("late", delay=120))
    ending, took = timed_run(llm_canvas(llm, max_seconds=1))
    assert ending["error"] == "the turn ran longer than 1 s (limit max_seconds)"
    assert took < STOPPED_WITHIN


def test_a_cancel_stops_a_stalled_llm_stream(llm):
    llm.queue(text("one two three four", stall_after=2, stall=120))
    ending, took = timed_run(llm_canvas(llm, max_seconds=600), cancel_after=0.5)
    assert ending["status"] == "cancelled"
    assert took < STOPPED_WITHIN


def test_an_llm_stream_pausing_longer_than_its_timeout_fails_naming_it(llm):
    llm.queue(text("one two three four", stall_after=2, stall=120))
    ending, _ = timed_run(llm_canvas(llm, max_seconds=600, timeout_seconds=1))
    assert ending["status"] == "failed"
    assert "did not answer within 1 s (llm.timeout_seconds)" in ending["error"]


def test_a_transport_timeout_at_the_turns_end_names_the_turns_limit():
    # A stream's read timeout is the time the turn had left; the transport's error can be
    # waiting in the reader's queue a moment before the reader looks at the clock (a busy
    # machine in CI). The turn's limit ran out: that is what the error names.
    def stream():
        yield "first"
        time.sleep(0.4)
        raise TimeoutError("read timed out")

    deadline = Deadline(0.45)
    with pytest.raises(DeadlineExceeded, match=r"the turn ran longer than 0.45 s \(limit max_seconds\)"):
        for _ in iterate(deadline, stream(), idle_seconds=10, idle_limit="llm.timeout_seconds"):
            time.sleep(0.44)  # the reader is busy until just before the end


def test_a_transport_timeout_well_before_the_end_is_the_transports():
    def stream():
        raise TimeoutError("connect timed out")
        yield  # a generator

    with pytest.raises(TimeoutError, match="connect timed out"):
        list(iterate(Deadline(30), stream()))
