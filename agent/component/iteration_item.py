"""IterationItem: the start of an Iteration's body; one run per element.

Its ``parent_id`` is the Iteration. Each time the run reaches it, it first collects what
the previous pass produced into the Iteration's outputs, then either sets ``item`` and
``index`` (and ``result``, RAGFlow's alias of ``item``) for the next element and goes on
to its ``downstream`` (the body), or, when the elements are exhausted, leaves the
Iteration for the Iteration's ``downstream``. See :mod:`agent.component.iteration`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.component.iteration import Iteration, container_of
from agent.errors import DSLError


@register
class IterationItem(ComponentBase):
    component_name = "IterationItem"
    side_effect_free = True
    param_class = ComponentParamBase

    def iteration(self) -> Iteration:
        parent = container_of(self, Iteration)
        if parent is None:
            raise DSLError(
                f"{self.id}: an IterationItem must have parent_id naming an Iteration, got {self.parent_id!r}"
            )
        return parent

    def possible_next(self) -> list[str]:
        if self.parent_id and self.parent_id not in self._canvas.components:
            return super().possible_next()  # the canvas reports the missing parent
        return super().possible_next() + self.iteration().exit_ids()

    def invoke(self, **kwargs: Any) -> Iterator[str] | None:
        # The pass that just ended is collected before the base class clears this
        # component's outputs: the Iteration's declared outputs may read them
        # ({IterationItem:X@index}).
        iteration = self.iteration()
        state = iteration.data
        if not state.get("finished") and state.get("next", 0) > state.get("collected", 0):
            iteration.collect_pass()
            state["collected"] = state["next"]
        return super().invoke(**kwargs)

    def _invoke(self, **kwargs: Any) -> None:
        iteration = self.iteration()
        state = iteration.data
        if state.get("finished"):
            # A body branch still queued after the Iteration ended: nothing more to do.
            self._next = []
            return
        if "items" not in state:
            raise self.fail(
                f"ran before its Iteration {iteration.id!r} started; "
                f"route the flow into the Iteration, not into its IterationItem"
            )
        index = state["next"]
        items = state["items"]
        if index >= len(items):
            self._next = iteration.finish()
            return
        iteration.clear_body()
        state["next"] = index + 1
        # Copies: a body that edits its item in place must not edit the list iterated.
        self.set_output("item", copy.deepcopy(items[index]))
        self.set_output("index", index)
        self.set_output("result", copy.deepcopy(items[index]))
