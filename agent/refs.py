"""References inside component params.

Three spellings, as in RAGFlow's DSL:

* ``{cpn_id@var}`` / ``{cpn_id@var.path.0.x}``: an output of a component, with an
  optional dotted path into it (dict keys and list indices);
* ``{sys.query}``: a system global;
* ``{env.counter}``: a workflow (conversation) variable.

Some params take a *bare* reference without braces (Switch ``cpn_id``, Categorize
``query``, VariableAssigner ``variable``...): :func:`parse_ref` reads those.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

_ID = r"[A-Za-z0-9_:\-]+"
_PATH = r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*"
_REF_BODY = rf"(?:{_ID}@{_PATH}|(?:sys|env)\.{_PATH})"
# Not preceded/followed by another brace, so jinja's ``{{ x }}`` is left alone.
REF_RE = re.compile(rf"(?<!\{{)\{{\s*({_REF_BODY})\s*\}}(?!\}})")
BARE_RE = re.compile(rf"^\s*\{{?\s*({_REF_BODY})\s*\}}?\s*$")


@dataclass(frozen=True)
class Ref:
    """One parsed reference.

    Attributes:
        scope: ``"cpn"``, ``"sys"`` or ``"env"``.
        name: the component id (scope ``cpn``) or the global's full key (``sys.query``).
        path: the dotted path after the variable, as a tuple of strings.
        var: the output name for component references, else ``""``.
    """

    scope: str
    name: str
    var: str
    path: tuple[str, ...]

    @cached_property  # written once into the instance's dict (frozen fields untouched)
    def text(self) -> str:
        if self.scope == "cpn":
            return "@".join((self.name, ".".join((self.var, *self.path))))
        return ".".join((self.name, *self.path))


def parse_ref(text: str) -> Ref | None:
    """Parse a bare reference (braces optional); ``None`` if ``text`` is not one."""
    if not isinstance(text, str):
        return None
    return _parse_bare(text)


@lru_cache(maxsize=4096)
def _parse_bare(text: str) -> Ref | None:
    # Params name the same few references turn after turn; a Ref is immutable.
    m = BARE_RE.match(text)
    if not m:
        return None
    return _parse_body(m.group(1))


def require_ref(value: Any, label: str, example: str) -> Ref:
    """``value`` read as a bare reference, for a param's ``check()``.

    Raises:
        ValueError: "<label> <value!r> is not a reference like <example>".
    """
    ref = parse_ref(value) if isinstance(value, str) else None
    if ref is None:
        raise ValueError(f"{label} {value!r} is not a reference like {example}")
    return ref


def _parse_body(body: str) -> Ref:
    if "@" in body:
        cpn, rest = body.split("@", 1)
        var, *path = rest.split(".")
        return Ref("cpn", cpn, var, tuple(path))
    scope, name, *path = body.split(".")
    return Ref(scope, f"{scope}.{name}", "", tuple(path))


def find_refs(text: Any) -> list[Ref]:
    """Every reference in a string, or in any string nested in lists and dicts."""
    found: list[Ref] = []
    _collect(text, found)
    return found


def _collect(value: Any, found: list[Ref]) -> None:
    if isinstance(value, str):
        found.extend(_parse_body(m.group(1)) for m in REF_RE.finditer(value))
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, found)
    elif isinstance(value, list):
        for v in value:
            _collect(v, found)


def sole_ref(text: Any) -> Ref | None:
    """The reference if ``text`` is exactly one ``{reference}`` and nothing else."""
    if not isinstance(text, str):
        return None
    m = REF_RE.fullmatch(text.strip())
    return _parse_body(m.group(1)) if m else None


def descend(value: Any, path: tuple[str, ...]) -> Any:
    """Follow a dotted path into dicts and lists; ``None`` where it leads nowhere.

    A string that holds JSON (an LLM's structured answer, say) is read through.
    """
    for step in path:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return None
        if isinstance(value, dict):
            value = value.get(step)
        elif isinstance(value, (list, tuple)):
            try:
                value = value[int(step)]
            except (ValueError, IndexError):
                return None
        else:
            return None
    return value


def to_text(value: Any) -> str:
    """How a value reads when inserted into text: JSON for containers, ``""`` for None."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)
