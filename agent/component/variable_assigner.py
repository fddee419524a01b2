"""VariableAssigner: change conversation variables and component outputs.

Params (RAGFlow's)::

    variables: [{"variable": "env.count", "operator": "+=", "parameter": 1}, ...]

``variable`` is a bare reference to what is written (``env.x``, or a component output
``Cpn:X@name``; not ``sys.*``, which the runtime owns). ``parameter`` is a literal
(number, list, object, text), a reference (``{begin@x}`` or bare ``begin@x``) whose raw
value is used, or text with ``{references}`` that is rendered. A bare string is read
as a reference when it names ``sys.``/``env.`` or a component id that has a ``:``
(``Type:Name``), ``begin``, or any component of the canvas; so ``"bob@example.com"``
stays text.

Items run in order (a later item sees what an earlier one wrote). The type of a target
is its declared type when it is a conversation variable with a ``type`` under
``variables`` (the spellings the REST API checks: ``string``, ``number``, ``integer``,
``boolean``, ``object``, ``array``, ``array<string>`` / ``array[string]`` ...), else
the type of its current value (also for a declared type this module does not know).
The rules are Dify's:

==============  =================================================================
overwrite       any type; the value must have the variable's type
clear           the type's empty value: ``""``, ``0``, ``false``, ``{}``, ``[]``
set             string, number, boolean, object: text is converted to the type
                (``"42"`` → 42, ``"true"``, JSON text for objects)
append          arrays; the value must have the element type
extend          arrays; the value must be a list of the element type
remove_first    arrays; an empty array stays empty
remove_last     arrays; an empty array stays empty
+= -= *= /=     numbers; the value is a number or numeric text; ``/= 0`` fails
==============  =================================================================

A target with no value and no declared type takes any value (``append`` starts a
list). An arithmetic result of two whole numbers that is whole stays whole (``6 /= 3``
gives 2); an ``integer`` variable only takes whole numbers (``7 /= 2`` fails). Literal
lists and objects are stored as written (references inside them are not rendered).

A bad operation fails the component with an error naming the item and the variable,
and undoes the items of this run that were already written (so ``exception_method``
and retries never leave half an assignment behind). The node's ``inputs`` show the
items as written, never the values (a variable may hold a secret).
"""

from __future__ import annotations

import math
from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.refs import Ref, find_refs, parse_ref, require_ref
from agent.stream import LazyText
from agent.variables import (
    MAX_NUMBER,
    SCALAR_KINDS,
    VariableType,
    article,
    describe,
    empty_value,
    from_text,
    number_of,
    parse_type,
    type_of_value,
    value_fits,
    whole_number,
)
from agent.variables import ValueMismatch as AssignError

OPERATORS = (
    "overwrite",
    "clear",
    "set",
    "append",
    "extend",
    "remove_first",
    "remove_last",
    "+=",
    "-=",
    "*=",
    "/=",
)
NO_PARAMETER = ("clear", "remove_first", "remove_last")
ARITHMETIC = ("+=", "-=", "*=", "/=")


def _arithmetic(operator: str, current: Any, value: Any) -> int | float:
    left = number_of(current, "the variable's value") if current is not None else None
    if left is None:
        raise AssignError(f"{operator} needs a number in the variable, which holds nothing (None)")
    right = number_of(value, "the value")
    if operator == "+=":
        result = left + right
    elif operator == "-=":
        result = left - right
    elif operator == "*=":
        result = left * right
    else:
        if right == 0:
            raise AssignError("/= by zero; the value must not be 0")
        result = left / right
        if isinstance(left, int) and isinstance(right, int) and result.is_integer():
            result = int(result)
    if abs(result) > MAX_NUMBER or not math.isfinite(result):
        raise AssignError(f"{left!r} {operator[0]} {right!r} is too large to store (limit ±2**63)")
    return result


def apply_operator(operator: str, vtype: VariableType, current: Any, value: Any) -> Any:
    """The new value of a variable of type ``vtype`` holding ``current``.

    Raises:
        AssignError: the operation does not apply to the type, or ``value`` does not fit.
    """
    if operator == "clear":
        return empty_value(vtype)
    if operator in ARITHMETIC:
        if vtype.kind not in ("number", "integer", "any"):
            raise AssignError(f"{operator} works on numbers; the variable is {article(vtype)}")
        result = _arithmetic(operator, current, value)
        return whole_number(result, f"the result of {operator}") if vtype.kind == "integer" else result
    if operator in ("append", "extend", "remove_first", "remove_last"):
        if vtype.kind == "any" and current is None:
            vtype = VariableType("array", "any")
        if vtype.kind != "array":
            raise AssignError(f"{operator} works on arrays; the variable is {article(vtype)}")
        items = list(current) if isinstance(current, (list, tuple)) else []
        if operator == "remove_first":
            return items[1:]
        if operator == "remove_last":
            return items[:-1]
        element = VariableType(vtype.element or "any")
        if operator == "append":
            if not value_fits(element, value):
                raise AssignError(f"append needs {article(element)} element, got {describe(value)}")
            return [*items, value]
        if not isinstance(value, list):
            raise AssignError(f"extend needs a list, got {describe(value)}")
        if not value_fits(vtype, value):
            raise AssignError(f"extend needs a list of {element} elements, got {describe(value)}")
        return items + value
    if operator == "set":
        if vtype.kind not in (*SCALAR_KINDS, "any"):
            raise AssignError(
                f"set works on {', '.join(SCALAR_KINDS)}; for {article(vtype)} use overwrite or extend"
            )
        value = from_text(vtype, value)
    if not value_fits(vtype, value):
        raise AssignError(f"{operator} needs {article(vtype)} value, got {describe(value)}")
    return value


def _looks_like_ref(text: str, known: Any = ()) -> Ref | None:
    """The reference a bare parameter names, or ``None`` if it is plain text."""
    ref = parse_ref(text)
    if ref is None or ref.scope != "cpn":
        return ref
    if ":" in ref.name or ref.name == "begin" or ref.name in known:
        return ref
    return None


class VariableAssignerParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.variables: list[dict] = []

    def check(self) -> None:
        if not isinstance(self.variables, list):
            raise ValueError("variables must be a list of {variable, operator, parameter}")
        for number, item in enumerate(self.variables, 1):
            where = f"item {number}"
            if not isinstance(item, dict):
                raise ValueError(f"{where} must be an object with 'variable', 'operator' and 'parameter'")
            variable = item.get("variable")
            ref = require_ref(variable, f"{where}: variable", "'env.count' or 'Cpn:Name@out'")
            if ref.scope == "sys":
                raise ValueError(
                    f"{where}: {variable!r} is set by the runtime and cannot be assigned; "
                    f"declare a conversation variable under 'variables' and assign env.<name>"
                )
            if ref.path:
                raise ValueError(f"{where}: cannot assign into {variable!r}; assign the whole variable")
            operator = item.get("operator")
            if operator not in OPERATORS:
                raise ValueError(
                    f"{where} ({variable}): unknown operator {operator!r}; use one of {', '.join(OPERATORS)}"
                )
            parameter = item.get("parameter")
            if operator in NO_PARAMETER:
                continue
            if parameter is None:
                raise ValueError(f"{where} ({variable}): operator {operator!r} needs a 'parameter'")
            if operator in ARITHMETIC and not _maybe_ref(parameter):
                try:
                    number = number_of(parameter, f"the parameter of {operator}")
                except AssignError as e:
                    raise ValueError(f"{where} ({variable}): {e}") from None
                if operator == "/=" and number == 0:
                    raise ValueError(f"{where} ({variable}): /= by zero; the parameter must not be 0")


def _maybe_ref(parameter: Any) -> bool:
    """Whether a parameter may hold a reference (so its value is known only at run time)."""
    return isinstance(parameter, str) and (parse_ref(parameter) is not None or bool(find_refs(parameter)))


@register
class VariableAssigner(ComponentBase):
    component_name = "VariableAssigner"
    side_effect_free = True
    param_class = VariableAssignerParam

    def references(self) -> list[Ref]:
        refs = super().references()
        for item in self._param.variables:
            refs.append(parse_ref(item["variable"]))
            parameter = item.get("parameter")
            if item["operator"] not in NO_PARAMETER and isinstance(parameter, str):
                ref = _looks_like_ref(parameter)
                if ref is not None:
                    refs.append(ref)
        return refs

    def _invoke(self, **kwargs: Any) -> None:
        written: list[tuple[str, Any]] = []
        self.inputs_seen = {"variables": self._param.variables}
        try:
            for number, item in enumerate(self._param.variables, 1):
                variable, operator = item["variable"], item["operator"]
                current = self._read(variable)
                value = None if operator in NO_PARAMETER else self._parameter(item.get("parameter"))
                try:
                    new = apply_operator(operator, self._type_of(variable, current), current, value)
                except AssignError as e:
                    raise self.fail(f"item {number} ({variable} {operator}): {e}") from None
                written.append((variable, current))
                self._canvas.set_value(variable, new)
        except Exception:
            for variable, old in reversed(written):
                self._canvas.set_value(variable, old)
            raise

    def _read(self, variable: str) -> Any:
        value = self.get_value(variable)
        return value.text if isinstance(value, LazyText) else value

    def _parameter(self, parameter: Any) -> Any:
        if isinstance(parameter, str):
            ref = _looks_like_ref(parameter, self._canvas.components)
            value = self.get_value(ref) if ref is not None else self.render_value(parameter)
            return value.text if isinstance(value, LazyText) else value
        return parameter

    def _type_of(self, variable: str, current: Any) -> VariableType:
        ref = parse_ref(variable)
        if ref is not None and ref.scope == "env":
            declared = self._canvas.variable_type(ref.name[len("env.") :])
            vtype = parse_type(declared) if declared not in (None, "") else None
            if vtype is not None:
                return vtype
        return type_of_value(current)
