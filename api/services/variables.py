"""Conversation variables: the DSL's ``variables``, living as ``env.<name>`` in a session.

Reading them needs only the snapshot's JSON; writing goes through
:meth:`api.services.turns.TurnService.save_variable` (the versioned save).
"""

from __future__ import annotations

from typing import Any

from agent import variables
from api.errors import ArgumentError, NotFound

SECRET_MASK = "******"


def check_value(name: str, type_name: Any, value: Any) -> Any:
    """``value`` if it fits the declared type, else :class:`ArgumentError` naming both
    types (the rule is the runtime's: :func:`agent.variables.check_value`)."""
    try:
        return variables.check_value(name, type_name, value)
    except ValueError as e:
        raise ArgumentError(str(e)) from None


def declared(snapshot: dict) -> dict[str, dict]:
    try:
        return variables.declared_variables(snapshot.get("variables"))
    except ValueError:
        return {}


def declaration(snapshot: dict, name: str) -> dict:
    """The declaration of variable ``name``; :class:`NotFound` listing the declared ones."""
    decls = declared(snapshot)
    if name not in decls:
        known = ", ".join(sorted(decls)) or "none"
        raise NotFound(f"the session has no conversation variable {name!r} (declared: {known})")
    return decls[name]


def list_variables(snapshot: dict) -> list[dict]:
    """``[{name, type, value, description}]`` of a snapshot (parsed); secret values masked."""
    values = snapshot.get("globals") or {}
    out = []
    for name, decl in declared(snapshot).items():
        value = values.get(f"env.{name}", decl.get("value"))
        if variables.is_secret(decl):
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
