"""Switch: route the run by conditions on variables (RAGFlow's Switch).

Params:
    conditions: ``[{"logical_operator": "and"|"or", "items": [{"cpn_id", "operator",
        "value"}], "to": [ids]}]``. ``cpn_id`` is a *bare* reference (``begin@name``,
        ``sys.query``, ``UserFillUp:F@age``; braces optional); ``value`` is text that may
        hold ``{references}`` (exactly one reference gives its raw value).
    end_cpn_ids: where the run goes when no condition holds (the else branch).

The first condition that holds picks the next components (``_next``, also an output);
``and`` needs every item to hold, ``or`` one of them.

Comparison rules. They live here as :func:`compare` and are shared with the filters of
ListOperations and DataOperations, so one operator means the same everywhere:

* ``contains`` / ``not contains``: in text, a case-insensitive substring; in a list, an
  element equal to the value (compared as text, case-insensitively); in an object, a key.
* ``start with`` / ``end with``: case-insensitive, on the text form of the left value.
* ``empty`` / ``not empty``: ``None``, ``""``, ``[]`` and ``{}`` are empty; ``0`` and
  ``false`` are values, not empty.
* ``=`` / ``≠`` (also ``!=``): when the left value is a number the right one is read as a
  number, and a right value that is not a number is simply not equal (no error); a
  boolean compares with ``true``/``false``; anything else compares as text, exactly.
* ``>`` ``<`` ``≥`` ``≤`` (also ``>=`` ``<=``): both sides as numbers (numeric text
  counts). If either side is not a number the condition is **false** — never an error —
  except that two texts compare as text (so ISO dates order correctly), as RAGFlow does.
"""

from __future__ import annotations

import math
from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.refs import Ref, parse_ref, to_text
from agent.stream import LazyText

OPERATORS = (
    "contains",
    "not contains",
    "start with",
    "end with",
    "empty",
    "not empty",
    "=",
    "≠",
    ">",
    "<",
    "≥",
    "≤",
)
_ALIASES = {"!=": "≠", ">=": "≥", "<=": "≤"}
_ORDERING = {
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    "≥": lambda a, b: a >= b,
    "≤": lambda a, b: a <= b,
}


def canonical_operator(operator: Any) -> str | None:
    """The operator's canonical spelling (``"!="`` → ``"≠"``), or ``None`` if unknown."""
    if not isinstance(operator, str):
        return None
    op = operator.strip()
    op = _ALIASES.get(op, op)
    return op if op in OPERATORS else None


def operator_error(operator: Any) -> str:
    """The message for an unknown comparison operator."""
    return f"unknown operator {operator!r}; use one of {', '.join(map(repr, OPERATORS))}"


def to_number(value: Any) -> int | float | None:
    """``value`` as a finite number (numbers and numeric text), else ``None``; booleans are not numbers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def is_empty(value: Any) -> bool:
    """``None``, ``""``, ``[]`` and ``{}`` are empty; ``0`` and ``False`` are not."""
    return value is None or (isinstance(value, (str, list, tuple, dict)) and len(value) == 0)


def read_ref(component: ComponentBase, ref: str | Ref) -> Any:
    """A reference's value, with a still-streaming answer read whole."""
    value = component.get_value(ref)
    return value.text if isinstance(value, LazyText) else value


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def _equal(left: Any, right: Any) -> bool:
    if isinstance(left, bool):
        return _as_bool(right) is left
    if isinstance(left, (int, float)):
        number = to_number(right)
        return number is not None and left == number
    if left is None:
        return right is None or right == ""
    if isinstance(right, str) and not isinstance(left, str):
        return to_text(left) == right
    return left == right


def compare(left: Any, operator: str, right: Any) -> bool:
    """Whether ``left <operator> right`` holds, by the rules in the module docstring.

    Args:
        left: the variable's value.
        operator: a canonical operator (see :func:`canonical_operator`).
        right: the value to compare with (text, or a raw value from a reference).
    """
    if operator == "empty":
        return is_empty(left)
    if operator == "not empty":
        return not is_empty(left)
    if operator == "=":
        return _equal(left, right)
    if operator == "≠":
        return not _equal(left, right)
    if operator in ("contains", "not contains"):
        needle = to_text(right).lower()
        if isinstance(left, (list, tuple)):
            found = any(to_text(item).lower() == needle for item in left)
        elif isinstance(left, dict):
            found = to_text(right) in left
        else:
            found = needle in to_text(left).lower()
        return found if operator == "contains" else not found
    if operator == "start with":
        return to_text(left).lower().startswith(to_text(right).lower())
    if operator == "end with":
        return to_text(left).lower().endswith(to_text(right).lower())
    if operator in _ORDERING:
        a, b = to_number(left), to_number(right)
        if a is not None and b is not None:
            return _ORDERING[operator](a, b)
        if isinstance(left, str) and isinstance(right, str) and a is None and b is None:
            return _ORDERING[operator](left, right)
        return False
    raise ValueError(operator_error(operator))


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
            if logic not in ("and", "or"):
                raise ValueError(f"{where}: logical_operator {logic!r} is not 'and' or 'or'")
            cond["logical_operator"] = logic
            items = cond.get("items")
            if not isinstance(items, list) or not items:
                raise ValueError(f"{where} has no items; add at least one {{cpn_id, operator, value}}")
            for k, item in enumerate(items, 1):
                at = f"{where}, item {k}"
                if not isinstance(item, dict):
                    raise ValueError(f"{at} must be an object with 'cpn_id', 'operator' and 'value'")
                if parse_ref(item.get("cpn_id")) is None:
                    raise ValueError(
                        f"{at}: cpn_id {item.get('cpn_id')!r} is not a reference like "
                        f"'begin@name', 'sys.query' or 'env.x'"
                    )
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
    param_class = SwitchParam

    def references(self) -> list[Ref]:
        refs = super().references()
        for cond in self._param.conditions:
            refs.extend(parse_ref(item["cpn_id"]) for item in cond["items"])
        return refs

    def possible_next(self) -> list[str]:
        ids = super().possible_next()
        for cond in self._param.conditions:
            ids += cond["to"]
        return ids + list(self._param.end_cpn_ids)

    def _invoke(self, **kwargs: Any) -> None:
        chosen = list(self._param.end_cpn_ids)
        for cond in self._param.conditions:
            results = (self._holds(item) for item in cond["items"])
            holds = all(results) if cond["logical_operator"] == "and" else any(results)
            if holds:
                chosen = list(cond["to"])
                break
        self._next = chosen
        self.set_output("_next", chosen)

    def _holds(self, item: dict) -> bool:
        ref = parse_ref(item["cpn_id"])
        left = read_ref(self, ref)
        self.inputs_seen[ref.text] = left
        right = item.get("value")
        right = "" if right is None else self.render_value(right)
        if isinstance(right, LazyText):
            right = right.text
        return compare(left, item["operator"], right)
