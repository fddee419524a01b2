"""MCP servers of a tenant (RAGFlow's ``/mcp/servers``), and the lookup a turn's Agent
uses to reach them.

Saving a server (create, update) connects to it with the ``mcp`` SDK and stores the
tools it lists (``variables["tools"]``, by name), as RAGFlow does; a server that cannot
be reached, or whose URL the Invoke address rules refuse (``invoke.allow_hosts``), is
refused with a clear 400. Header values may be tokens: replies show them masked, and
an update that sends a masked value back keeps the stored one.
"""

from __future__ import annotations

import json
from typing import Any

from peewee import IntegrityError

from agent import mcp, net
from agent.deadline import Deadline
from agent.errors import ComponentError
from api.db import McpServer, now_ms, write_transaction
from api.errors import ArgumentError, Conflict, NotFound

ORDER_FIELDS = ("create_time", "update_time", "name")
MASK = "********"
DEFAULT_TIMEOUT = 10.0


def _allow(settings: dict) -> net.AllowList:
    return net.AllowList((settings.get("invoke") or {}).get("allow_hosts") or [], "invoke.allow_hosts")


def _json_object(value: Any, name: str) -> dict:
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ArgumentError(f"{name!r} is text but not a JSON object") from None
    if not isinstance(value, dict):
        raise ArgumentError(f"{name!r} must be a JSON object, got {type(value).__name__}")
    return value


def _check_fields(body: dict, current: McpServer | None) -> dict:
    name = body.get("name", current.name if current else None)
    if not isinstance(name, str) or not name.strip() or len(name.encode("utf-8")) > 255:
        raise ArgumentError("'name' must be non-empty text of at most 255 bytes")
    url = body.get("url", current.url if current else None)
    if not isinstance(url, str) or not url.strip():
        raise ArgumentError("'url' must be the MCP server's http(s) URL")
    server_type = body.get("server_type", current.server_type if current else None)
    if server_type not in mcp.SERVER_TYPES:
        raise ArgumentError(
            f"'server_type' must be one of {', '.join(map(repr, mcp.SERVER_TYPES))}, got {server_type!r}"
        )
    headers = _json_object(body["headers"], "headers") if "headers" in body else None
    stored = json.loads(current.headers) if current else {}
    if headers is None:
        headers = stored
    else:
        # A masked value sent back (what GET showed) keeps the stored one.
        headers = {k: (stored.get(k, "") if v == MASK else v) for k, v in headers.items()}
    for key, value in headers.items():
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise ArgumentError(f"header {key!r} must be text on one line")
    description = body.get("description", current.description if current else "")
    if not isinstance(description, str):
        raise ArgumentError("'description' must be text")
    timeout = body.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 60:
        raise ArgumentError("'timeout' must be a number of seconds between 0 and 60")
    variables = _json_object(
        body.get("variables", json.loads(current.variables) if current else {}), "variables"
    )
    variables.pop("tools", None)
    return {
        "name": name.strip(),
        "url": url.strip(),
        "server_type": server_type,
        "headers": headers,
        "description": description,
        "variables": variables,
        "timeout": float(timeout),
    }


def fetch_tools(fields: dict, settings: dict) -> list[dict]:
    """The tools the server lists; ``ArgumentError`` saying why it cannot be reached."""
    server = mcp.MCPServer(
        url=fields["url"], server_type=fields["server_type"], headers=fields["headers"], name=fields["name"]
    )
    try:
        return mcp.list_tools(
            server, deadline=Deadline(fields["timeout"], limit="timeout"), allow=_allow(settings)
        )
    except ComponentError as e:
        raise ArgumentError(str(e)) from None


def _tool_map(tools: list[dict]) -> dict:
    return {
        t["name"]: {"name": t["name"], "description": t["description"], "inputSchema": t["input_schema"]}
        for t in tools
    }


def _stored(fields: dict, tools: list[dict]) -> dict:
    """The columns of a server checked by :func:`_check_fields`, with the tools it listed."""
    return {
        "name": fields["name"],
        "url": fields["url"],
        "server_type": fields["server_type"],
        "description": fields["description"],
        "headers": json.dumps(fields["headers"]),
        "variables": json.dumps({**fields["variables"], "tools": _tool_map(tools)}),
    }


def create_server(tenant_id: str, body: dict, settings: dict) -> McpServer:
    fields = _check_fields(body, None)
    tools = fetch_tools(fields, settings)
    now = now_ms()
    try:
        with write_transaction():
            if (
                McpServer.select()
                .where((McpServer.tenant_id == tenant_id) & (McpServer.name == fields["name"]))
                .exists()
            ):
                raise Conflict(f"an MCP server named {fields['name']!r} already exists")
            return McpServer.create(
                tenant_id=tenant_id,
                **_stored(fields, tools),
                create_time=now,
                update_time=now,
            )
    except IntegrityError:
        raise Conflict(f"an MCP server named {fields['name']!r} already exists") from None


def get_server(tenant_id: str, mcp_id: str) -> McpServer:
    row = McpServer.get_or_none((McpServer.id == mcp_id) & (McpServer.tenant_id == tenant_id))
    if row is None:
        raise NotFound(f"MCP server {mcp_id!r} not found")
    return row


def update_server(tenant_id: str, mcp_id: str, body: dict, settings: dict) -> McpServer:
    current = get_server(tenant_id, mcp_id)
    fields = _check_fields(body, current)
    tools = fetch_tools(fields, settings)
    try:
        with write_transaction():
            taken = McpServer.select().where(
                (McpServer.tenant_id == tenant_id)
                & (McpServer.name == fields["name"])
                & (McpServer.id != mcp_id)
            )
            if taken.exists():
                raise Conflict(f"an MCP server named {fields['name']!r} already exists")
            McpServer.update(
                **_stored(fields, tools),
                update_time=now_ms(),
            ).where((McpServer.id == mcp_id) & (McpServer.tenant_id == tenant_id)).execute()
    except IntegrityError:
        raise Conflict(f"an MCP server named {fields['name']!r} already exists") from None
    return get_server(tenant_id, mcp_id)


def delete_server(tenant_id: str, mcp_id: str) -> None:
    get_server(tenant_id, mcp_id)
    McpServer.delete().where((McpServer.id == mcp_id) & (McpServer.tenant_id == tenant_id)).execute()


def list_servers(
    tenant_id: str, page: int, page_size: int, orderby: str, desc: bool, keywords: str = ""
) -> tuple[list[McpServer], int]:
    query = McpServer.select().where(McpServer.tenant_id == tenant_id)
    if keywords:
        query = query.where(McpServer.name.contains(keywords))
    total = query.count()
    rows = list(query.order_by(*McpServer.listing_order(orderby, desc)).paginate(page, page_size))
    return rows, total


def test_server(body: dict, settings: dict) -> list[dict]:
    """Connect with the given settings and list the tools (nothing is saved)."""
    fields = _check_fields({"name": "test", **body}, None)
    return [{**t, "enabled": True} for t in _tool_map(fetch_tools(fields, settings)).values()]


def server_json(row: McpServer) -> dict:
    """RAGFlow's shape; header values masked."""
    return {
        "id": row.id,
        "name": row.name,
        "tenant_id": row.tenant_id,
        "url": row.url,
        "server_type": row.server_type,
        "description": row.description,
        "headers": {k: MASK for k in json.loads(row.headers or "{}")},
        "variables": json.loads(row.variables or "{}"),
        "create_time": row.create_time,
        "update_time": row.update_time,
    }


class TenantServers:
    """What a turn's Agent may reach: the tenant's servers by id (``canvas.services["mcp_servers"]``)."""

    def __init__(self, tenant_id: str):
        self.tenant_id = tenant_id

    def __call__(self, mcp_id: str) -> dict | None:
        row = McpServer.get_or_none((McpServer.id == mcp_id) & (McpServer.tenant_id == self.tenant_id))
        if row is None:
            return None
        return {
            "name": row.name,
            "url": row.url,
            "server_type": row.server_type,
            "headers": json.loads(row.headers or "{}"),
            "tools": json.loads(row.variables or "{}").get("tools") or {},
        }
