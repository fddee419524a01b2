"""``/api/v1/agents/<id>/webhook``: run an agent whose Begin is in webhook mode, and its
run log. The webhook itself takes no API token: the Begin's own security params
authenticate the caller (see :mod:`api.services.webhooks`)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from api.auth import require_api_token
from api.http import arg_flag, ok, tenant_id
from api.services import webhooks
from api.services.turns import turn_service

bp = Blueprint("webhook", __name__, url_prefix="/api/v1")

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@bp.route("/agents/<agent_id>/webhook", methods=METHODS)
def webhook(agent_id: str) -> ResponseReturnValue:
    limit = 10 * 1024 * 1024
    length = request.content_length
    # Never read more than the largest body a webhook may take (the Begin's own, smaller
    # limit is checked by the service).
    body = request.get_data(cache=False) if length is None or length <= limit else b""
    call = webhooks.WebhookCall(
        method=request.method,
        headers={k.lower(): v for k, v in request.headers.items()},
        query=request.args.to_dict(),
        content_type=(request.mimetype or ""),
        body=body,
        remote_addr=request.remote_addr or "",
        content_length=length,
    )
    status, answer, kind = webhooks.trigger(turn_service(), agent_id, call, current_app._get_current_object())
    if kind == "application/json":
        resp = jsonify(answer) if answer is not None else Response("", mimetype="application/json")
    else:
        resp = Response(answer, mimetype=kind)
    resp.status_code = status
    return resp


@bp.get("/agents/<agent_id>/webhook/logs")
def webhook_logs(agent_id: str) -> ResponseReturnValue:
    require_api_token()
    if arg_flag("recent", False):
        return ok(webhooks.recent_runs(tenant_id(), agent_id))
    since = request.args.get("since_ts", type=float)
    return ok(webhooks.logs(tenant_id(), agent_id, since, request.args.get("webhook_id")))
