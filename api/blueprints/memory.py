"""``/api/v1/agents/<id>/memory/<key>``: what an agent's nodes remember under a key.

A key is what a node's ``memory_key`` rendered to (e.g. the user id for
``{sys.user_id}``); it may contain ``/``. Another tenant's agent is not found (404).
"""

from __future__ import annotations

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from api.auth import require_api_token
from api.http import ok, tenant_id
from api.services import memory

bp = Blueprint("memory", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


@bp.get("/agents/<agent_id>/memory/<path:key>")
def list_memory(agent_id: str, key: str) -> ResponseReturnValue:
    return ok(memory.list_memory(tenant_id(), agent_id, key, request.args.get("node_id") or None))


@bp.delete("/agents/<agent_id>/memory/<path:key>")
def forget_memory(agent_id: str, key: str) -> ResponseReturnValue:
    forgotten = memory.forget(tenant_id(), agent_id, key)
    return ok(forgotten, message=f"forgot {forgotten['deleted']} message(s) under key {key!r}")
