"""Message: the answer shown to the user.

Params: ``content``, a list of templates (one is picked per run; a single string is
accepted too) with references and optional jinja2 syntax; ``stream`` (kept for
RAGFlow compatibility: the canvas always streams Message output as ``message``
events). A referenced LLM answer that is still streaming is streamed through as
its chunks arrive.

The pick among several templates is random but reproducible: it is seeded by the
conversation turn and the component id, so replaying a snapshot gives the same pick.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase


class MessageParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.content: list[str] | str = []
        self.stream = True
        # RAGFlow's "save to memory": the turn's question and answer go into these Memories.
        self.memory_ids: list[str] = []

    def check(self) -> None:
        if self.memory_ids is None:
            self.memory_ids = []
        if not isinstance(self.memory_ids, list) or not all(
            isinstance(m, str) and m for m in self.memory_ids
        ):
            raise ValueError(f"memory_ids must be a list of Memory ids, got {self.memory_ids!r}")
        if isinstance(self.content, str):
            self.content = [self.content]
        if not isinstance(self.content, list) or not all(isinstance(c, str) for c in self.content):
            raise ValueError("content must be a list of text templates")


@register
class Message(ComponentBase):
    component_name = "Message"
    side_effect_free = True
    param_class = MessageParam

    def _invoke(self, **kwargs) -> Iterator[str] | None:
        for memory_id in self._param.memory_ids:
            if memory_id not in self._canvas.memory_saves:
                self._canvas.memory_saves.append(memory_id)
        options = self._param.content
        if not options:
            self.set_output("content", "")
            return None
        if len(options) == 1:
            template = options[0]
        else:
            seed = f"{self._canvas.globals.get('sys.conversation_turns')}:{self.id}"
            template = random.Random(seed).choice(options)
        return self._canvas.render_stream(template)
