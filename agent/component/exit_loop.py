"""ExitLoop: leave the enclosing Loop at once (RAGFlow's ExitLoop).

Placed in a Loop's body (its ``parent_id`` is the Loop, or a container nested in the
Loop's body); when reached, the run continues at the Loop's ``downstream`` and any body
branch still queued does not start another pass. An ExitLoop outside a Loop is a DSL
error. No params, no outputs.
"""

from __future__ import annotations

from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.component.loop import Loop
from agent.errors import DSLError


@register
class ExitLoop(ComponentBase):
    component_name = "ExitLoop"
    side_effect_free = True
    param_class = ComponentParamBase

    def enclosing_loop(self) -> Loop | None:
        """The nearest Loop up the ``parent_id`` chain."""
        components = self._canvas.components
        seen = set()
        pid = self.parent_id
        while pid and pid not in seen:
            seen.add(pid)
            parent = components.get(pid)
            if parent is None:
                return None
            if isinstance(parent, Loop):
                return parent
            pid = parent.parent_id
        return None

    def possible_next(self) -> list[str]:
        if self.parent_id and self.parent_id not in self._canvas.components:
            return super().possible_next()  # the canvas reports a missing parent
        loop = self.enclosing_loop()
        if loop is None:
            raise DSLError(
                f"{self.id}: an ExitLoop must sit in a Loop's body (parent_id naming the Loop); "
                f"its parent_id is {self.parent_id!r}"
            )
        return super().possible_next() + loop.exit_ids()

    def _invoke(self, **kwargs: Any) -> None:
        self._next = self.enclosing_loop().finish()
