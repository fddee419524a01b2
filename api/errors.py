"""Errors of the API and the one place that maps every error to a reply.

A reply is RAGFlow's envelope ``{"code", "message", "data"}`` with a matching HTTP
status. :func:`reply_for` knows our own :class:`ApiError` tree, the runtime's
``agent.errors`` types and werkzeug's HTTP errors; anything else is a 500 whose
message does not leak internals.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from peewee import InterfaceError, OperationalError, PeeweeException

from agent import errors as agent_errors
from api.db.cluster import write_conflict
from api.telemetry import metrics

if TYPE_CHECKING:
    from werkzeug.exceptions import HTTPException

log = logging.getLogger("agentcanvas.api")

# RAGFlow's envelope codes.
SUCCESS = 0
EXCEPTION_ERROR = 100
ARGUMENT_ERROR = 101
DATA_ERROR = 102
OPERATING_ERROR = 103
RUNNING = 106
AUTHENTICATION_ERROR = 109  # what RAGFlow (and ragflow-sdk 0.22's server) answered a bad token with
UNAUTHORIZED = 401  # what current RAGFlow answers a missing or bad token with
NOT_FOUND = 404  # current RAGFlow's code for a route that does not exist


#: What a client is told to wait before retrying after a database outage.
RETRY_AFTER_SECONDS = 2
WRITE_CONFLICT_MESSAGE = (
    "a concurrent request changed the same data first and this one was rolled back, nothing of it "
    "was saved; send it again"
)
UNAVAILABLE_MESSAGE = (
    "the service is briefly unavailable (its database cannot be reached); retry in a few seconds"
)
#: Turn errors the API itself reports (``error_type`` of the ending event): (code, HTTP status).
_TURN_STORE_ERRORS = {"TurnNotSaved": (EXCEPTION_ERROR, 503), "TurnOutcomeUnknown": (EXCEPTION_ERROR, 503)}


class ApiError(Exception):
    """Root of the errors the API answers on purpose."""

    code = EXCEPTION_ERROR
    status = 500

    def __init__(self, message: str, data: Any = None):
        super().__init__(message)
        self.message = message
        self.data = data


class ArgumentError(ApiError):
    code, status = ARGUMENT_ERROR, 400


class NotFound(ApiError):
    code, status = DATA_ERROR, 404


class Forbidden(ApiError):
    code, status = OPERATING_ERROR, 403


class Conflict(ApiError):
    """A unique name already taken (an agent title)."""

    code, status = DATA_ERROR, 409


class Busy(ApiError):
    """Another turn holds the session."""

    code, status = RUNNING, 409


class AuthError(ApiError):
    code, status = UNAUTHORIZED, 401


class RateLimited(ApiError):
    """Over a rate limit (api.ratelimit): HTTP 429 with ``Retry-After``."""

    code, status = OPERATING_ERROR, 429

    def __init__(self, message: str, retry_after: int):
        super().__init__(message, {"retry_after": retry_after})
        self.headers = {"Retry-After": str(retry_after)}


class Unavailable(ApiError):
    """The database cannot be reached for now: HTTP 503 with ``Retry-After``.

    The message never carries driver text (host, port, user): embed visitors see it.
    """

    code, status = EXCEPTION_ERROR, 503

    def __init__(self, message: str = "", retry_after: int = RETRY_AFTER_SECONDS):
        super().__init__(message or UNAVAILABLE_MESSAGE)
        self.headers = {"Retry-After": str(retry_after)}


class TooLarge(ApiError):
    code, status = ARGUMENT_ERROR, 413


class TranscriptFull(TooLarge):
    """The session's stored transcript reached ``session.max_transcript_bytes``."""


# Runtime errors, most specific first: (type, code, HTTP status).
_AGENT_ERRORS: tuple[tuple[type[BaseException], int, int], ...] = (
    (agent_errors.InputError, ARGUMENT_ERROR, 400),
    (agent_errors.DSLError, ARGUMENT_ERROR, 400),
    (agent_errors.UsageError, ARGUMENT_ERROR, 400),
    (agent_errors.SnapshotTooLarge, ARGUMENT_ERROR, 413),
    (agent_errors.LimitError, ARGUMENT_ERROR, 400),
    (agent_errors.LLMTimeout, EXCEPTION_ERROR, 504),
    (agent_errors.LLMError, EXCEPTION_ERROR, 502),
    (agent_errors.CanvasError, EXCEPTION_ERROR, 500),
)


def http_status_for_type(error_type: type[BaseException] | None) -> tuple[int, int]:
    """``(code, HTTP status)`` for an error class (``None`` or unknown: 100/500)."""
    if error_type is not None:
        if issubclass(error_type, ApiError):
            return error_type.code, error_type.status
        for cls, code, status in _AGENT_ERRORS:
            if issubclass(error_type, cls):
                return code, status
    return EXCEPTION_ERROR, 500


def http_status_for_name(error_type: str | None) -> tuple[int, int]:
    """The same for an error named in a ``workflow_finished`` event's ``error_type``."""
    if error_type in _TURN_STORE_ERRORS:
        return _TURN_STORE_ERRORS[error_type]
    cls = getattr(agent_errors, error_type or "", None)
    return http_status_for_type(cls if isinstance(cls, type) else None)


def turn_failure_status(status: str, error_type: str | None) -> tuple[int, int]:
    """``(code, HTTP status)`` of a turn that ended ``failed`` or ``cancelled``.

    A cancelled turn is 103/409 (stopped on request, not a server fault); a failed one
    is 100 with 502/504 when an LLM provider failed or timed out, else 500.
    """
    if status == "cancelled":
        return OPERATING_ERROR, 409
    _, http_status = http_status_for_name(error_type)
    return (EXCEPTION_ERROR, http_status if http_status >= 500 else 500)


def reply_for(exc: BaseException) -> tuple[dict, int]:
    """The envelope and HTTP status answering ``exc``."""
    _count(exc)
    if isinstance(exc, ApiError):
        return envelope(exc.code, exc.message, exc.data), exc.status
    if isinstance(exc, agent_errors.InputError):
        code, status = http_status_for_type(type(exc))
        return envelope(code, str(exc), {"errors": exc.errors}), status
    if isinstance(exc, agent_errors.CanvasError):
        code, status = http_status_for_type(type(exc))
        return envelope(code, str(exc)), status
    if _is_http_exception(exc):
        return _http_reply(exc)
    if isinstance(exc, PeeweeException) and write_conflict(exc):
        # A deadlock or a Galera certification failure that outlived the retries.
        log.warning("write conflict: %s", exc)
        return envelope(RUNNING, WRITE_CONFLICT_MESSAGE), 409
    if is_outage(exc):
        log.warning("database unavailable: %s", exc)
        return envelope(EXCEPTION_ERROR, UNAVAILABLE_MESSAGE), 503
    if isinstance(exc, PeeweeException):
        log.exception("database error")
        return envelope(
            EXCEPTION_ERROR, "database error; the request was not completed (see the server log)"
        ), 500
    log.exception("unexpected error")
    return envelope(EXCEPTION_ERROR, f"internal error ({type(exc).__name__}); see the server log"), 500


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached or used for now (a 503).

    Not a write conflict (:func:`api.db.cluster.write_conflict`): that is a 409, the
    request lost a race and is to be sent again.
    """
    return isinstance(exc, (OperationalError, InterfaceError)) and not write_conflict(exc)


def retry_headers(status: int) -> dict[str, str]:
    """``Retry-After`` for a 503 reply (the database was briefly out of reach), else nothing."""
    return {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else {}


def headers_for(exc: BaseException) -> dict[str, str]:
    """The headers of the reply to ``exc`` (``Retry-After`` for 429 and 503, and 1 s for
    a write conflict's 409)."""
    if isinstance(exc, ApiError):
        return dict(getattr(exc, "headers", None) or {})
    if is_outage(exc):
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if isinstance(exc, PeeweeException) and write_conflict(exc):
        return {"Retry-After": "1"}
    return {}


def _count(exc: BaseException) -> None:
    """The metrics of answers worth watching: busy sessions and database errors."""
    if isinstance(exc, Busy):
        metrics().busy.inc()
    elif isinstance(exc, PeeweeException):
        metrics().db_errors.labels("request").inc()


def _is_http_exception(exc: BaseException) -> bool:
    """Whether ``exc`` is Werkzeug's ``HTTPException``, without importing Werkzeug here
    (a command that needs only the database starts without it): such an exception exists
    only once Werkzeug is loaded."""
    exceptions = sys.modules.get("werkzeug.exceptions")
    return exceptions is not None and isinstance(exc, exceptions.HTTPException)


def _http_reply(exc: HTTPException) -> tuple[dict, int]:
    from flask import has_request_context, request

    status = exc.code or 500
    if status == 413:
        return envelope(ARGUMENT_ERROR, exc.description or "the request body is too large"), 413
    if status == 404:
        # As current RAGFlow: the path named, and ``error`` beside the envelope.
        path = request.path if has_request_context() else ""
        reply = envelope(
            NOT_FOUND, f"Not Found: {path} is no route; the API lives under /api/v1 (see README)"
        )
        return {**reply, "error": "Not Found"}, 404
    if status == 405:
        allowed = ", ".join(sorted(getattr(exc, "valid_methods", None) or ()))
        return envelope(
            ARGUMENT_ERROR, f"method not allowed on this route; use {allowed or 'another method'}"
        ), 405
    code = ARGUMENT_ERROR if 400 <= status < 500 else EXCEPTION_ERROR
    return envelope(code, exc.description or exc.name), status


def envelope(code: int, message: str, data: Any = None) -> dict:
    return {"code": code, "message": message, "data": data}
