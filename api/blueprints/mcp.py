"""``/api/v1/mcp/servers``: the tenant's MCP servers (RAGFlow's routes and shapes)."""

from __future__ import annotations

from flask import Blueprint, current_app, request
from flask.typing import ResponseReturnValue
from pydantic import Field

from api.auth import require_api_token
from api.http import json_body, ok, order_args, page_args, tenant_id
from api.openapi import Body, spec
from api.services import mcp_servers

bp = Blueprint("mcp", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


def _settings() -> dict:
    return current_app.config.get("SETTINGS") or {}


class McpServerBody(Body):
    """An MCP server of the tenant (RAGFlow's /mcp/servers); its tools are listed and stored."""

    name: str | None = None
    url: str | None = None
    server_type: str | None = Field(default=None, description="sse or streamable-http")
    headers: dict | None = None
    description: str | None = None
    timeout: float | int | str | None = None
    variables: dict | None = None


@bp.get("/mcp/servers")
def list_servers() -> ResponseReturnValue:
    page, page_size = page_args()
    orderby, desc = order_args(mcp_servers.ORDER_FIELDS, "create_time")
    rows, total = mcp_servers.list_servers(
        tenant_id(), page, page_size, orderby, desc, request.args.get("keywords", "")
    )
    return ok({"mcp_servers": [mcp_servers.server_json(r) for r in rows], "total": total})


@bp.post("/mcp/servers")
@spec.validate(json=McpServerBody, tags=["mcp"])
def create_server() -> ResponseReturnValue:
    row = mcp_servers.create_server(tenant_id(), json_body(), _settings())
    return ok(mcp_servers.server_json(row))


@bp.get("/mcp/servers/<mcp_id>")
def get_server(mcp_id: str) -> ResponseReturnValue:
    return ok(mcp_servers.server_json(mcp_servers.get_server(tenant_id(), mcp_id)))


@bp.put("/mcp/servers/<mcp_id>")
@spec.validate(json=McpServerBody, tags=["mcp"])
def update_server(mcp_id: str) -> ResponseReturnValue:
    row = mcp_servers.update_server(tenant_id(), mcp_id, json_body(), _settings())
    return ok(mcp_servers.server_json(row))


@bp.delete("/mcp/servers/<mcp_id>")
def delete_server(mcp_id: str) -> ResponseReturnValue:
    mcp_servers.delete_server(tenant_id(), mcp_id)
    return ok(True)


@bp.post("/mcp/servers/<mcp_id>/test")
@spec.validate(json=McpServerBody, tags=["mcp"])
def test_server(mcp_id: str) -> ResponseReturnValue:
    return ok(mcp_servers.test_server(json_body(), _settings()))
