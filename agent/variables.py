"""Conversation variables: declared types and the checks shared by every writer.

The DSL declares ``variables`` as ``{name: {"type", "value", "description"}}`` (or, as
RAGFlow also writes, a list of ``{name, type, value}``). Types: ``string`` (``secret``),
``number``, ``integer``, ``boolean``, ``object``, ``array`` and typed arrays
``array<string>`` / Dify's ``array[string]``; ``any``/``file`` or no type take any
value. VariableAssigner (in a turn) and the REST API (``PUT .../variables/<name>``)
both check values here, so one rule holds everywhere.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from agent.refs import to_text

# Larger numbers do not survive JSON in most clients (and Python refuses to print
# integers past 4300 digits), so arithmetic stops here with a clear error.
MAX_NUMBER = 2**63
SCALAR_KINDS = ("string", "number", "integer", "boolean", "object")
_KIND_NAMES = {
    "string": "string",
    "str": "string",
    "text": "string",
    "line": "string",
    "paragraph": "string",
    "secret": "string",
    "number": "number",
    "integer": "integer",
    "int": "integer",
    "float": "number",
    "boolean": "boolean",
    "bool": "boolean",
    "object": "object",
    "dict": "object",
    "json": "object",
    "any": "any",
    "file": "any",
}
_ARRAY_RE = re.compile(r"^(?:array|list)\s*(?:[<\[]\s*([a-z]+)\s*[>\]])?$")


class VariableType:
    """A variable's type: ``kind`` is string/number/integer/boolean/object/array/any;
    arrays also have an ``element`` kind (``any`` when not constrained).
    """

    def __init__(self, kind: str, element: str | None = None):
        self.kind = kind
        self.element = element

    def __str__(self) -> str:
        return f"array<{self.element}>" if self.kind == "array" else self.kind


def parse_type(declared: Any) -> VariableType | None:
    """Read a declared type: ``number``, ``array<string>``, Dify's ``array[string]``...

    Returns ``None`` for a type this module does not know.
    """
    if declared in (None, ""):
        return VariableType("any")
    if not isinstance(declared, str):
        return None
    text = declared.strip().lower()
    if text in _KIND_NAMES:
        return VariableType(_KIND_NAMES[text])
    m = _ARRAY_RE.match(text)
    if m is None:
        return None
    element = _KIND_NAMES.get(m.group(1) or "any")
    return VariableType("array", element) if element else None


def type_of_value(value: Any) -> VariableType:
    """The type a value has (``any`` for ``None``; lists are ``array<any>``)."""
    if isinstance(value, bool):
        return VariableType("boolean")
    if isinstance(value, (int, float)):
        return VariableType("number")
    if isinstance(value, str):
        return VariableType("string")
    if isinstance(value, dict):
        return VariableType("object")
    if isinstance(value, (list, tuple)):
        return VariableType("array", "any")
    return VariableType("any")


def _fits(kind: str, value: Any) -> bool:
    if kind == "any":
        return True
    if kind == "string":
        return isinstance(value, str)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and is_finite_number(value)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    return False


def value_fits(vtype: VariableType, value: Any) -> bool:
    """Whether ``value`` has type ``vtype`` (array elements checked too)."""
    if vtype.kind == "array":
        return isinstance(value, list) and all(_fits(vtype.element or "any", v) for v in value)
    return _fits(vtype.kind, value)


def empty_value(vtype: VariableType) -> Any:
    """What ``clear`` leaves: the type's empty value (``None`` for an untyped target)."""
    return {"string": "", "number": 0, "integer": 0, "boolean": False, "object": {}, "array": []}.get(
        vtype.kind
    )


def describe(value: Any) -> str:
    """A value for an error message: its type and a short repr."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{type_of_value(value)} {shown}" if value is not None else "null"


def is_finite_number(number: int | float) -> bool:
    return abs(number) <= MAX_NUMBER if isinstance(number, int) else math.isfinite(number)


def article(vtype: VariableType) -> str:
    """The type with its article: "a string", "an object"."""
    name = str(vtype)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def declared_variables(variables: Any) -> dict[str, dict]:
    """``variables`` as ``{name: declaration}``; raises ``ValueError`` naming a bad entry."""
    if variables is None or variables == []:
        return {}
    if isinstance(variables, list):
        out = {}
        for i, var in enumerate(variables):
            if not isinstance(var, dict) or not var.get("name"):
                raise ValueError(f"variables[{i}] must be an object with 'name', 'type' and 'value'")
            out[var["name"]] = var
        return out
    if not isinstance(variables, dict):
        raise ValueError("'variables' must be an object of {name: {type, value}}")
    for name, var in variables.items():
        if not isinstance(var, dict):
            raise ValueError(f"variable {name!r} must be an object with 'type' and 'value'")
    return variables


def is_secret(declaration: dict) -> bool:
    return bool(declaration.get("secret")) or str(declaration.get("type", "")).strip().lower() == "secret"


def check_value(name: str, declared: Any, value: Any) -> Any:
    """``value`` if it has variable ``name``'s declared type, else ``ValueError``
    naming the expected and the given type. An unknown or missing type takes any value."""
    vtype = parse_type(declared)
    if vtype is None or value_fits(vtype, value):
        return value
    if vtype.kind == "array" and isinstance(value, list):
        bad = next(
            i for i, item in enumerate(value) if not value_fits(VariableType(vtype.element or "any"), item)
        )
        raise ValueError(f"variable {name!r} is of type {declared!r}; item {bad} is {describe(value[bad])}")
    raise ValueError(f"variable {name!r} is of type {declared!r}; got {describe(value)}")


class ValueMismatch(ValueError):
    """A value does not fit a variable's type or operation; the message says why."""


def number_of(value: Any, what: str) -> int | float:
    if isinstance(value, bool):
        raise ValueMismatch(f"{what} must be a number, got {describe(value)}")
    if isinstance(value, (int, float)) and is_finite_number(value):
        return value
    if isinstance(value, str):
        text = value.strip()
        for convert in (int, float):
            try:
                number = convert(text)
            except ValueError:
                continue
            if is_finite_number(number):
                return number
    raise ValueMismatch(f"{what} must be a number, got {describe(value)}")


def whole_number(number: int | float, what: str) -> int:
    if isinstance(number, int):
        return number
    if not number.is_integer():
        raise ValueMismatch(f"{what} must be a whole number for an integer variable, got {number!r}")
    return int(number)


def from_text(vtype: VariableType, value: Any) -> Any:
    """A value given as text (a ``set`` parameter, a DSL constant) read as ``vtype``.

    Values that are not text pass through unchanged; check them with :func:`value_fits`.
    """
    kind = vtype.kind
    if kind == "string":
        return to_text(value)
    if not isinstance(value, str):
        return value
    if kind == "number":
        return number_of(value, "the value")
    if kind == "integer":
        return whole_number(number_of(value, "the value"), "the value")
    if kind == "boolean":
        text = value.strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ValueMismatch(f"the value must be true or false, got {value!r}")
    if kind in ("object", "array"):
        try:
            parsed = json.loads(value)
        except ValueError as e:
            raise ValueMismatch(
                f"the value must be a JSON {'object' if kind == 'object' else 'list'}, got {value!r} ({e})"
            ) from None
        return parsed
    return value
