"""ListOperations: pick, filter, sort or dedupe the items of a list.

Params (RAGFlow's):
    query: a bare reference (braces optional) to the list.
    operations: ``nth``, ``head`` (also ``topN``), ``tail``, ``filter``, ``sort`` or
        ``drop_duplicates``.
    n: for nth/head/tail, a whole number. ``nth`` counts from 1 (``-1`` is the last
        item); ``head``/``tail`` take the first/last ``n`` items.
    strict: for nth/head/tail: an ``n`` outside the list is an error instead of an
        empty result (``n = 0`` too).
    sort_method: ``asc`` or ``desc``.
    sort_by: for lists of objects, comma-separated keys to sort by (first key first).
        Without it objects sort by all their keys.
    filter: ``{"operator", "value"}``: keep the items for which ``item <operator>
        value`` holds, with the operators and rules of :mod:`agent.conditions` (the
        same as Switch); ``value`` may hold ``{references}``.

Outputs: ``result`` (a list — for ``nth`` the one picked item in a list, as RAGFlow),
``first`` and ``last`` (its first and last item, ``None`` when empty).

Sorting never fails on mixed values: numbers sort before text, text before other
values, and missing values (``None``) last — in either direction.
"""

from __future__ import annotations

import json
from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.conditions import canonical_operator, compare, operator_error, to_number
from agent.refs import require_ref
from agent.stream import LazyText

OPERATIONS = ("nth", "head", "tail", "filter", "sort", "drop_duplicates")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{name} must be true or false, got {value!r}")


def dedupe_key(value: Any) -> str:
    """A key equal for equal values, whatever their type (objects compare by content)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def sort_key(value: Any) -> tuple:
    """Orders numbers, then text, then other values by their JSON text; ``None`` last."""
    if value is None:
        return (3, 0)
    number = to_number(value) if not isinstance(value, str) else None
    if number is not None:
        return (0, number)
    if isinstance(value, str):
        return (1, value)
    return (2, dedupe_key(value))


class ListOperationsParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.query = ""
        self.operations = "nth"
        self.n = 0
        self.strict = False
        self.sort_method = "asc"
        self.sort_by = ""
        self.filter: dict = {"operator": "=", "value": ""}

    def check(self) -> None:
        if not self.query:
            raise ValueError("query is empty; name the list to work on, e.g. 'begin@items'")
        require_ref(self.query, "query", "'begin@items' or 'env.list'")
        operation = str(self.operations or "nth").strip()
        self.operations = "head" if operation.lower() == "topn" else operation
        self.check_choice("operations", OPERATIONS)
        if self.operations in ("nth", "head", "tail"):
            n = to_number(self.n)
            if isinstance(n, float) and n.is_integer():
                n = int(n)
            if not isinstance(n, int):
                raise ValueError(f"n must be a whole number for {self.operations}, got {self.n!r}")
            self.n = n
            self.strict = _flag(self.strict, "strict")
        elif self.operations == "sort":
            self.sort_method = (self.sort_method or "asc").strip().lower()
            self.check_choice("sort_method", ("asc", "desc"))
            if not isinstance(self.sort_by, str):
                raise ValueError(f"sort_by must be comma-separated keys, got {self.sort_by!r}")
        elif self.operations == "filter":
            if not isinstance(self.filter, dict):
                raise ValueError(f"filter must be an object {{operator, value}}, got {self.filter!r}")
            operator = canonical_operator(self.filter.get("operator", "="))
            if operator is None:
                raise ValueError(f"filter: {operator_error(self.filter.get('operator'))}")
            self.filter["operator"] = operator


@register
class ListOperations(ComponentBase):
    component_name = "ListOperations"
    side_effect_free = True
    param_class = ListOperationsParam
    bare_ref_params = ("query",)

    def _invoke(self, **kwargs: Any) -> None:
        ref = self._param.query
        items = self.get_value(ref)
        if isinstance(items, LazyText):
            items = items.text
        self.inputs_seen[ref] = items
        if items is None:
            items = []
        if not isinstance(items, (list, tuple)):
            raise self.fail(f"{ref!r} holds {type(items).__name__} {items!r:.60}, not a list")
        result = getattr(self, f"_{self._param.operations}")(list(items))
        self.set_output("result", result)
        self.set_output("first", result[0] if result else None)
        self.set_output("last", result[-1] if result else None)

    def _out_of_range(self, operation: str, n: int, size: int) -> list:
        if self._param.strict:
            raise self.fail(f"{operation}: n={n} is outside the list of {size} items (strict is on)")
        return []

    def _nth(self, items: list) -> list:
        n = self._param.n
        if n == 0 or abs(n) > len(items):
            return self._out_of_range("nth", n, len(items))
        return [items[n - 1 if n > 0 else n]]

    def _head(self, items: list) -> list:
        n = self._param.n
        if n < 1 or (n > len(items) and self._param.strict):
            return self._out_of_range("head", n, len(items))
        return items[:n]

    def _tail(self, items: list) -> list:
        n = self._param.n
        if n < 1 or (n > len(items) and self._param.strict):
            return self._out_of_range("tail", n, len(items))
        return items[-n:]

    def _filter(self, items: list) -> list:
        operator = self._param.filter["operator"]
        value = self.render_value(self._param.filter.get("value", ""))
        if isinstance(value, LazyText):
            value = value.text
        return [item for item in items if compare(item, operator, value)]

    def _sort(self, items: list) -> list:
        keys = [k.strip() for k in self._param.sort_by.split(",") if k.strip()]
        descending = self._param.sort_method == "desc"

        def key(item: Any) -> Any:
            if keys and isinstance(item, dict):
                return tuple(sort_key(item.get(k)) for k in keys)
            return sort_key(item)

        # Missing values sort last in both directions, so they are kept apart.
        present, missing = [], []
        for item in items:
            absent = item is None or (bool(keys) and isinstance(item, dict) and _all_none(item, keys))
            (missing if absent else present).append(item)
        return sorted(present, key=key, reverse=descending) + missing

    def _drop_duplicates(self, items: list) -> list:
        seen: set[str] = set()
        out = []
        for item in items:
            k = dedupe_key(item)
            if k not in seen:
                seen.add(k)
                out.append(item)
        return out


def _all_none(item: dict, keys: list[str]) -> bool:
    return all(item.get(k) is None for k in keys)
