"""What the runtime reports about itself: spans, and LLM calls for whoever counts them.

Spans go through the OpenTelemetry API. With no SDK configured (the library default)
they are no-ops that cost a function call; a process that configures a tracer
provider with an exporter (the server does when ``OTEL_TRACES_EXPORTER`` or
``AGENTCANVAS_TRACES_EXPORTER`` is set, see :mod:`api.telemetry`) gets a span per
node (``node <component id>``) and per LLM call (``llm.chat``), nested in the turn's.

LLM calls are also told to the callables registered with :func:`observe_llm_calls`
(the server counts tokens and errors in its metrics); ``agent`` stays free of any
metrics library and of ``api``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

tracer = trace.get_tracer("agentcanvas")
# OpenTelemetry keeps the provider set in code in this module global (see tracing_enabled).
_READ_GLOBAL = hasattr(trace, "_TRACER_PROVIDER") and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ

#: ``observer(provider, model, usage or None, error or None)`` per finished LLM call.
LLMObserver = Callable[[str, str, "dict | None", "BaseException | None"], None]
_llm_observers: list[LLMObserver] = []


def observe_llm_calls(observer: LLMObserver) -> None:
    """Call ``observer`` at the end of every LLM call of this process (once per observer)."""
    if observer not in _llm_observers:
        _llm_observers.append(observer)


def tracing_enabled() -> bool:
    """Whether this process installed a tracer provider (before that, spans record nothing).

    Asked on every turn and run. ``trace.get_tracer_provider()`` looks up the
    environment each time (a ``KeyError`` raised and caught while no provider is
    set), so OpenTelemetry's global is read directly when it exists; a provider named
    by ``OTEL_PYTHON_TRACER_PROVIDER`` (built on first use) takes the long way.
    """
    if _READ_GLOBAL:
        provider = getattr(trace, "_TRACER_PROVIDER", None)
        if provider is None:
            return False
    else:
        provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def node_span(component_id: str, component_type: str) -> contextlib.AbstractContextManager:
    """The span of one component run (current while it runs, so LLM calls nest in it).

    Nothing at all while tracing is off: even a no-op span, made current, costs a
    turn of a few components more than its database read.
    """
    if not tracing_enabled():
        return contextlib.nullcontext()
    return tracer.start_as_current_span(
        f"node {component_id}",
        attributes={"agentcanvas.component_id": component_id, "agentcanvas.component_type": component_type},
        record_exception=False,
        set_status_on_exception=False,
    )


class LLMCall:
    """One call to a provider, from its request to its last chunk (:meth:`finish`)."""

    def __init__(self, provider: str, model: str, streamed: bool):
        self.provider = provider
        self.model = model
        self._done = False
        self.span = tracer.start_span(
            "llm.chat",
            attributes={
                "gen_ai.system": provider or "default",
                "gen_ai.request.model": model,
                "agentcanvas.llm.streamed": streamed,
            },
        )

    def finish(self, usage: dict | None = None, error: BaseException | None = None) -> None:
        """End the call (once): its usage or its error go to the span and the observers."""
        if self._done:
            return
        self._done = True
        if usage:
            self.span.set_attribute("gen_ai.usage.input_tokens", int(usage.get("prompt_tokens") or 0))
            self.span.set_attribute("gen_ai.usage.output_tokens", int(usage.get("completion_tokens") or 0))
        if error is not None:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
            self.span.set_attribute("error.type", type(error).__name__)
        self.span.end()
        for observer in list(_llm_observers):
            with contextlib.suppress(Exception):  # a broken observer never fails a turn
                observer(self.provider, self.model, usage, error)


def llm_call(provider: str, model: str, streamed: bool) -> LLMCall:
    return LLMCall(provider, model, streamed)


def current_trace_ids() -> dict[str, Any]:
    """``{trace_id, span_id}`` of the current span as hex, or ``{}`` when none records."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}
