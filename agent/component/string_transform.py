"""StringTransform: split text into a list, or merge values into one text.

Params (RAGFlow's):
    method: ``split`` or ``merge``.
    split_ref: ``split`` only: a bare reference (braces optional) to the text to split.
    script: ``merge`` only: a template with ``{references}`` (jinja2 syntax allowed).
    delimiters: a non-empty list of delimiter strings (``[","]`` by default).

Output ``result``:
    * split: the list of pieces between any of the delimiters, empty pieces kept
      (``"a,,b"`` → ``["a", "", "b"]``); an empty or missing text gives ``[]``. A number
      is split as its text; a list or object is an error (it is not text).
    * merge: the rendered script, where a referenced list is joined with the first
      delimiter (``["a", "b"]`` → ``"a,b"``) and an object reads as JSON.
"""

from __future__ import annotations

import re
from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.refs import Ref, require_ref, to_text
from agent.stream import LazyText
from agent.templates import render


class StringTransformParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.method = "split"
        self.split_ref = ""
        self.script = ""
        self.delimiters: list[str] = [","]

    def check(self) -> None:
        self.check_choice("method", ("split", "merge"))
        self.check_list("delimiters", allow_empty=False)
        for i, delimiter in enumerate(self.delimiters, 1):
            if not isinstance(delimiter, str) or delimiter == "":
                raise ValueError(f"delimiter {i} must be non-empty text, got {delimiter!r}")
        if self.method == "split":
            if not self.split_ref:
                raise ValueError("split needs split_ref, a reference to the text to split (e.g. 'sys.query')")
            require_ref(self.split_ref, "split_ref", "'begin@text', 'sys.query' or 'env.x'")
        elif not isinstance(self.script, str):
            raise ValueError(f"script must be a text template, got {self.script!r}")


@register
class StringTransform(ComponentBase):
    component_name = "StringTransform"
    side_effect_free = True
    param_class = StringTransformParam
    bare_ref_params = ("split_ref",)

    def _invoke(self, **kwargs: Any) -> None:
        if self._param.method == "split":
            self.set_output("result", self._split())
        else:
            self.set_output("result", render(self._param.script, self._merge_lookup, self._canvas.deadline))

    def _split(self) -> list[str]:
        ref = self._param.split_ref
        value = self.get_value(ref)
        if isinstance(value, LazyText):
            value = value.text
        self.inputs_seen[ref] = value
        if isinstance(value, (list, tuple, dict)):
            kind = "an object" if isinstance(value, dict) else "a list"
            raise self.fail(f"split needs text, but {ref!r} holds {kind}; use ListOperations for lists")
        text = to_text(value)
        if not text:
            return []
        pattern = "|".join(re.escape(d) for d in sorted(self._param.delimiters, key=len, reverse=True))
        return re.split(pattern, text)

    def _merge_lookup(self, ref: Ref) -> Any:
        value = self._canvas.get_value(ref)
        if isinstance(value, (list, tuple)):
            value = self._param.delimiters[0].join(to_text(v) for v in value)
        self.inputs_seen[ref.text] = value.text if isinstance(value, LazyText) else value
        return value
