"""LoopItem: the start of a Loop's body; runs before every pass.

Its ``parent_id`` is the Loop. Each time the run reaches it, it stops the Loop — going
on at the Loop's ``downstream`` — when ``maximum_loop_count`` passes have run or the
termination conditions hold; otherwise it starts the next pass at its own
``downstream``. Output: ``index``, the number of the pass starting (0 first). See
:mod:`agent.component.loop`.
"""

from __future__ import annotations

from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.component.iteration import container_of
from agent.component.loop import Loop
from agent.errors import DSLError


@register
class LoopItem(ComponentBase):
    component_name = "LoopItem"
    side_effect_free = True
    param_class = ComponentParamBase

    def loop(self) -> Loop:
        parent = container_of(self, Loop)
        if parent is None:
            raise DSLError(f"{self.id}: a LoopItem must have parent_id naming a Loop, got {self.parent_id!r}")
        return parent

    def possible_next(self) -> list[str]:
        if self.parent_id and self.parent_id not in self._canvas.components:
            return super().possible_next()  # the canvas reports the missing parent
        return super().possible_next() + self.loop().exit_ids()

    def _invoke(self, **kwargs: Any) -> None:
        loop = self.loop()
        state = loop.data
        if state.get("finished"):
            # A body branch still queued after the Loop ended: nothing more to do.
            self._next = []
            return
        if "passes" not in state:
            raise self.fail(
                f"ran before its Loop {loop.id!r} started; route the flow into the Loop, not into its LoopItem"
            )
        passes = state["passes"]
        if passes >= loop._param.maximum_loop_count or loop.should_stop():
            self._next = loop.finish()
            return
        state["passes"] = passes + 1
        self.set_output("index", passes)
