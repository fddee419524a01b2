"""One retry loop at component level (issue 8 point 10): ``max_retries=2`` is 3 attempts.

Whether a failure comes from the component's call or from its stream before the
first chunk, it is the same loop that retries it; the LLM client's own retries of
HTTP 429/5xx are a separate, documented layer below it.
"""

from __future__ import annotations

from collections.abc import Iterator

from agent.canvas import Canvas
from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.errors import ComponentError
from tests.agent.dsl_helpers import final, make_dsl, node, run
from tests.llm_server import LLMServer, error


@register
class FlakyStream(ComponentBase):
    """Fails on every call: odd calls raise, even calls return a stream that fails at once.

    Counts its calls in ``canvas.services["calls"]``.
    """

    component_name = "TestFlakyStream"
    param_class = ComponentParamBase

    def _invoke(self, **kwargs) -> Iterator[str]:
        calls = self._canvas.services["calls"]
        calls.append(len(calls) + 1)
        if len(calls) % 2:
            raise ComponentError(f"{self.id}: call {len(calls)} failed")

        def broken() -> Iterator[str]:
            raise ComponentError(f"{self.id}: the stream of call {len(calls)} failed")
            yield ""

        return broken()


def test_max_retries_2_means_3_attempts_however_the_attempts_fail():
    calls: list[int] = []
    canvas = Canvas(
        make_dsl(node("TestFlakyStream:X", "TestFlakyStream", {"max_retries": 2, "delay_after_error": 7})),
        services={"calls": calls},
    )
    slept: list[float] = []
    canvas.sleep = slept.append
    ending = final(run(canvas, "go"))
    assert ending["status"] == "failed" and "call 3 failed" in ending["error"]
    assert calls == [1, 2, 3]
    assert slept == [7, 7]


def test_the_llm_clients_own_retries_are_a_separate_layer():
    """max_retries=2 on the node (3 attempts) × llm.max_retries=1 (2 requests each)."""
    with LLMServer() as llm:
        llm.queue(*[error(500)] * 10)
        dsl = make_dsl(
            node("LLM:A", "LLM", {"max_retries": 2, "delay_after_error": 0}),
            node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}),
        )
        canvas = Canvas(dsl, services={"llm_settings": llm.settings(max_retries=1)})
        ending = final(run(canvas, "go"))
        assert "answered HTTP 500 after 2 attempts" in ending["error"]
        assert len(llm.chat_requests()) == 6
