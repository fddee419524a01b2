"""OpenAI Chat Completions over an agent: ``POST /api/v1/agents_openai/<id>/chat/completions``.

Also answers ``POST /api/v1/agents/chat/completions`` with ``"openai-compatible": true``
(``agent_id`` in the body): :mod:`api.blueprints.completions` calls :func:`openai_reply`.
An OpenAI client reaches the first with ``base_url=<server>/api/v1/agents_openai/<id>``.

Request: ``messages`` (required, non-empty; the **last user message** is the query:
the session keeps its own history, earlier messages are not replayed), ``stream``
(default false), ``model`` (echoed), ``user``, ``stream_options.include_usage``, and
as extras ``metadata.id`` or ``session_id`` (continue that session; without one a new
session is made) and ``inputs`` (answers to a paused form, or Begin's form).

Reply: ``chat.completion`` (or ``chat.completion.chunk`` frames ending
``data: [DONE]``). ``id`` and the extra ``session_id`` are the session id (``id`` as
RAGFlow does), so a client continues with ``metadata: {"id": <id>}``. ``usage`` counts
tiktoken ``cl100k_base`` tokens of the query and of the answer. When a form waits, the
content is its tips text and the extra ``user_inputs`` holds
``{component_id, inputs: {field: definition}, tips}``; answer it with ``inputs``.
Errors keep RAGFlow's envelope and add OpenAI's ``error`` object; a turn that fails
mid-stream sends ``data: {"error": {...}}`` before ``[DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, jsonify
from flask.typing import ResponseReturnValue

from agent.errors import CanvasError
from agent.llm.tokens import count_tokens
from api.auth import require_api_token
from api.errors import ApiError, ArgumentError, envelope, reply_for, retry_headers, turn_failure_status
from api.http import field, flag, json_body, sse_response, tenant_id
from api.openapi import Body, spec
from api.services.turns import Turn, TurnRequest, TurnResult, turn_service

bp = Blueprint("openai_compat", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
}


class OpenAIChatBody(Body):
    """OpenAI's Chat Completions request; the last ``user`` message is the question. The
    session comes from ``metadata.id`` or ``session_id`` (else a new one is made)."""

    messages: list | None = None
    model: str | None = None
    stream: bool | str | int | None = None
    user: str | None = None
    stream_options: dict | None = None
    metadata: dict | None = None
    session_id: str | None = None
    inputs: dict | None = None


@bp.post("/agents_openai/<agent_id>/chat/completions")
@spec.validate(json=OpenAIChatBody, tags=["openai"])
def chat_completions(agent_id: str) -> ResponseReturnValue:
    return openai_reply(agent_id, json_body())


@bp.after_request
def openai_error_shape(response: Response) -> Response:
    """Errors raised before the view (auth, malformed JSON) get the ``error`` object too."""
    if response.status_code >= 400 and response.is_json:
        body = response.get_json(silent=True)
        if isinstance(body, dict) and "error" not in body:
            response.set_data(json.dumps(with_openai_error(body, response.status_code), ensure_ascii=False))
    return response


def with_openai_error(body: dict, status: int) -> dict:
    """RAGFlow's error envelope plus OpenAI's ``error`` object, which OpenAI clients read."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {**body, "error": {"message": body.get("message", ""), "type": kind, "code": body.get("code")}}


def openai_reply(agent_id: str, body: dict) -> ResponseReturnValue:
    """Run one turn for an OpenAI-shaped request and answer in OpenAI's shape."""
    try:
        req, stream, model, include_usage = _read_request(agent_id, body)
        turn = turn_service().start(req, inline=not stream)
    except (ApiError, CanvasError) as exc:
        reply, status = reply_for(exc)
        return jsonify(with_openai_error(reply, status)), status
    if stream:
        return sse_response(_chunks(turn, req.query, model, include_usage))
    return _completion(turn, req.query, model)


def _read_request(agent_id: str, body: dict) -> tuple[TurnRequest, bool, str, bool]:
    query = last_user_message(body.get("messages"))
    metadata = field(body, "metadata", dict, default={})
    from_metadata = metadata.get("id")
    if from_metadata is not None and not isinstance(from_metadata, str):
        raise ArgumentError(f"'metadata.id' must be a session id (text), got {from_metadata!r}")
    session_id = field(body, "session_id", str)
    if from_metadata and session_id and from_metadata != session_id:
        raise ArgumentError(
            f"'metadata.id' {from_metadata!r} and 'session_id' {session_id!r} name different sessions; "
            f"send one of them"
        )
    options = field(body, "stream_options", dict, default={})
    req = TurnRequest(
        tenant_id=tenant_id(),
        agent_id=agent_id,
        session_id=from_metadata or session_id or None,
        query=query,
        inputs=field(body, "inputs", dict),
        user_id=field(body, "user", str, default="", max_length=255),
        invoke_from="openai",
        # The latest release when there is one, else the draft; ``release`` as on /completions.
        release=flag(body.get("release"), "release") if "release" in body else None,
        trace=False,  # an OpenAI reply shows no node event
    )
    stream = flag(body.get("stream"), "stream", default=False)
    model = field(body, "model", str, default="", max_length=255) or agent_id
    return req, stream, model, flag(options.get("include_usage"), "stream_options.include_usage")


def last_user_message(messages: Any) -> str:
    """The text of the last ``user`` message; :class:`ArgumentError` names what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ArgumentError(
            '\'messages\' must be a non-empty list of messages like [{"role": "user", "content": "Hi"}]'
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ArgumentError(f"messages[{i}] must be an object with a 'role' and a 'content'")
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            return _text_of(messages[i].get("content"), i)
    raise ArgumentError("'messages' has no message with role 'user'; the last user message is the query")


def _text_of(content: Any, index: int) -> str:
    """A message's text: a string, or the ``text`` parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ArgumentError(
                    f"messages[{index}].content may hold only text parts "
                    f'({{"type": "text", "text": ...}}); this agent takes no images or audio'
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise ArgumentError(f"messages[{index}].content must be text or a list of text parts")


def _usage(query: str, answer: str) -> dict:
    prompt, completion = count_tokens(query), count_tokens(answer)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _form_of(result: TurnResult) -> dict | None:
    if result.status != "paused":
        return None
    data = result.final_event.get("data", {})
    return {
        "component_id": data.get("component_id"),
        "inputs": data.get("inputs") or {},
        "tips": data.get("tips") or "",
    }


def _join(*texts: str) -> str:
    return "\n\n".join(t for t in texts if t)


def _completion(turn: Turn, query: str, model: str) -> ResponseReturnValue:
    result = turn.wait()
    if result.status not in ("succeeded", "paused"):
        code, status = turn_failure_status(result.status, result.error_type)
        body = envelope(code, result.error or "the turn failed", result.final_event)
        return jsonify(with_openai_error(body, status)), status, retry_headers(status)
    form = _form_of(result)
    content = _join(result.answer, form["tips"]) if form else result.answer
    reply = {
        "id": turn.session_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "session_id": turn.session_id,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": _usage(query, content),
    }
    if form:
        reply["user_inputs"] = form
    reference = _reference_of(result)
    if reference:
        reply["choices"][0]["message"]["reference"] = reference
    return jsonify(reply), 200


def _reference_of(result: TurnResult) -> dict | None:
    """The cited chunks of a finished turn (``message_end``'s ``reference``), where RAGFlow
    puts them in OpenAI shapes: ``message.reference``, or the last chunk's ``delta.reference``."""
    if result.status != "succeeded":
        return None
    return (result.final_event.get("data") or {}).get("reference") or None


def _chunks(turn: Turn, query: str, model: str, include_usage: bool) -> Iterator[str]:
    """The turn as ``chat.completion.chunk`` frames; the end comes after the commit."""
    created = int(time.time())

    def chunk(delta: dict, finish: str | None = None, **extra: Any) -> str:
        payload = {
            "id": turn.session_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "session_id": turn.session_id,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return _frame(payload)

    yield chunk({"role": "assistant", "content": ""})
    parts: list[str] = []
    for event in turn.events():
        if event["event"] == "message":
            text = str(event["data"].get("content") or "")
            if text:
                parts.append(text)
                yield chunk({"content": text})
    # The events are read to their end (the commit is done): the result is set.
    turn.join()
    result = turn.result
    assert result is not None
    if result.status in ("succeeded", "paused"):
        form = _form_of(result)
        if form and form["tips"]:
            tips = ("\n\n" if parts else "") + form["tips"]
            parts.append(tips)
            yield chunk({"content": tips})
        reference = _reference_of(result)
        yield chunk(
            {"reference": reference} if reference else {}, "stop", **({"user_inputs": form} if form else {})
        )
        if include_usage:
            yield _frame(
                {
                    "id": turn.session_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "session_id": turn.session_id,
                    "choices": [],
                    "usage": _usage(query, "".join(parts)),
                }
            )
    else:
        code, status = turn_failure_status(result.status, result.error_type)
        body = envelope(code, result.error or "the turn failed", None)
        yield _frame({"error": with_openai_error(body, status)["error"]})
    yield _frame("[DONE]")


def _frame(payload: Any) -> str:
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, default=str)
    return f"data: {text}\n\n"
