"""DataOperations: reshape objects (dicts) — select, filter, update, remove, rename keys.

Params (RAGFlow's):
    query: a list of bare references (braces optional; one reference as text is accepted
        too; RAGFlow's older ``inputs`` list is read when ``query`` is empty). Each names
        an object or a list of objects; JSON text holding one is read as well. A
        reference with no value is skipped.
    operations (spaces or underscores): ``select_keys``, ``literal_eval``, ``combine``,
        ``filter_values``, ``append_or_update``, ``remove_keys``, ``rename_keys``.
    select_keys: ``[key, ...]`` — keep only these keys.
    filter_values: ``[{"key", "operator", "value"}]`` — keep the objects for which every
        rule holds (an object without the key fails the rule). Operators and rules are
        :mod:`agent.conditions`' (the same as Switch); RAGFlow's older ``equals``,
        ``not equals``, ``starts with``, ``ends with`` are accepted. ``value`` may hold
        ``{references}``.
    updates: ``[{"key", "value"}]`` — set keys (``value`` may be a ``{reference}``, whose
        raw value is used, or text with references).
    remove_keys: ``[key, ...]``.
    rename_keys: ``[{"old_key", "new_key"}]``; a missing old key is left alone.

Output ``result``: the list of resulting objects, except ``combine``, which merges all
objects into one (a key seen several times collects its values in a list).
``literal_eval`` turns text values that hold literals (``"42"``, ``"true"``,
``"[1, 2]"``, ``"{'a': 1}"``, JSON) into those values, recursively through objects and
lists; other text is left as it is. Nothing is ever executed.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.conditions import canonical_operator, compare, operator_error, to_number
from agent.refs import Ref, parse_ref, require_ref
from agent.stream import LazyText

OPERATIONS = (
    "select_keys",
    "literal_eval",
    "combine",
    "filter_values",
    "append_or_update",
    "remove_keys",
    "rename_keys",
)
# RAGFlow's first DataOperations spelled the filter operators out.
_FILTER_ALIASES = {"equals": "=", "not equals": "≠", "starts with": "start with", "ends with": "end with"}
_LITERAL_WORDS = {"true": True, "false": False, "none": None, "null": None}


def _operation_name(value: Any) -> str:
    name = "_".join(str(value or "").strip().lower().split())
    return "literal_eval" if name == "recursive_eval" else name


def _key_list(value: Any, name: str) -> list[str]:
    if isinstance(value, str):
        value = [k.strip() for k in value.split(",") if k.strip()]
    if not isinstance(value, list) or not all(isinstance(k, str) and k for k in value):
        raise ValueError(f"{name} must be a list of key names, got {value!r}")
    return value


def _pairs(value: Any, name: str, fields: tuple[str, ...]) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{name} must be a non-empty list of {{{', '.join(fields)}}}")
    for i, pair in enumerate(value, 1):
        if not isinstance(pair, dict):
            raise ValueError(f"{name} {i} must be an object with {', '.join(map(repr, fields))}")
        key = pair.get(fields[0])
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"{name} {i} has no {fields[0]!r}; name the key")
    return value


def literal_value(text: str) -> Any:
    """The literal ``text`` spells (JSON or a Python literal), or ``text`` itself."""
    stripped = text.strip()
    if stripped.lower() in _LITERAL_WORDS:
        return _LITERAL_WORDS[stripped.lower()]
    number = to_number(stripped)
    if number is not None:
        return number
    if not stripped.startswith(("{", "[", "(", "'", '"')):
        return text
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    try:
        return _plain(ast.literal_eval(stripped))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _plain(value: Any) -> Any:
    """A Python literal as JSON can hold it: tuples and sets become lists, keys text."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(_plain(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, complex):
        return str(value)
    return value


def literal_eval_deep(value: Any) -> Any:
    """:func:`literal_value` applied to every text inside objects and lists."""
    if isinstance(value, dict):
        return {k: literal_eval_deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [literal_eval_deep(v) for v in value]
    if isinstance(value, str):
        return literal_value(value)
    return value


class DataOperationsParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.query: list[str] | str = []
        self.operations = "literal_eval"
        self.select_keys: list[str] = []
        self.filter_values: list[dict] = []
        self.updates: list[dict] = []
        self.remove_keys: list[str] = []
        self.rename_keys: list[dict] = []

    def check(self) -> None:
        query = self.query
        if not query and isinstance(self.inputs, list) and self.inputs:
            query = self.inputs
        if isinstance(query, str):
            query = [query] if query else []
        if not isinstance(query, list) or not query:
            raise ValueError("query must name the object(s) to work on, e.g. ['begin@profile']")
        for i, ref in enumerate(query, 1):
            require_ref(ref, f"query {i}:", "'begin@profile' or 'LLM:A@structured'")
        self.query = query
        self.operations = _operation_name(self.operations)
        self.check_choice("operations", OPERATIONS)
        op = self.operations
        if op == "select_keys":
            self.select_keys = _key_list(self.select_keys, "select_keys")
        elif op == "remove_keys":
            self.remove_keys = _key_list(self.remove_keys, "remove_keys")
        elif op == "rename_keys":
            _pairs(self.rename_keys, "rename_keys", ("old_key", "new_key"))
            for i, pair in enumerate(self.rename_keys, 1):
                if not isinstance(pair.get("new_key"), str) or not pair["new_key"].strip():
                    raise ValueError(f"rename_keys {i} has no 'new_key'; name the key to rename to")
        elif op == "append_or_update":
            _pairs(self.updates, "updates", ("key", "value"))
        elif op == "filter_values":
            _pairs(self.filter_values, "filter_values", ("key", "operator", "value"))
            for i, rule in enumerate(self.filter_values, 1):
                raw = rule.get("operator") or "="
                operator = canonical_operator(_FILTER_ALIASES.get(str(raw).strip().lower(), raw))
                if operator is None:
                    raise ValueError(f"filter_values {i}: {operator_error(raw)}")
                rule["operator"] = operator


@register
class DataOperations(ComponentBase):
    component_name = "DataOperations"
    side_effect_free = True
    param_class = DataOperationsParam

    def references(self) -> list[Ref]:
        # `query` is a list of bare references; `inputs` (legacy) may duplicate it.
        return super().references() + [parse_ref(ref) for ref in self._param.query]

    def _invoke(self, **kwargs: Any) -> None:
        objects = self._objects()
        self.set_output("result", getattr(self, f"_{self._param.operations}")(objects))

    def _objects(self) -> list[dict]:
        objects: list[dict] = []
        for ref in self._param.query:
            value = self.get_value(ref)
            if isinstance(value, LazyText):
                value = value.text
            self.inputs_seen[ref] = value
            if isinstance(value, str) and value.strip().startswith(("{", "[")):
                try:
                    value = json.loads(value)
                except ValueError:
                    raise self.fail(f"{ref!r} holds text that is not valid JSON: {value!r:.80}") from None
            if value is None or value == "":
                continue
            if isinstance(value, dict):
                objects.append(value)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if not isinstance(item, dict):
                        raise self.fail(
                            f"{ref!r} item {i} is {type(item).__name__} {item!r:.60}, not an object; "
                            f"DataOperations works on objects (use ListOperations for other lists)"
                        )
                objects.extend(value)
            else:
                raise self.fail(
                    f"{ref!r} holds {type(value).__name__} {value!r:.60}, not an object or a list of objects"
                )
        return objects

    def _select_keys(self, objects: list[dict]) -> list[dict]:
        keys = self._param.select_keys
        return [{k: obj[k] for k in keys if k in obj} for obj in objects]

    def _literal_eval(self, objects: list[dict]) -> list[dict]:
        return [literal_eval_deep(obj) for obj in objects]

    def _combine(self, objects: list[dict]) -> dict:
        combined: dict[str, Any] = {}
        seen_twice: set[str] = set()
        for obj in objects:
            for key, value in obj.items():
                if key not in combined:
                    combined[key] = value
                    continue
                if key not in seen_twice:
                    first = combined[key]
                    combined[key] = list(first) if isinstance(first, list) else [first]
                    seen_twice.add(key)
                combined[key].extend(value if isinstance(value, list) else [value])
        return combined

    def _filter_values(self, objects: list[dict]) -> list[dict]:
        rules = []
        for rule in self._param.filter_values:
            value = self.render_value(rule.get("value", ""))
            rules.append(
                (rule["key"], rule["operator"], value.text if isinstance(value, LazyText) else value)
            )
        return [obj for obj in objects if all(k in obj and compare(obj[k], op, v) for k, op, v in rules)]

    def _append_or_update(self, objects: list[dict]) -> list[dict]:
        updates = {}
        for item in self._param.updates:
            value = self.render_value(item.get("value"))
            updates[item["key"].strip()] = value.text if isinstance(value, LazyText) else value
        return [{**obj, **updates} for obj in objects]

    def _remove_keys(self, objects: list[dict]) -> list[dict]:
        drop = set(self._param.remove_keys)
        return [{k: v for k, v in obj.items() if k not in drop} for obj in objects]

    def _rename_keys(self, objects: list[dict]) -> list[dict]:
        results = []
        for obj in objects:
            new = dict(obj)
            for pair in self._param.rename_keys:
                old, to = pair["old_key"].strip(), pair["new_key"].strip()
                if old in new and old != to:
                    new[to] = new.pop(old)
            results.append(new)
        return results
