"""VariableAggregator: per group, the first of several variables that has a value.

Params (RAGFlow's)::

    groups: [{"group_name": "answer", "type": "string",
              "variables": [{"value": "LLM:A@content"}, {"value": "LLM:B@content"}]}]

Each ``value`` is a bare reference (braces optional). Typical use: after branches
that each produce an answer, only one branch ran, and later components read
``{VariableAggregator:X@answer}``. Output per ``group_name``: the first value that is not
empty — ``None``, ``""``, ``[]`` and ``{}`` are empty; ``0`` and ``false`` are values
(RAGFlow skips them too; we do not). A group with no value gets ``None``. ``type`` is
kept for the editor; it is not enforced.
"""

from __future__ import annotations

from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.conditions import is_empty
from agent.refs import Ref, parse_ref, require_ref
from agent.stream import LazyText


def _selector(variable: Any) -> Any:
    """RAGFlow writes ``{"value": ref}``; a plain ref string is accepted too."""
    return variable.get("value") if isinstance(variable, dict) else variable


class VariableAggregatorParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.groups: list[dict] = []

    def check(self) -> None:
        self.check_list("groups", allow_empty=False)
        seen: set[str] = set()
        for number, group in enumerate(self.groups, 1):
            where = f"group {number}"
            if not isinstance(group, dict):
                raise ValueError(f"{where} must be an object with 'group_name' and 'variables'")
            name = group.get("group_name")
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"{where} has no group_name; name the output it produces")
            if name in seen:
                raise ValueError(f"{where}: group_name {name!r} is used twice; each group needs its own name")
            seen.add(name)
            variables = group.get("variables")
            if not isinstance(variables, list) or not variables:
                raise ValueError(
                    f"group {name!r}: variables must be a non-empty list of {{value: reference}}"
                )
            for i, variable in enumerate(variables, 1):
                label = f"group {name!r}, variable {i}:"
                require_ref(_selector(variable), label, "'LLM:A@content', 'begin@name' or 'env.x'")


@register
class VariableAggregator(ComponentBase):
    component_name = "VariableAggregator"
    side_effect_free = True
    param_class = VariableAggregatorParam

    def references(self) -> list[Ref]:
        # The bare references sit inside `groups`, next to names and types that are not
        # references, so they are picked out here rather than via bare_ref_params.
        refs = super().references()
        for group in self._param.groups:
            refs.extend(parse_ref(_selector(v)) for v in group["variables"])
        return refs

    def _invoke(self, **kwargs: Any) -> None:
        for group in self._param.groups:
            chosen = None
            for variable in group["variables"]:
                ref = _selector(variable)
                value = self.get_value(ref)
                if isinstance(value, LazyText):
                    value = value.text
                self.inputs_seen[ref] = value
                if not is_empty(value):
                    chosen = value
                    break
            self.set_output(group["group_name"], chosen)
