"""``/api/v1/agents``: agents, their versions and releases, templates, component forms."""

from __future__ import annotations

from flask import Blueprint, current_app, request
from flask.typing import ResponseReturnValue

from api.auth import require_api_token
from api.blueprints.files import file_settings
from api.config import canvas_limits
from api.errors import ArgumentError
from api.http import arg_flag, flag, json_body, ok, order_args, page_args, tenant_id
from api.openapi import Body, Query, spec
from api.services import agents

bp = Blueprint("agents", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


class AgentBody(Body):
    """An agent: ``dsl`` may be a RAGFlow export (``{"dsl": {...}, ...}``) or a bare DSL."""

    title: str | None = None
    dsl: dict | None = None
    description: str | None = None
    release: bool | str | int | None = None


class AgentUpdate(AgentBody):
    rate_limits: dict[str, str] | None = None


class ListQuery(Query):
    """Paging and ordering of a list (``desc`` and flags accept true/false/True/False/1/0)."""

    page: str | None = None
    page_size: str | None = None
    orderby: str | None = None
    desc: str | None = None


class AgentListQuery(ListQuery):
    id: str | None = None
    title: str | None = None
    dsl: str | None = None


@bp.post("/agents")
@spec.validate(json=AgentBody, tags=["agents"])
def create_agent() -> ResponseReturnValue:
    body = json_body()
    # RAGFlow's wording first: clients and RAGFlow's own tests look for it.
    if body.get("dsl") is None:
        raise ArgumentError("No DSL data in request: 'dsl' is required")
    if body.get("title") is None:
        raise ArgumentError("No title in request: 'title' is required")
    agent = agents.create_agent(
        tenant_id(),
        body.get("title"),
        body.get("dsl"),
        body.get("description"),
        canvas_limits(current_app.config),
        release=flag(body.get("release"), "release"),
    )
    return ok(agents.agent_json(agent))


@bp.get("/agents")
@spec.validate(query=AgentListQuery, tags=["agents"])
def list_agents() -> ResponseReturnValue:
    page, page_size = page_args()
    orderby, desc = order_args(agents.ORDER_FIELDS, "update_time")
    rows, total = agents.list_agents(
        tenant_id(), page, page_size, orderby, desc, request.args.get("id"), request.args.get("title")
    )
    with_dsl = arg_flag("dsl", True)
    listed = [agents.agent_json(a, with_dsl) for a in rows]
    if current_app.config["AGENT_LIST_SHAPE"] == "list":
        return ok(listed, total=total)  # ragflow-sdk 0.22 iterates ``data``
    return ok({"canvas": listed, "total": total})


@bp.get("/agents/templates")
def list_templates() -> ResponseReturnValue:
    """The bundled sample agents, as RAGFlow lists its templates."""
    return ok(agents.templates())


@bp.get("/agents/<agent_id>/components/<component_id>/input-form")
def component_input_form(agent_id: str, component_id: str) -> ResponseReturnValue:
    """The form a Begin or UserFillUp of the agent's draft declares (``{}`` for other components)."""
    return ok(agents.component_form(tenant_id(), agent_id, component_id, canvas_limits(current_app.config)))


@bp.get("/agents/<agent_id>")
def get_agent(agent_id: str) -> ResponseReturnValue:
    return ok(agents.agent_json(agents.get_agent(tenant_id(), agent_id)))


@bp.put("/agents/<agent_id>")
@spec.validate(json=AgentUpdate, tags=["agents"])
def update_agent(agent_id: str) -> ResponseReturnValue:
    body = json_body()
    release = flag(body.get("release"), "release")
    agent = agents.update_agent(tenant_id(), agent_id, body, canvas_limits(current_app.config), release)
    return ok(agents.agent_json(agent))


@bp.delete("/agents/<agent_id>")
def delete_agent(agent_id: str) -> ResponseReturnValue:
    agents.delete_agent(tenant_id(), agent_id, file_settings())
    return ok(True)


@bp.get("/agents/<agent_id>/versions")
def list_versions(agent_id: str) -> ResponseReturnValue:
    return ok([agents.version_json(v) for v in agents.list_versions(tenant_id(), agent_id)])


@bp.get("/agents/<agent_id>/versions/<version_id>")
def get_version(agent_id: str, version_id: str) -> ResponseReturnValue:
    return ok(agents.version_json(agents.get_version(tenant_id(), agent_id, version_id), with_dsl=True))
