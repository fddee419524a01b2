"""Request parsing and reply shaping shared by the blueprints.

Views call these so that every route reads JSON, query flags and pages the same
way, and bad input gets the same clear :class:`~api.errors.ArgumentError`.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from flask import Request, Response, current_app, g, request
from flask.json.provider import DefaultJSONProvider
from werkzeug.datastructures import Headers
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge
from werkzeug.utils import get_content_type

from api.errors import SUCCESS, ArgumentError, headers_for, reply_for

#: The most messages one page of a transcript holds (``messages_page_size``).
MAX_TRANSCRIPT_PAGE_SIZE = 1000
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}
_TYPE_NAMES = {str: "text", bool: "a boolean", int: "an integer", dict: "an object", list: "a list"}


_STATUS_200 = ("200 OK", 200)
#: mimetype -> its Content-Type (the charset added where Werkzeug adds it): one app has one.
_CONTENT_TYPES: dict[str, str] = {}


class JsonReply(Response):
    """The response :class:`JsonReplies` makes: Flask's, handed to the server more directly.

    Werkzeug copies the headers and wraps the body in two iterators for every response,
    to fix up what this one does not hold (a ``Location``, a missing ``Content-Length``, a
    status without a body, a ``HEAD`` request) and to call its close hooks at the end. A
    reply with none of those (its body still the bytes it was made with, no
    ``call_on_close``) goes out as its header list and body list, the same status, headers
    and bytes; any other goes through Werkzeug.
    """

    @classmethod
    def of(cls, body: bytes, mimetype: str) -> JsonReply:
        """``cls(body, mimetype=mimetype)``, the reply's attributes set directly: Werkzeug's
        constructor takes every kind of body, status and header and checks each header
        twice as it sets it, five times the work (tests/api/test_app.py checks that both
        make the same reply)."""
        reply = cls.__new__(cls)
        headers = reply.headers = Headers()
        content_type = _CONTENT_TYPES.get(mimetype)
        if content_type is None:
            content_type = _CONTENT_TYPES[mimetype] = get_content_type(mimetype, "utf-8")
        # Known good values: neither holds a newline, which is what adding them checks.
        headers._list = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
        ]
        reply._status, reply._status_code = _STATUS_200
        reply.direct_passthrough = False
        reply._on_close = []
        reply.response = [body]
        return reply

    def __call__(self, environ: dict, start_response: Any) -> Any:
        body = self.response
        status = self.status_code
        if (
            type(body) is list
            and len(body) == 1
            and type(body[0]) is bytes
            and not self._on_close
            and not self.direct_passthrough
            and 200 <= status < 300
            and status != 204
            and environ.get("REQUEST_METHOD") != "HEAD"
        ):
            headers = self.headers.to_wsgi_list()
            names = [name.lower() for name, _ in headers]
            if "content-length" in names and "location" not in names and "content-location" not in names:
                start_response(self.status, headers)
                return body
        return super().__call__(environ, start_response)


class JsonReplies(DefaultJSONProvider):
    """The app's JSON replies (``jsonify``) written by orjson: the same text as Flask's
    compact form (keys in order, non-ASCII kept, a final newline), several times faster.

    What orjson would write differently or refuses (integers beyond 64 bits, lone
    surrogates, an object only Flask's ``default`` knows) goes through Flask's own
    provider; dates are written Flask's way. Floats may be spelled differently
    (``1e-7`` for ``1e-07``), the same numbers; ``NaN`` becomes ``null`` (JSON has no
    ``NaN``).
    """

    ensure_ascii = False
    sort_keys = False
    _OPTIONS = (
        orjson.OPT_NON_STR_KEYS
        | orjson.OPT_PASSTHROUGH_DATETIME
        | orjson.OPT_PASSTHROUGH_DATACLASS
        | orjson.OPT_APPEND_NEWLINE
    )

    def response(self, *args: Any, **kwargs: Any) -> Response:
        if (
            self.ensure_ascii
            or self.sort_keys
            or self.compact is False
            or (self.compact is None and self._app.debug)
        ):
            return super().response(*args, **kwargs)
        obj = args[0] if len(args) == 1 and not kwargs else self._prepare_response_obj(args, kwargs)
        try:
            body = orjson.dumps(obj, default=self.default, option=self._OPTIONS)
        except (TypeError, orjson.JSONEncodeError):
            return super().response(*args, **kwargs)
        if self._app.response_class is Response:
            return JsonReply.of(body, self.mimetype)
        return self._app.response_class(body, mimetype=self.mimetype)


def ok(data: Any = None, message: str = "success", **extra: Any) -> Response:
    """The success envelope (``extra`` adds top-level keys such as ``total``)."""
    return json_reply({"code": SUCCESS, "message": message, "data": data, **extra})


def json_reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``jsonify(body)`` with its HTTP status and extra headers set (the app's JSON provider,
    read without its proxy). Returned alone, Flask neither unpacks a tuple nor parses the
    status again."""
    reply = current_app._get_current_object().json.response(body)  # type: ignore[attr-defined]
    if status != 200:
        reply.status_code = status
    if headers:
        reply.headers.update(headers)
    return reply


def error_reply(exc: BaseException) -> Response:
    """The reply to ``exc``: its envelope, status and headers (:func:`api.errors.reply_for`)."""
    body, status = reply_for(exc)
    return json_reply(body, status, headers_for(exc))


def _body_bytes(req: Request) -> bytes:
    """The body of ``req`` (the current request); one sent chunked over
    ``MAX_CONTENT_LENGTH`` is refused, not cut short."""
    limit = current_app._get_current_object().config.get("MAX_CONTENT_LENGTH")  # type: ignore[attr-defined]
    environ = req.environ
    length = environ.get("CONTENT_LENGTH")
    if (
        length
        and length.isdigit()
        and length.isascii()
        and "HTTP_TRANSFER_ENCODING" not in environ
        and getattr(req, "_cached_data", None) is None
    ):
        # The common case, a body of a given length: read at once, without Werkzeug's
        # stream wrappers, and kept as request.get_data() keeps it for any later reader.
        size = int(length)
        if limit is not None and size > limit:
            raise RequestEntityTooLarge()
        raw = environ["wsgi.input"].read(size) if size else b""
        if len(raw) < size and "wsgi.input_terminated" not in environ:
            raise ClientDisconnected()  # as Werkzeug's stream says it
        req._cached_data = raw
        return raw
    raw = req.get_data(cache=True)
    # A chunked body has no Content-Length to refuse it by up front, and Werkzeug stops
    # reading it at the limit without saying so: a body that fills the limit and still
    # has bytes to come is too large (413), not malformed JSON.
    if (
        limit is not None
        and req.content_length is None
        and len(raw) >= limit
        and environ["wsgi.input"].read(1)
    ):
        raise RequestEntityTooLarge()
    return raw


def json_body(required: bool = True) -> dict:
    """The request's JSON object; an absent body is ``{}`` unless ``required``.

    The one place request bodies are parsed, so the one place bad input is refused
    with a 400 naming the field: nesting deeper than :data:`MAX_JSON_DEPTH`, a lone
    UTF-16 surrogate (``"\\ud800"``: no database can store it), an integer outside
    64 bits, ``NaN``/``Infinity``.
    """
    # The request itself, not its proxy: each attribute read through ``request`` is a
    # context lookup, and this runs on every request with a body.
    req = request._get_current_object()  # type: ignore[attr-defined]
    environ = req.environ
    parsed = environ.get(_PARSED)
    if parsed is not None:  # parsed once per request (the schema check reads it first)
        return parsed
    raw = _body_bytes(req)
    body = parse_json_object(raw, required)
    if raw.strip():  # an absent body is not kept: the view may require one
        environ[_PARSED] = body
    return body


def parse_json_object(raw: bytes, required: bool = True) -> dict:
    """The JSON object a request body ``raw`` holds, checked as :func:`json_body` says
    (``{}`` for an empty body unless ``required``)."""
    if not raw.strip():
        if required:
            raise ArgumentError("the request needs a JSON object body (Content-Type: application/json)")
        return {}
    if _too_deep(raw):
        raise ArgumentError(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep")
    body = _parsed_fast(raw)
    if body is _UNPARSED:
        body = _parsed_checked(raw)
    if not isinstance(body, dict):
        raise ArgumentError(f"the request body must be a JSON object, got {json_type(body)}")
    if _SURROGATE_ESCAPE.search(raw):
        problem = _bad_value_message(body)
        if problem:
            raise ArgumentError(problem)
    return body


_PARSED = "agentcanvas.json_body"
_UNPARSED = object()
# 19 digits in a row: a number that may not fit in 64 bits (orjson reads some as floats).
# Looked for as 19 zeros in the body with every digit made "0" and every other byte " ":
# one translation and one substring search, in C; the regular expression [0-9]{19} tried
# a match at every digit: ~19k instructions for a completion body of 93 or 145 bytes,
# against ~4k (cachegrind).
_DIGITS_AS_ZEROS = bytes(b"0"[0] if b in b"0123456789" else b" "[0] for b in range(256))
_LONG_DIGITS = b"0" * 19


def _parsed_fast(raw: bytes) -> Any:
    """orjson's reading of a body the checked path would read the same way, else ``_UNPARSED``.

    orjson refuses what the checked path refuses or names (``NaN``, lone surrogates,
    bad UTF-8, a BOM) and reads the rest alike; only long numbers need a look first.
    """
    if _LONG_DIGITS in raw.translate(_DIGITS_AS_ZEROS):
        return _UNPARSED
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _UNPARSED


def _parsed_checked(raw: bytes) -> Any:
    """The standard library's reading, every number checked; errors in its words."""
    try:
        return json.loads(raw, parse_int=_checked_int, parse_constant=_refused_constant)
    except _OutOfRange:
        body = json.loads(raw)  # again, to name the field
        raise ArgumentError(
            _bad_value_message(body) or "the request body holds a number out of range"
        ) from None
    except RecursionError:
        raise ArgumentError(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as exc:
        raise ArgumentError(f"the request body is not valid JSON: {exc}") from None


#: The deepest nesting of a request body (objects and lists).
MAX_JSON_DEPTH = 64
_INT_RANGE = 2**63
# A JSON escape of a UTF-16 surrogate; a valid pair decodes to one character, a lone one stays.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


class _OutOfRange(ValueError):
    pass


def _checked_int(text: str) -> int:
    value = int(text)
    if not -_INT_RANGE <= value < _INT_RANGE:
        raise _OutOfRange(text)
    return value


def _refused_constant(name: str) -> Any:
    raise ArgumentError(f"the request body holds {name}, which JSON does not allow; send a number or null")


def _too_deep(raw: bytes) -> bool:
    """Whether brackets nest deeper than allowed, counted without parsing: strings cut
    out, then the running depth of the remaining brackets (all in C, no Python loop)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > MAX_JSON_DEPTH


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]


def _bad_value_message(value: Any, path: str = "") -> str | None:
    """What is wrong with the first unstorable value in ``value``, naming its field."""
    where = path or "the request body"
    if isinstance(value, str):
        if _SURROGATE.search(value):
            return f"{where!r} holds a lone UTF-16 surrogate, which is not valid Unicode text"
    elif isinstance(value, bool):
        return None
    elif isinstance(value, int):
        if not -_INT_RANGE <= value < _INT_RANGE:
            return f"{where!r} is out of range: whole numbers must fit in 64 bits"
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{key}" if path else str(key)
            problem = _bad_value_message(key, name) or _bad_value_message(item, name)
            if problem:
                return problem
    elif isinstance(value, list):
        for n, item in enumerate(value):
            problem = _bad_value_message(item, f"{path}[{n}]")
            if problem:
                return problem
    return None


def wsgi_text(value: str) -> str:
    """A WSGI environ string (bytes carried as latin-1, PEP 3333) as the text it encodes in
    UTF-8, undecodable bytes replaced: how Werkzeug reads a request's path and query."""
    return value.encode("latin1").decode(errors="replace")


def json_type(value: Any) -> str:
    """How a JSON value is named in error messages ("text", "a number", "null", ...)."""
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
        raise ArgumentError(f"{name!r} must be {expected}, got {json_type(value)}")
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


#: The largest number a query parameter may hold (a page number, say).
MAX_ARG_INT = 10**9


def arg_int(name: str, default: int, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole-number query parameter, between ``minimum`` and ``maximum`` (at most
    :data:`MAX_ARG_INT`, so no database is asked for an offset it cannot hold)."""
    raw = request.args.get(name)
    if raw in (None, ""):
        return default
    maximum = MAX_ARG_INT if maximum is None else min(maximum, MAX_ARG_INT)
    text = raw.strip()
    if len(text) > 12 or not text.lstrip("+-").isdigit():
        if text.lstrip("+-").isdigit():
            raise ArgumentError(
                f"query parameter {name!r} must be between {minimum} and {maximum}, got {raw!r}"
            )
        raise ArgumentError(f"query parameter {name!r} must be a whole number, got {raw[:40]!r}")
    value = int(text)
    if value < minimum or value > maximum:
        raise ArgumentError(f"query parameter {name!r} must be between {minimum} and {maximum}, got {value}")
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
    return g._get_current_object().tenant_id  # type: ignore[attr-defined]


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
