"""Conversation variables: the DSL's ``variables``, living as ``env.<name>`` in a session.

Reading them needs only the snapshot's JSON; writing goes through
:meth:`api.services.turns.TurnService.save_variable` (the versioned save).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from api.errors import ArgumentError, NotFound

SECRET_MASK = "******"

_SCALARS: dict[str, tuple[str, ...]] = {
    "string": ("string", "str", "text", "line", "paragraph", "secret"),
    "number": ("number", "float"),
    "integer": ("integer", "int"),
    "boolean": ("boolean", "bool"),
    "object": ("object", "dict", "json"),
    "array": ("array", "list"),
}
_ARRAY_RE = re.compile(r"^(?:array|list)\s*[\[<]\s*(\w+)\s*[\]>]$")


def _kind(type_name: str) -> str | None:
    name = type_name.strip().lower()
    for kind, spellings in _SCALARS.items():
        if name in spellings:
            return kind
    return None


def describe(value: Any) -> str:
    """How a given value is named in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _fits(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    return True


def check_value(name: str, type_name: Any, value: Any) -> Any:
    """``value`` if it fits the declared type, else :class:`ArgumentError` naming both types.

    Types: ``string`` (``secret``), ``number``, ``integer``, ``boolean``, ``object``,
    ``array`` and typed arrays ``array[string]`` / ``array<number>``. A variable with
    no type, or one this server does not know, takes any JSON value.
    """
    if not isinstance(type_name, str) or not type_name.strip():
        return value
    match = _ARRAY_RE.match(type_name.strip().lower())
    if match:
        item_kind = _kind(match.group(1))
        if not isinstance(value, list):
            raise ArgumentError(f"variable {name!r} is of type {type_name!r}; got {_given(value)}")
        if item_kind is not None:
            for i, item in enumerate(value):
                if not _fits(item_kind, item):
                    raise ArgumentError(
                        f"variable {name!r} is of type {type_name!r}; item {i} is {_given(item)}"
                    )
        return value
    kind = _kind(type_name)
    if kind is not None and not _fits(kind, value):
        raise ArgumentError(f"variable {name!r} is of type {type_name!r}; got {_given(value)}")
    return value


def _given(value: Any) -> str:
    """``string "ten"``, ``integer 3``; just ``null`` for null."""
    return "null" if value is None else f"{describe(value)} {_show(value)}"


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def is_secret(decl: dict) -> bool:
    return bool(decl.get("secret")) or str(decl.get("type", "")).strip().lower() == "secret"


def declared(snapshot: dict) -> dict[str, dict]:
    variables = snapshot.get("variables") or {}
    return {k: v for k, v in variables.items() if isinstance(v, dict)}


def declaration(snapshot: dict, name: str) -> dict:
    """The declaration of variable ``name``; :class:`NotFound` listing the declared ones."""
    decls = declared(snapshot)
    if name not in decls:
        known = ", ".join(sorted(decls)) or "none"
        raise NotFound(f"the session has no conversation variable {name!r} (declared: {known})")
    return decls[name]


def list_variables(snapshot_text: str) -> list[dict]:
    """``[{name, type, value, description}]`` of a snapshot; secret values masked."""
    snapshot = json.loads(snapshot_text)
    values = snapshot.get("globals") or {}
    out = []
    for name, decl in declared(snapshot).items():
        value = values.get(f"env.{name}", decl.get("value"))
        if is_secret(decl):
            value = SECRET_MASK if value not in (None, "") else ""
        out.append(
            {
                "name": name,
                "type": decl.get("type", ""),
                "value": value,
                "description": decl.get("description", ""),
            }
        )
    return out
