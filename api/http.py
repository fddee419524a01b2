"""Request parsing and reply shaping shared by the blueprints.

Views call these so that every route reads JSON, query flags and pages the same
way, and bad input gets the same clear :class:`~api.errors.ArgumentError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from flask import Response, current_app, g, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from api.errors import SUCCESS, ArgumentError

#: The most messages one page of a transcript holds (``messages_page_size``).
MAX_TRANSCRIPT_PAGE_SIZE = 1000
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}
_TYPE_NAMES = {str: "text", bool: "a boolean", int: "an integer", dict: "an object", list: "a list"}


def ok(data: Any = None, message: str = "success", **extra: Any) -> Response:
    """The success envelope (``extra`` adds top-level keys such as ``total``)."""
    return jsonify({"code": SUCCESS, "message": message, "data": data, **extra})


def _body_bytes() -> bytes:
    """The request body; one sent chunked over ``MAX_CONTENT_LENGTH`` is refused, not cut short."""
    raw = request.get_data(cache=True)
    limit = current_app.config.get("MAX_CONTENT_LENGTH")
    # A chunked body has no Content-Length to refuse it by up front, and Werkzeug stops
    # reading it at the limit without saying so: a body that fills the limit and still
    # has bytes to come is too large (413), not malformed JSON.
    if (
        limit is not None
        and request.content_length is None
        and len(raw) >= limit
        and request.environ["wsgi.input"].read(1)
    ):
        raise RequestEntityTooLarge()
    return raw


def json_body(required: bool = True) -> dict:
    """The request's JSON object; an absent body is ``{}`` unless ``required``."""
    raw = _body_bytes()
    if not raw.strip():
        if required:
            raise ArgumentError("the request needs a JSON object body (Content-Type: application/json)")
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ArgumentError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ArgumentError(f"the request body must be a JSON object, got {_json_type(body)}")
    return body


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def field(
    body: dict,
    name: str,
    kind: type | tuple[type, ...],
    *,
    required: bool = False,
    default: Any = None,
    max_length: int | None = None,
) -> Any:
    """``body[name]`` checked against ``kind`` (and ``max_length`` for text); ``null`` counts as absent."""
    value = body.get(name)
    if value is None:
        if required:
            raise ArgumentError(f"{name!r} is required")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    wrong_bool = isinstance(value, bool) and bool not in kinds
    if wrong_bool or not isinstance(value, kinds):
        expected = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise ArgumentError(f"{name!r} must be {expected}, got {_json_type(value)}")
    if max_length is not None and isinstance(value, str) and len(value) > max_length:
        raise ArgumentError(f"{name!r} is {len(value)} characters long; the limit is {max_length}")
    return value


def flag(value: Any, name: str, default: bool = False) -> bool:
    """A boolean given as JSON ``true``/``false`` or as text (``"True"``, ``"false"``, ``"1"``)."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ArgumentError(f"{name!r} must be true or false, got {value!r}")


def arg_flag(name: str, default: bool = False) -> bool:
    return flag(request.args.get(name), name, default)


def arg_int(name: str, default: int, minimum: int = 1, maximum: int | None = None) -> int:
    raw = request.args.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ArgumentError(f"query parameter {name!r} must be a whole number, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ArgumentError(f"query parameter {name!r} must be {bound}, got {value}")
    return value


def page_args(default_size: int = 30) -> tuple[int, int]:
    """``(page, page_size)`` from the query; page size capped by ``PAGE_SIZE``."""
    cap = int(current_app.config["PAGE_SIZE"])
    return arg_int("page", 1), arg_int("page_size", min(default_size, cap), maximum=cap)


def transcript_page_args() -> tuple[int, int]:
    """``(messages_page, messages_page_size)``: which page of a transcript to answer.

    The page size defaults to ``PAGE_SIZE`` (100) and is at most
    :data:`MAX_TRANSCRIPT_PAGE_SIZE`.
    """
    size = arg_int(
        "messages_page_size", int(current_app.config["PAGE_SIZE"]), maximum=MAX_TRANSCRIPT_PAGE_SIZE
    )
    return arg_int("messages_page", 1, maximum=10**9), size


def order_args(allowed: Iterable[str], default: str) -> tuple[str, bool]:
    """``(orderby, desc)``; ``orderby`` must be one of ``allowed``."""
    allowed = tuple(allowed)
    orderby = request.args.get("orderby") or default
    if orderby not in allowed:
        raise ArgumentError(f"orderby {orderby!r} is not one of {', '.join(allowed)}")
    return orderby, arg_flag("desc", True)


def tenant_id() -> str:
    """The authenticated caller's tenant (set by :mod:`api.auth`)."""
    return g.tenant_id


def sse_frame(payload: Any) -> str:
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, default=str)
    return f"data:{text}\n\n"


def sse_response(frames: Iterator[str]) -> Response:
    """A server-sent-events reply that proxies must not buffer."""
    response = Response(frames, mimetype="text/event-stream")
    response.headers["Content-Type"] = "text/event-stream; charset=utf-8"
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    return response
