"""``/api/v1/agents/<id>/completions`` and ``/api/v1/agents/chat/completions``.

Streamed replies are server-sent events ``data:<event json>`` ending with
``data:[DONE]``. Without ``return_trace`` they carry only what RAGFlow's clients
read: ``message`` chunks, then ``message_end`` or ``user_inputs`` (the form), or the
``workflow_finished`` event of a failed turn (its ``data.content`` is the error).
A form's tips and a failure's error are also sent as a ``message`` chunk followed
by ``message_end`` just before that ending event: ragflow-sdk 0.27 shows only
``message`` chunks (it would show neither), and 0.22 stops reading at
``message_end`` (so it shows the text once, not twice).
:func:`sse_reply` and :func:`blocking_reply` are shared with the other completion
routes (embed, OpenAI-compatible).
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from flask import Blueprint, Flask, Response, g
from flask.typing import ResponseReturnValue
from pydantic import Field
from werkzeug.exceptions import HTTPException, InternalServerError

from api.auth import authenticate, bearer_token, require_api_token
from api.blueprints.openai_compat import OpenAIChatBody, openai_error_shape, openai_reply
from api.errors import SUCCESS, ArgumentError, envelope, retry_headers, turn_failure_status
from api.http import (
    error_reply,
    field,
    flag,
    json_body,
    json_reply,
    parse_json_object,
    sse_frame,
    sse_response,
    tenant_id,
    wsgi_text,
)
from api.openapi import Body, fits, plain_fields, spec
from api.services.turns import Turn, TurnRequest, blocking_event, turn_service

log = logging.getLogger(__name__)
bp = Blueprint("completions", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)

_DEFAULT_EVENTS = frozenset({"message", "message_end", "user_inputs"})

Flag = bool | str | int | None


class CompletionBody(Body):
    """One turn: ``question`` (or ``query``); without ``session_id`` a new session is made;
    ``inputs`` answer a paused form (``{field: value}`` or ``{field: {"value": value}}``)."""

    question: str | None = None
    query: str | None = None
    stream: Flag = None
    session_id: str | None = None
    inputs: dict | None = None
    user_id: str | None = None
    files: list | None = None
    return_trace: Flag = None


class ChatCompletionBody(CompletionBody):
    # Required, checked by the view in RAGFlow's words ("`agent_id` is required").
    agent_id: str | None = Field(default=None, description="required: the agent to run")
    openai_compatible: Flag = Field(default=None, alias="openai-compatible")


class RewindBody(Body):
    stream: Flag = None
    return_trace: Flag = None
    user_id: str | None = None


def _shown(event: dict, return_trace: bool) -> bool:
    if return_trace or event["event"] in _DEFAULT_EVENTS:
        return True
    return event["event"] == "workflow_finished" and event["data"].get("status") != "succeeded"


def _ending_text(event: dict) -> str:
    """The text a form pause or a failure shows the user; empty for any other event."""
    data = event.get("data") or {}
    if event["event"] == "user_inputs" or (
        event["event"] == "workflow_finished" and data.get("status") != "succeeded"
    ):
        return str(data.get("content") or data.get("tips") or data.get("error") or "")
    return ""


def sse_reply(turn: Turn, return_trace: bool = False, sdk_text: bool = False) -> Response:
    """Stream the turn's events. A client that goes away stops only the reading.

    ``sdk_text``: send a form's tips or a failure's error as a ``message`` chunk and a
    ``message_end`` before the ending event, for ragflow-sdk (see the module docstring).
    """

    def frames() -> Iterator[str]:
        for event in turn.events():
            if not _shown(event, return_trace):
                continue
            text = _ending_text(event) if sdk_text else ""
            if text:
                ids = {
                    k: event[k] for k in ("message_id", "created_at", "task_id", "session_id") if k in event
                }
                yield sse_frame({"event": "message", **ids, "data": {"content": text}})
                yield sse_frame({"event": "message_end", **ids, "data": {}})
            yield sse_frame(event)
        yield sse_frame("[DONE]")

    return sse_response(frames())


def blocking_reply(turn: Turn) -> Response:
    """Wait for the committed end of the turn; ``data`` is its ending event."""
    result = turn.wait()
    event = blocking_event(result, turn.session_id)
    if result.status in ("succeeded", "paused"):
        return json_reply(envelope(SUCCESS, "success", event))
    code, status = turn_failure_status(result.status, result.error_type)
    return json_reply(envelope(code, result.error or "the turn failed", event), status, retry_headers(status))


def custom_header(body: dict) -> dict[str, str] | None:
    """RAGFlow's ``custom_header``: HTTP headers for the turn's MCP tool calls.

    Handed to the canvas as the ``custom_header`` service for this turn only: it is
    never stored (RAGFlow keeps it in the session, secrets included).
    """
    headers = body.get("custom_header")
    if headers in (None, ""):
        return None
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ArgumentError("'custom_header' must be an object of header names and text values")
    return headers


def turn_request(agent_id: str, body: dict, invoke_from: str = "api") -> TurnRequest:
    """Read a RAGFlow completion body (``question``/``query``, ``session_id``, ``inputs``...)
    of the authenticated caller's tenant."""
    headers = custom_header(body)
    # RAGFlow's SDK sends "question"; its HTTP docs say "query".
    query = field(body, "question" if body.get("question") is not None else "query", str, default="")
    return TurnRequest(
        tenant_id=tenant_id(),
        agent_id=agent_id,
        session_id=field(body, "session_id", str),
        query=query,
        inputs=field(body, "inputs", dict),
        files=field(body, "files", list),
        user_id=field(body, "user_id", str, default="", max_length=255),
        invoke_from=invoke_from,
        session_name=field(body, "name", str, default="", max_length=255),
        release=flag(body.get("release"), "release"),
        services={"custom_header": headers} if headers else None,
    )


def _complete(agent_id: str, body: dict) -> ResponseReturnValue:
    req = turn_request(agent_id, body)
    stream = flag(body.get("stream"), "stream", default=True)
    return_trace = flag(body.get("return_trace"), "return_trace", default=False)
    req.trace = return_trace  # without it the stream shows no node event: none is made
    turn = turn_service().start(req, inline=not stream)
    if stream:
        return sse_reply(turn, return_trace, sdk_text=not return_trace)
    return blocking_reply(turn)


def _rewind_request(agent_id: str, session_id: str, body: dict) -> TurnRequest:
    return TurnRequest(
        tenant_id=tenant_id(),
        agent_id=agent_id,
        session_id=session_id,
        user_id=field(body, "user_id", str, default="", max_length=255),
    )


@bp.post("/agents/<agent_id>/sessions/<session_id>/regenerate")
@spec.validate(json=RewindBody, tags=["completions"])
def regenerate(agent_id: str, session_id: str) -> ResponseReturnValue:
    """Run the last turn again from the state before it; replies as a completion."""
    body = json_body(required=False)
    stream = flag(body.get("stream"), "stream", default=True)
    return_trace = flag(body.get("return_trace"), "return_trace", default=False)
    req = _rewind_request(agent_id, session_id, body)
    req.trace = return_trace  # as for a completion
    turn = turn_service().regenerate(req, inline=not stream)
    return sse_reply(turn, return_trace) if stream else blocking_reply(turn)


@bp.post("/agents/<agent_id>/sessions/<session_id>/undo")
@spec.validate(json=RewindBody, tags=["completions"])
def undo(agent_id: str, session_id: str) -> ResponseReturnValue:
    """Restore the state before the last turn; replies as a completion (``message_end``)."""
    body = json_body(required=False)
    stream = flag(body.get("stream"), "stream", default=True)
    turn = turn_service().undo(_rewind_request(agent_id, session_id, body))
    return sse_reply(turn) if stream else blocking_reply(turn)


@bp.post("/agents/<agent_id>/completions")
@spec.validate(json=CompletionBody, tags=["completions"])
def agent_completions(agent_id: str) -> ResponseReturnValue:
    return _complete(agent_id, json_body())


@bp.post("/agents/chat/completions")
@spec.validate(json=ChatCompletionBody, tags=["completions"])
def chat_completions() -> ResponseReturnValue:
    return _chat(json_body())


def _chat(body: dict) -> ResponseReturnValue:
    """``/agents/chat/completions``: the agent named in the body; OpenAI's shapes with
    ``"openai-compatible": true``."""
    if body.get("agent_id") is None:
        raise ArgumentError("`agent_id` is required.")  # RAGFlow's wording
    agent_id = field(body, "agent_id", str)
    if flag(body.get("openai-compatible"), "openai-compatible"):
        return openai_reply(agent_id, body)
    return _complete(agent_id, body)


class _LaneRoute(NamedTuple):
    """A route :class:`CompletionLane` answers: ``POST`` to a path ``path`` matches (its
    group, where it has one: the agent id), that Flask serves by ``endpoint``, with the
    JSON body ``fields`` (:func:`~api.openapi.plain_fields` of the view's schema) describes."""

    path: re.Pattern
    endpoint: str
    fields: tuple[dict[str, frozenset], tuple[str, ...]] | None
    #: Body keys the view reads as flags, checked before the lane takes a request.
    flags: tuple[str, ...]
    #: The request's environ -> its tenant, or the auth error (the token check of the
    #: blueprint's ``before_request`` hook).
    auth: Callable[[dict], str]
    #: ``(agent id or None, body, environ)`` -> the view's reply, run under an app context
    #: where ``flask.g.tenant_id`` is the tenant, as the view finds it.
    answer: Callable[[str | None, dict, dict], ResponseReturnValue]
    #: The blueprint's hooks the lane stands in for (``before_request``, ``after_request``):
    #: a hook of the route not listed here keeps the route Flask's.
    hooks: tuple[Callable, ...] = (require_api_token,)
    #: ``(reply, environ, agent id)`` -> the reply as the blueprint's ``after_request``
    #: hooks leave it, run on every reply (errors too), as Flask runs them.
    finish: Callable[[Response, dict, str | None], Response] | None = None


def _lane_routes() -> tuple[_LaneRoute, ...]:
    # The embed blueprint uses this module's replies: imported once both modules are.
    from api.blueprints import embed

    return (
        _LaneRoute(
            re.compile(r"/api/v1/agents/([^/]+)/completions"),
            "completions.agent_completions",
            plain_fields(CompletionBody),
            ("stream", "return_trace"),  # what _complete reads as flags
            authenticate,
            lambda agent_id, body, _: _complete(agent_id, body),
        ),
        _LaneRoute(
            re.compile(r"/api/v1/agents/chat/completions"),  # ragflow-sdk's since 0.26
            "completions.chat_completions",
            plain_fields(ChatCompletionBody),
            ("stream", "return_trace", "openai-compatible"),
            authenticate,
            lambda _, body, __: _chat(body),
        ),
        _LaneRoute(
            re.compile(r"/api/v1/agents_openai/([^/]+)/chat/completions"),
            "openai_compat.chat_completions",
            plain_fields(OpenAIChatBody),
            (),  # openai_reply answers a bad flag itself, in OpenAI's shape
            authenticate,
            lambda agent_id, body, _: openai_reply(agent_id, body),
            (require_api_token, openai_error_shape),
            lambda reply, _, __: openai_error_shape(reply),
        ),
        _LaneRoute(
            re.compile(r"/api/v1/agentbots/([^/]+)/completions"),  # the embed page's
            "embed.bot.bot_completions",
            plain_fields(embed.BotCompletionBody),
            ("stream",),
            embed.embed_tenant,
            lambda agent_id, body, environ: embed.bot_complete(agent_id, body, bearer_token(environ)),
            (embed.require_embed_token, embed.allow_listed_origins),
            embed.with_listed_origins,
        ),
    )


class CompletionLane:
    """Completions answered in front of Flask: the WSGI app :func:`api.create_app` serves
    (``app.wsgi_app``), streamed or blocking, for ``POST`` to
    ``/api/v1/agents/<agent_id>/completions``, ``/api/v1/agents/chat/completions``,
    ``/api/v1/agents_openai/<agent_id>/chat/completions`` and the embed page's
    ``/api/v1/agentbots/<agent_id>/completions`` (:func:`_lane_routes`).

    A completion is the API's busiest request, and Flask's part of one (the request
    context pushed and popped, the route matched, the view's hooks and schema check
    dispatched) was about a quarter of a blocking one's CPU time (bench/http.py's intake
    turn). Before the lane took them, the other routes cost more than an
    /agents/<id>/completions one it answered (bench/routes.py): /agents/chat/completions
    1.06-1.08x, OpenAI's 1.09-1.11x, the embed page's 1.16-1.20x.
    Here it runs the same steps as the view, in the same order and through the
    same functions: the blueprint's token check (:func:`~api.auth.authenticate`, the token
    then the rate limit; :func:`api.blueprints.embed.embed_tenant`), then the view's own
    reply (:func:`_complete`, :func:`_chat`, :func:`openai_reply`,
    :func:`api.blueprints.embed.bot_complete`), under an app context (which gives the
    request's database connection back at its end, as Flask's does: a streamed turn runs
    in a thread of its own) whose ``g.tenant_id`` is the tenant, as the check sets it for
    the view; an error is answered by :func:`~api.http.error_reply`, as the app's error
    handler answers it; and what the blueprint's ``after_request`` hooks do is done to
    every reply (OpenAI's error object; the embed page's CORS), as Flask runs them.

    It stands aside for a route (its requests go to Flask) unless, at its first request,
    Flask would run nothing more for it than it does: the route's view, and of hooks only
    those of its blueprints it stands in for (:meth:`_flask_adds_nothing`). It takes only
    requests it reads exactly as Flask would: a JSON body of a given length within
    ``MAX_CONTENT_LENGTH`` that parses (:func:`~api.http.parse_json_object`), that the
    route's schema accepts as it is (:func:`~api.openapi.fits`) and whose flags the view
    reads as such (``stream``, ``return_trace``...). Everything else (a chunked or bad
    body, another route or method) goes to Flask untouched, its body handed on as read,
    before anything that counts (a rate limit) has happened.
    """

    def __init__(self, app: Flask, wsgi_app: Any):
        self.app = app
        self.wsgi_app = wsgi_app
        self._routes = _lane_routes()
        # Paths of a route's shape without its variable part (/agents/chat/completions
        # for /agents/<agent_id>/completions) win in Flask's matching: never that route's.
        self._other_routes = frozenset(
            rule.rule
            for rule in app.url_map.iter_rules()
            if not rule.arguments and any(r.path.groups and r.path.fullmatch(rule.rule) for r in self._routes)
        )
        self._on: tuple[_LaneRoute, ...] | None = None  # the routes it serves, known at the first request

    def __call__(self, environ: dict, start_response: Any) -> Any:
        if self._on is None:
            self._on = tuple(route for route in self._routes if self._flask_adds_nothing(route))
            if self._on:
                self.app._got_first_request = True  # noqa: SLF001 - Flask's own flag: hooks can no longer be added
        taken = self._take(environ) if self._on else None
        if taken is None:
            return self.wsgi_app(environ, start_response)
        route, agent_id, body = taken
        with self.app.app_context():
            try:
                g.tenant_id = route.auth(environ)  # as the blueprint's token check sets it
                reply = self.app.make_response(route.answer(agent_id, body, environ))
            except Exception as exc:  # noqa: BLE001 - answered as the app's error handler does
                reply = error_reply(exc)
            if route.finish is not None:
                reply = self._finish(route, reply, environ, agent_id)
            return reply(environ, start_response)

    @staticmethod
    def _finish(route: _LaneRoute, reply: Response, environ: dict, agent_id: str | None) -> Response:
        """``reply`` as the route's ``after_request`` hooks leave it. As Flask does: a hook
        that fails (the embed page's CORS reads the agent's origins from the database) is
        logged and answered as an internal error (500), on which the hooks run once more
        (a failure then is logged, and that reply sent as it is)."""
        try:
            return route.finish(reply, environ, agent_id)
        except Exception as exc:  # noqa: BLE001 - answered as Flask's handle_exception does
            log.exception("the after_request step of %s failed", route.endpoint)
            reply = error_reply(InternalServerError(original_exception=exc))
        try:
            return route.finish(reply, environ, agent_id)
        except Exception:  # noqa: BLE001 - Flask logs it and sends the error's reply
            log.exception("the after_request step of %s failed on an error reply", route.endpoint)
            return reply

    def _flask_adds_nothing(self, route: _LaneRoute) -> bool:
        """Whether Flask would run, for ``route``, only what :meth:`__call__` runs too; logs
        why not otherwise."""
        app = self.app
        adapter = app.url_map.bind("localhost")
        try:
            endpoint, _ = adapter.match(route.path.pattern.replace("([^/]+)", "x"), method="POST")
        except HTTPException:
            endpoint = None
        # The route's blueprint and those it is nested in: "embed.bot", "embed".
        parts = route.endpoint.split(".")[:-1]
        scopes = (None, *(".".join(parts[:i]) for i in range(len(parts), 0, -1)))
        hooks = {
            "before_request": app.before_request_funcs,
            "after_request": app.after_request_funcs,
            "teardown_request": app.teardown_request_funcs,
            "url_value_preprocessor": app.url_value_preprocessors,
        }
        extra = [
            name
            for name, funcs in hooks.items()
            for scope in scopes
            for func in funcs.get(scope, ())
            if not (scope is not None and name in ("before_request", "after_request") and func in route.hooks)
        ]
        if endpoint != route.endpoint or extra or route.fields is None:
            log.warning(
                "%s goes through Flask: %s",
                route.endpoint,
                f"hooks {extra}" if extra else f"the route is {endpoint!r}" if route.fields else "schema",
            )
            return False
        return True

    def _take(self, environ: dict) -> tuple[_LaneRoute, str | None, dict] | None:
        """``(route, agent id, body)`` of a request this answers; else ``None``, the body
        (if read) put back for Flask."""
        if environ.get("REQUEST_METHOD") != "POST" or environ.get("CONTENT_TYPE") != "application/json":
            return None
        path = environ.get("PATH_INFO") or ""
        for route in self._on:
            match = route.path.fullmatch(path)
            if match is not None and not (route.path.groups and path in self._other_routes):
                break
        else:
            return None
        length = environ.get("CONTENT_LENGTH")
        if not length or not length.isdigit() or not length.isascii() or "HTTP_TRANSFER_ENCODING" in environ:
            return None
        size = int(length)
        limit = self.app.config.get("MAX_CONTENT_LENGTH")
        if limit is not None and size > limit:
            return None
        raw = environ["wsgi.input"].read(size) if size else b""
        try:
            body = parse_json_object(raw) if len(raw) == size else None
            if body is not None and fits(route.fields, body):
                for name in route.flags:
                    flag(body.get(name), name)
                return route, wsgi_text(match.group(1)) if route.path.groups else None, body
        except ArgumentError:  # Flask's view says so
            pass
        environ["wsgi.input"] = io.BytesIO(raw)  # for Flask, as it came
        return None
