"""Switch: route the run by conditions on variables (RAGFlow's Switch).

Params:
    conditions: ``[{"logical_operator": "and"|"or", "items": [{"cpn_id", "operator",
        "value"}], "to": [ids]}]``. ``cpn_id`` is a *bare* reference (``begin@name``,
        ``sys.query``, ``UserFillUp:F@age``; braces optional); ``value`` is text that may
        hold ``{references}`` (exactly one reference gives its raw value).
    end_cpn_ids: where the run goes when no condition holds (the else branch).

The first condition that holds picks the next components (``_next``, also an output);
``and`` needs every item to hold, ``or`` one of them.

Comparison rules: see :mod:`agent.conditions` (shared with Loop and the filters of
ListOperations and DataOperations, so one operator means the same everywhere).
"""

from __future__ import annotations

from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.conditions import (  # noqa: F401 - re-exported: other components import them from here
    LOGICAL_OPERATORS,
    OPERATORS,
    canonical_operator,
    combine,
    compare,
    is_empty,
    operator_error,
    to_number,
)
from agent.refs import Ref, parse_ref, require_ref
from agent.stream import LazyText


def read_ref(component: ComponentBase, ref: str | Ref) -> Any:
    """A reference's value, with a still-streaming answer read whole."""
    value = component.get_value(ref)
    return value.text if isinstance(value, LazyText) else value


def id_list(value: Any, what: str) -> list[str]:
    """A list of component ids (one id as text is accepted); raises ``ValueError`` otherwise."""
    if isinstance(value, str):
        value = [value] if value else []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{what} must be a list of component ids, got {value!r}")
    return value


class SwitchParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.conditions: list[dict] = []
        self.end_cpn_ids: list[str] = []

    def check(self) -> None:
        self.check_list("conditions", allow_empty=False)
        for n, cond in enumerate(self.conditions, 1):
            where = f"condition {n}"
            if not isinstance(cond, dict):
                raise ValueError(f"{where} must be an object with 'logical_operator', 'items' and 'to'")
            logic = cond.get("logical_operator") or "and"
            if logic not in LOGICAL_OPERATORS:
                raise ValueError(f"{where}: logical_operator {logic!r} is not 'and' or 'or'")
            cond["logical_operator"] = logic
            items = cond.get("items")
            if not isinstance(items, list) or not items:
                raise ValueError(f"{where} has no items; add at least one {{cpn_id, operator, value}}")
            for k, item in enumerate(items, 1):
                at = f"{where}, item {k}"
                if not isinstance(item, dict):
                    raise ValueError(f"{at} must be an object with 'cpn_id', 'operator' and 'value'")
                require_ref(item.get("cpn_id"), f"{at}: cpn_id", "'begin@name', 'sys.query' or 'env.x'")
                operator = canonical_operator(item.get("operator"))
                if operator is None:
                    raise ValueError(f"{at}: {operator_error(item.get('operator'))}")
                item["operator"] = operator
            cond["to"] = id_list(cond.get("to"), f"{where}: 'to'")
            if not cond["to"]:
                raise ValueError(f"{where} has an empty 'to'; name the component(s) to run when it holds")
        self.end_cpn_ids = id_list(self.end_cpn_ids, "end_cpn_ids")
        if not self.end_cpn_ids:
            raise ValueError("end_cpn_ids (the else branch) is empty; name the component(s) to run otherwise")


@register
class Switch(ComponentBase):
    """See the module docstring.

    The bare ``cpn_id`` references sit inside ``conditions``, next to ``value`` texts that
    may look like references (``me@example.com``), so :meth:`references` picks out the
    ``cpn_id`` fields instead of declaring the whole param in ``bare_ref_params``.
    """

    component_name = "Switch"
    side_effect_free = True
    param_class = SwitchParam

    def references(self) -> list[Ref]:
        refs = super().references()
        for cond in self._param.conditions:
            refs.extend(parse_ref(item["cpn_id"]) for item in cond["items"])
        return refs

    def fallback_next(self) -> list[str]:
        return list(self._param.end_cpn_ids or [])

    def possible_next(self) -> list[str]:
        ids = super().possible_next()
        for cond in self._param.conditions:
            ids += cond["to"]
        return ids + list(self._param.end_cpn_ids)

    def lenient_routes(self) -> dict[str, str]:
        routes = {cid: "the else branch (end_cpn_ids)" for cid in self._param.end_cpn_ids}
        for n, cond in enumerate(self._param.conditions, 1):
            routes.update((cid, f"condition {n}") for cid in cond["to"])
        return routes

    def _invoke(self, **kwargs: Any) -> None:
        chosen = branch = None
        for n, cond in enumerate(self._param.conditions, 1):
            items = cond["items"]
            if len(items) == 1:  # one item: it decides, whatever the logical operator
                holds = self._holds(items[0])
            else:
                holds = combine((self._holds(item) for item in items), cond["logical_operator"])
            if holds:
                chosen, branch = list(cond["to"]), f"condition {n}"
                break
        if chosen is None:
            chosen, branch = list(self._param.end_cpn_ids), "the else branch (end_cpn_ids)"
        components = self._canvas.components
        missing = [cid for cid in chosen if cid not in components]
        if missing:
            raise self.fail(
                f"{branch} holds but routes to missing component(s) {', '.join(map(repr, missing))}; "
                f"add them to the canvas or change the Switch",
                retryable=False,
            )
        self._next = chosen
        self.set_output("_next", chosen)

    def _holds(self, item: dict) -> bool:
        ref = parse_ref(item["cpn_id"])
        left = self._canvas.get_value(ref)  # read_ref, without two calls
        if isinstance(left, LazyText):
            left = left.text
        self.inputs_seen[ref.text] = left
        right = item.get("value")
        if right is None:
            right = ""
        elif isinstance(right, str) and "{" not in right:
            pass  # plain text: nothing to render
        else:
            right = self.render_value(right)
            if isinstance(right, LazyText):
                right = right.text
        return compare(left, item["operator"], right)
