"""Component types for the API tests only: they block, tick or fail on demand.

They read what they need from ``canvas.services`` (the app's ``SERVICES``), so a test
controls a turn that runs in the server's worker thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.errors import LLMError, LLMTimeout


class _Param(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.error = "LLMError"


@register
class TestGate(ComponentBase):
    """Streams ``"started "``, waits for ``services["gate"]`` to open, then ``"released"``."""

    component_name = "TestGate"
    param_class = _Param

    def _invoke(self, **kwargs) -> Iterator[str]:
        gate = self._canvas.services["gate"]

        def chunks() -> Iterator[str]:
            yield "started "
            gate.wait(30)
            yield "released"

        return chunks()


#: Set when a TestPureGate starts waiting.
PURE_GATE_ENTERED = threading.Event()


@register
class TestPureGate(ComponentBase):
    """Sets :data:`PURE_GATE_ENTERED`, then waits for ``services["gate"]`` to open; declared
    side-effect-free, so a turn runs it before taking the lease (a window to race the
    turn's unleased commit)."""

    component_name = "TestPureGate"
    param_class = _Param
    side_effect_free = True

    def _invoke(self, **kwargs) -> None:
        PURE_GATE_ENTERED.set()
        self._canvas.services["gate"].wait(30)
        self.set_output("content", "")


@register
class TestTicker(ComponentBase):
    """Streams ``"tick "`` until the run is cancelled or ``services["gate"]`` opens (at most 3000)."""

    component_name = "TestTicker"
    param_class = _Param

    def _invoke(self, **kwargs) -> Iterator[str]:
        gate = self._canvas.services["gate"]

        def chunks() -> Iterator[str]:
            for _ in range(3000):
                yield "tick "
                if gate.is_set():
                    return
                time.sleep(0.01)

        return chunks()


@register
class TestFail(ComponentBase):
    """Fails like an LLM provider would: ``error`` is ``LLMError`` or ``LLMTimeout``."""

    component_name = "TestFail"
    param_class = _Param

    def _invoke(self, **kwargs) -> None:
        if self._param.error == "LLMTimeout":
            raise LLMTimeout(f"{self.id}: the provider did not answer within 30 s")
        raise LLMError(f"{self.id}: the provider answered HTTP 503")
