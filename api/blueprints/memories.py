"""``/api/v1/memories`` and ``/api/v1/messages``: RAGFlow's long-term Memory (see
:mod:`api.services.memories`)."""

from __future__ import annotations

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from api.auth import require_api_token
from api.errors import ArgumentError
from api.http import arg_int, json_body, ok, page_args, tenant_id
from api.openapi import Body, spec
from api.services import memories
from api.services.turns import turn_service

bp = Blueprint("memories", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


def _ids(name: str) -> list[str]:
    """A list query parameter: repeated (``?memory_id=a&memory_id=b``) or comma-separated."""
    values = [v for raw in request.args.getlist(name) for v in raw.split(",") if v.strip()]
    return [v.strip() for v in values]


def _number(name: str, default: float) -> float:
    raw = request.args.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ArgumentError(f"query parameter {name!r} must be a number, got {raw!r}") from None
    if not 0 <= value <= 1:
        raise ArgumentError(f"query parameter {name!r} must be from 0 to 1, got {raw!r}")
    return value


class MemoryBody(Body):
    """A RAGFlow Memory (``name`` is required to create one)."""

    name: str | None = None
    avatar: str | None = None
    description: str | None = None
    llm_id: str | None = None
    embd_id: str | None = None
    memory_type: list | str | None = None
    memory_size: int | str | None = None
    forgetting_policy: str | None = None
    temperature: float | str | None = None
    permissions: str | None = None
    system_prompt: str | None = None
    user_prompt: str | None = None


class MessageBody(Body):
    """One exchange saved to Memories: ``memory_id`` (one id or a list), ``user_input``, ``agent_response``."""

    memory_id: list | str | None = None
    agent_id: str | None = None
    session_id: str | None = None
    user_input: str | None = None
    agent_response: str | None = None
    user_id: str | None = None


@bp.post("/memories")
@spec.validate(json=MemoryBody, tags=["memories"])
def create_memory() -> ResponseReturnValue:
    return ok(memories.memory_json(memories.create_memory(tenant_id(), json_body())))


@bp.get("/memories")
def list_memory() -> ResponseReturnValue:
    page, page_size = page_args(50)
    return ok(
        memories.list_memories(
            tenant_id(), page, page_size, request.args.get("keywords"), request.args.get("memory_type")
        )
    )


@bp.get("/memories/<memory_id>/config")
def memory_config(memory_id: str) -> ResponseReturnValue:
    return ok(memories.memory_json(memories.get_memory(tenant_id(), memory_id)))


@bp.put("/memories/<memory_id>")
@spec.validate(json=MemoryBody, tags=["memories"])
def update_memory(memory_id: str) -> ResponseReturnValue:
    return ok(memories.memory_json(memories.update_memory(tenant_id(), memory_id, json_body())))


@bp.delete("/memories/<memory_id>")
def delete_memory(memory_id: str) -> ResponseReturnValue:
    memories.delete_memory(tenant_id(), memory_id)
    return ok(True)


@bp.get("/memories/<memory_id>")
def memory_messages(memory_id: str) -> ResponseReturnValue:
    page, page_size = page_args(50)
    return ok(memories.memory_messages(tenant_id(), memory_id, page, page_size, request.args.get("keywords")))


@bp.post("/messages")
@spec.validate(json=MessageBody, tags=["memories"])
def add_message() -> ResponseReturnValue:
    message = memories.add_message(tenant_id(), json_body(), turn_service().extractor)
    return ok(None, message=message)


@bp.get("/messages/search")
def search_message() -> ResponseReturnValue:
    found = memories.search_messages(
        tenant_id(),
        _ids("memory_id"),
        request.args.get("query") or "",
        arg_int("top_n", 5, maximum=100),
        _number("similarity_threshold", 0.2),
        request.args.get("agent_id"),
        request.args.get("session_id"),
        request.args.get("user_id"),
    )
    return ok(found)


@bp.get("/messages")
def recent_messages() -> ResponseReturnValue:
    found = memories.recent_messages(
        tenant_id(),
        _ids("memory_id"),
        request.args.get("agent_id"),
        request.args.get("session_id"),
        arg_int("limit", 10, maximum=100),
    )
    return ok(found)


@bp.get("/messages/<memory_id>:<message_id>/content")
def message_content(memory_id: str, message_id: str) -> ResponseReturnValue:
    return ok(memories.message_content(tenant_id(), memory_id, message_id))


@bp.delete("/messages/<memory_id>:<message_id>")
def forget_message(memory_id: str, message_id: str) -> ResponseReturnValue:
    memories.forget_message(tenant_id(), memory_id, message_id)
    return ok(True)


@bp.put("/messages/<memory_id>:<message_id>")
def update_message(memory_id: str, message_id: str) -> ResponseReturnValue:
    body = json_body()
    if "status" not in body:
        raise ArgumentError("the body needs 'status': true or false")
    memories.set_message_status(tenant_id(), memory_id, message_id, body["status"])
    return ok(True)
