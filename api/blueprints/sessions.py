"""``/api/v1/agents/<id>/sessions``: sessions and their conversation variables."""

from __future__ import annotations

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from api.auth import require_api_token
from api.blueprints.agents import ListQuery
from api.errors import ArgumentError, NotFound
from api.http import (
    arg_flag,
    field,
    flag,
    json_body,
    ok,
    order_args,
    page_args,
    tenant_id,
    transcript_page_args,
)
from api.openapi import Body, Query, spec
from api.services import sessions, variables
from api.services.turns import turn_service

bp = Blueprint("sessions", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


class SessionBody(Body):
    name: str | None = None
    user_id: str | None = None


class SessionListQuery(ListQuery):
    id: str | None = None
    user_id: str | None = None
    dsl: str | None = None
    messages: str | None = None


class SessionQuery(Query):
    dsl: str | None = None
    messages_page: str | None = None
    messages_page_size: str | None = None


class SessionIds(Body):
    ids: list[str] | None = None
    delete_all: bool | str | int | None = None


class VariableValue(Body):
    """``{"value": ...}``, checked against the variable's declared type."""

    value: object = None


@bp.post("/agents/<agent_id>/sessions")
@spec.validate(json=SessionBody, tags=["sessions"])
def create_session(agent_id: str) -> ResponseReturnValue:
    body = json_body(required=False)
    name = field(body, "name", str, default="", max_length=255)
    user_id = field(body, "user_id", str, default="", max_length=255)
    # As RAGFlow: ``release`` in the body or the query runs the latest published version.
    release = flag(body["release"] if "release" in body else request.args.get("release"), "release")
    row, prologue = turn_service().create_session(
        tenant_id(), agent_id, name=name, user_id=user_id, release=release
    )
    message = [{"role": "assistant", "content": prologue}] if prologue else []
    return ok(sessions.session_json(row, message))


@bp.get("/agents/<agent_id>/sessions")
@spec.validate(query=SessionListQuery, tags=["sessions"])
def list_sessions(agent_id: str) -> ResponseReturnValue:
    page, page_size = page_args()
    orderby, desc = order_args(sessions.ORDER_FIELDS, "update_time")
    with_dsl = arg_flag("dsl", False)
    rows, total = sessions.list_sessions(
        tenant_id(),
        agent_id,
        page,
        page_size,
        orderby,
        desc,
        request.args.get("id"),
        request.args.get("user_id"),
        with_dsl,
    )
    messages = sessions.messages_of([r.id for r in rows]) if arg_flag("messages", False) else {}
    return ok([sessions.session_json(r, messages.get(r.id), with_dsl) for r in rows], total=total)


@bp.get("/agents/<agent_id>/sessions/<session_id>")
@spec.validate(query=SessionQuery, tags=["sessions"])
def get_session(agent_id: str, session_id: str) -> ResponseReturnValue:
    with_dsl = arg_flag("dsl", False)
    page, page_size = transcript_page_args()
    row = sessions.get_session(tenant_id(), agent_id, session_id, with_dsl)
    messages, total = sessions.transcript(row.id, page, page_size)
    paging = {"messages_page": page, "messages_page_size": page_size, "messages_total": total}
    return ok(sessions.session_json(row, messages, with_dsl, paging))


@bp.delete("/agents/<agent_id>/sessions")
@spec.validate(json=SessionIds, tags=["sessions"])
def delete_sessions(agent_id: str) -> ResponseReturnValue:
    body = json_body()
    delete_all = flag(body.get("delete_all"), "delete_all")
    deleted, errors = sessions.delete_sessions(tenant_id(), agent_id, body.get("ids"), delete_all)
    if errors and not deleted:
        raise NotFound("; ".join(errors), {"success_count": 0, "errors": errors})
    if errors:
        return ok(
            {"success_count": deleted, "errors": errors},
            message=f"deleted {deleted} session(s); {len(errors)} error(s)",
        )
    return ok({"success_count": deleted})


@bp.delete("/agents/<agent_id>/sessions/<session_id>")
def delete_session(agent_id: str, session_id: str) -> ResponseReturnValue:
    deleted, errors = sessions.delete_sessions(tenant_id(), agent_id, [session_id])
    if errors:
        raise NotFound(errors[0])
    return ok(True)


@bp.get("/agents/<agent_id>/sessions/<session_id>/variables")
def list_variables(agent_id: str, session_id: str) -> ResponseReturnValue:
    row = sessions.get_session(tenant_id(), agent_id, session_id, with_dsl=True)
    return ok(variables.list_variables(sessions.state_of(row)))


@bp.put("/agents/<agent_id>/sessions/<session_id>/variables/<name>")
@spec.validate(json=VariableValue, tags=["sessions"])
def put_variable(agent_id: str, session_id: str, name: str) -> ResponseReturnValue:
    body = json_body()
    if "value" not in body:
        raise ArgumentError("the body needs 'value': {\"value\": <new value>}")
    saved = turn_service().save_variable(tenant_id(), agent_id, session_id, name, body["value"])
    return ok(saved)
