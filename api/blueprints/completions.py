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

from collections.abc import Iterator

from flask import Blueprint, Response, jsonify
from flask.typing import ResponseReturnValue
from pydantic import Field

from api.auth import require_api_token
from api.blueprints.openai_compat import openai_reply
from api.errors import ArgumentError, envelope, retry_headers, turn_failure_status
from api.http import field, flag, json_body, ok, sse_frame, sse_response, tenant_id
from api.openapi import Body, spec
from api.services.turns import Turn, TurnRequest, blocking_event, turn_service

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


def blocking_reply(turn: Turn) -> tuple[Response, int]:
    """Wait for the committed end of the turn; ``data`` is its ending event."""
    result = turn.wait()
    event = blocking_event(result, turn.session_id)
    if result.status in ("succeeded", "paused"):
        return ok(event), 200
    code, status = turn_failure_status(result.status, result.error_type)
    reply = jsonify(envelope(code, result.error or "the turn failed", event))
    reply.headers.update(retry_headers(status))
    return reply, status


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
    """Read a RAGFlow completion body (``question``/``query``, ``session_id``, ``inputs``...)."""
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
    body = json_body()
    if body.get("agent_id") is None:
        raise ArgumentError("`agent_id` is required.")  # RAGFlow's wording
    agent_id = field(body, "agent_id", str)
    if flag(body.get("openai-compatible"), "openai-compatible"):
        return openai_reply(agent_id, body)
    return _complete(agent_id, body)
