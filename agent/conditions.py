"""Comparison operators shared by every component that tests a condition.

Switch conditions, Loop termination conditions and the filters of ListOperations and
DataOperations all compare a variable with a value through :func:`compare`, so one
operator means the same everywhere. The operators are RAGFlow's editor spellings
(:data:`OPERATORS`); :func:`canonical_operator` also accepts a few ASCII spellings.

Rules:

* ``contains`` / ``not contains``: in text, a case-insensitive substring; in a list, an
  element equal to the value (compared as text, case-insensitively); in an object, a key.
* ``start with`` / ``end with``: case-insensitive, on the text form of the left value.
* ``empty`` / ``not empty``: ``None``, ``""``, ``[]`` and ``{}`` are empty; ``0`` and
  ``false`` are values, not empty.
* ``=`` / ``≠`` (also ``==``, ``!=``, ``is``, ``is not``): when the left value is a number
  the right one is read as a number (and the other way round, when a reference gives a
  number on the right), and a value that is not a number is simply not equal (no error); a boolean compares with ``true``/``false``; anything else compares as
  text, exactly.
* ``>`` ``<`` ``≥`` ``≤`` (also ``>=`` ``<=``): both sides as numbers (numeric text
  counts). If either side is not a number the condition is **false** — never an error —
  except that two texts compare as text (so ISO dates order correctly), as RAGFlow does.

Several conditions combine with a logical operator, ``and`` or ``or``
(:data:`LOGICAL_OPERATORS`, :func:`combine`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from agent.refs import to_text

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
LOGICAL_OPERATORS = ("and", "or")
# RAGFlow's Loop writes "is" / "is not" for text and booleans; the rest are ASCII
# spellings people type by hand.
_ALIASES = {"==": "=", "is": "=", "!=": "≠", "is not": "≠", ">=": "≥", "<=": "≤"}
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
    if isinstance(right, (int, float)) and not isinstance(right, bool):
        # A raw number from a reference on the right reads numeric text on the left.
        number = to_number(left)
        return number is not None and number == right
    if isinstance(right, str) and not isinstance(left, str):
        return to_text(left) == right
    return left == right


def compare(left: Any, operator: str, right: Any) -> bool:
    """Whether ``left <operator> right`` holds, by the rules in the module docstring.

    Args:
        left: the variable's value.
        operator: a canonical operator (see :func:`canonical_operator`).
        right: the value to compare with (text, or a raw value from a reference).

    Raises:
        ValueError: ``operator`` is not a canonical operator.
    """
    ordering = _ORDERING.get(operator) if type(operator) is str else None
    if ordering is not None:
        a, b = to_number(left), to_number(right)
        if a is not None and b is not None:
            return ordering(a, b)
        if isinstance(left, str) and isinstance(right, str) and a is None and b is None:
            return ordering(left, right)
        return False
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
    raise ValueError(operator_error(operator))


def combine(results: Iterable[bool], logical_operator: str) -> bool:
    """``and``: every result holds; ``or``: one does. Stops at the first that decides.

    Pass a generator to skip evaluating conditions that cannot change the outcome.
    """
    if logical_operator == "and":
        return all(results)
    if logical_operator == "or":
        return any(results)
    raise ValueError(f"logical_operator {logical_operator!r} is not 'and' or 'or'")
