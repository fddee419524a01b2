"""Form definitions (Begin and UserFillUp) and the checking of answers.

A form is ``{key: {"name": label, "type": t, "optional": bool, "options": [...], "value": default}}``
with ``t`` one of :data:`FIELD_TYPES`. RAGFlow also writes forms as a list of fields
each carrying its ``key``; :func:`normalize_form` accepts both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from agent.files import file_refs

FIELD_TYPES = ("line", "paragraph", "options", "integer", "float", "boolean", "object", "file")
_TRUE = {"true", "yes", "y", "on", "1"}
_FALSE = {"false", "no", "n", "off", "0"}
_DEF_KEYS = {"value", "type", "name", "optional", "options", "key", "description"}
MAX_VALUE_BYTES = 64 * 1024


def normalize_form(form: Any, where: str) -> dict[str, dict]:
    """The form as ``{key: field}``; raises ``ValueError`` naming the bad field."""
    if form is None or form == []:
        return {}
    if isinstance(form, list):
        out = {}
        for i, field in enumerate(form):
            if not isinstance(field, dict) or not field.get("key"):
                raise ValueError(f"{where}: field {i} needs a 'key'")
            out[field["key"]] = field
        form = out
    if not isinstance(form, dict):
        raise ValueError(f"{where}: the form must be an object of fields, got {type(form).__name__}")
    for key, field in form.items():
        if not isinstance(field, dict):
            raise ValueError(f"{where}: field {key!r} must be an object with 'type' and 'name'")
        ftype = field.get("type", "line")
        if ftype not in FIELD_TYPES:
            raise ValueError(
                f"{where}: field {key!r} has unknown type {ftype!r}; use one of {', '.join(FIELD_TYPES)}"
            )
        if ftype == "options" and not isinstance(field.get("options"), list):
            raise ValueError(f"{where}: field {key!r} of type 'options' needs an 'options' list")
    return form


def value_size(value: Any) -> int:
    """An answer's size as the limit counts it: UTF-8 bytes of text, else its JSON's length."""
    if isinstance(value, str):
        return len(value.encode())
    if value is None or isinstance(value, (bool, int, float)):
        return 0  # a number is never near the limit; no JSON text needed
    try:
        return len(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return 0


def is_optional(field: dict) -> bool:
    return bool(field.get("optional", False))


def _unwrap(field: dict, raw: Any) -> Any:
    """Accept ``value`` and ``{"value": value, ...}`` (RAGFlow clients send the latter)."""
    if isinstance(raw, dict) and "value" in raw:
        if field.get("type") != "object" or set(raw) <= _DEF_KEYS:
            return raw["value"]
    return raw


def convert(field: dict, value: Any) -> Any:
    """Convert one answer to its field's type; raises ``ValueError`` with the reason."""
    ftype = field.get("type", "line")
    if ftype in ("line", "paragraph"):
        if isinstance(value, (dict, list)):
            raise ValueError("expected text, got an object")
        if isinstance(value, bool):
            value = "true" if value else "false"
        text = "" if value is None else str(value)
        if ftype == "line" and ("\n" in text.strip()):
            raise ValueError("expected a single line of text")
        return text
    if ftype == "options":
        options = field.get("options") or []
        if value not in options:
            shown = ", ".join(repr(o) for o in options[:10])
            raise ValueError(f"{value!r} is not one of the options ({shown})")
        return value
    if ftype == "integer":
        if isinstance(value, bool):
            raise ValueError("expected an integer, got a boolean")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ValueError(f"expected an integer, got {value!r}")
    if ftype == "float":
        if isinstance(value, bool):
            raise ValueError("expected a number, got a boolean")
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"expected a finite number, got {value!r}")
        return number
    if ftype == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, str)) and str(value).strip().lower() in _TRUE | _FALSE:
            return str(value).strip().lower() in _TRUE
        raise ValueError(f"expected true or false, got {value!r}")
    if ftype == "object":
        if isinstance(value, (dict, list)):
            return value
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as e:
                raise ValueError(f"expected JSON: {e}") from None
        raise ValueError(f"expected a JSON object, got {value!r}")
    # file: uploaded files' ids or descriptors, as a list (resolved by check_answers).
    return file_refs(value)


def check_answers(
    form: dict[str, dict],
    answers: Any,
    max_bytes: int = MAX_VALUE_BYTES,
    resolve_files: Callable[[list], list] | None = None,
) -> tuple[dict, dict]:
    """Check a client's answers against a form without changing anything.

    Args:
        resolve_files: turns a ``file`` field's ids/descriptors into checked
            descriptors, raising ``ValueError`` with the reason (see
            :meth:`agent.canvas.Canvas.resolve_files`); without it they are kept as given.

    Returns:
        ``(accepted, errors)``: the converted values and ``{field: message}``.
    """
    if answers is None:
        return {}, {}
    if not isinstance(answers, dict):
        return {}, {"inputs": f"expected an object of field answers, got {type(answers).__name__}"}
    accepted, errors = {}, {}
    for key, raw in answers.items():
        field = form.get(key)
        if field is None:
            known = ", ".join(sorted(form)) or "none"
            errors[key] = f"the form has no field {key!r} (fields: {known})"
            continue
        value = _unwrap(field, raw)
        # A text of n characters is at most 4n bytes: a short one needs no measuring.
        if type(value) is not str or len(value) > max_bytes // 4:
            size = value_size(value)
            if size > max_bytes:
                errors[key] = f"value is {size} bytes; the limit is {max_bytes}"
                continue
        if value is None or value == "":
            if not is_optional(field):
                errors[key] = "a value is required"
            continue
        try:
            converted = convert(field, value)
            if field.get("type") == "file" and resolve_files is not None:
                converted = resolve_files(converted)
            accepted[key] = converted
        except ValueError as e:
            errors[key] = str(e)
    return accepted, errors


def missing_required(form: dict[str, dict], values: dict) -> list[str]:
    """Required fields that have neither an answer nor a default value."""
    return [
        k
        for k, f in form.items()
        if not is_optional(f) and values.get(k) in (None, "") and f.get("value") in (None, "")
    ]


def public_form(form: dict[str, dict], only: list[str] | None = None) -> dict[str, dict]:
    """The form as sent in a ``user_inputs`` event (each field with its ``optional`` flag)."""
    keys = form if only is None else only
    out = {}
    for k in keys:
        f = dict(form[k])
        f.setdefault("name", k)
        f.setdefault("type", "line")
        f["optional"] = is_optional(f)
        out[k] = f
    return out


def final_values(form: dict[str, dict], answers: dict) -> dict:
    """Answers completed with each field's default (converted) or ``None``."""
    out = {}
    for k, f in form.items():
        if k in answers:
            out[k] = answers[k]
        elif f.get("value") not in (None, ""):
            try:
                out[k] = convert(f, f["value"])
            except ValueError:
                out[k] = f["value"]
        else:
            out[k] = None
    return out
