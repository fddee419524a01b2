"""``/api/v1/tasks/<task_id>/cancel``: stop a running turn, whichever process runs it."""

from __future__ import annotations

from flask import Blueprint
from flask.typing import ResponseReturnValue

from api.auth import require_api_token
from api.http import ok, tenant_id
from api.services.turns import turn_service

bp = Blueprint("tasks", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


@bp.post("/tasks/<task_id>/cancel")
def cancel_task(task_id: str) -> ResponseReturnValue:
    result = turn_service().request_cancel(tenant_id(), task_id)
    message = "cancel requested" if result["cancelled"] else "the task is not running; nothing to cancel"
    return ok(result, message=message)
