"""MCP servers reached with the official ``mcp`` Python SDK (streamable HTTP and SSE).

    server = MCPServer(url="https://tools.example/mcp", server_type="streamable-http", headers={...})
    tools = list_tools(server, deadline=d, allow=allow)   # [{"name", "description", "input_schema"}]
    text = call_tool(server, "add", {"a": 1}, deadline=d, allow=allow)

Each call opens its own connection (the SDK's transports are asyncio; a call runs on a
private event loop in a helper thread, under :func:`agent.deadline.call`): a cancel or
the deadline cancels the call's task and the turn goes on at once.

The server's URL follows the Invoke address rules (:func:`agent.net.check_destination`
with the caller's allow-list) before anything is sent; the SDK follows no redirect
off the server's origin. Header values (tokens) are never logged or put in errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from agent import deadline as deadlines
from agent import net
from agent.errors import ComponentError

log = logging.getLogger("agentcanvas.mcp")

SERVER_TYPES = ("sse", "streamable-http")


class MCPError(ComponentError):
    """An MCP server could not be reached, refused, or its tool failed."""


@dataclass
class MCPServer:
    url: str
    server_type: str
    headers: dict[str, str] = field(default_factory=dict)
    name: str = ""


def check_server(server: MCPServer, allow: net.AllowList) -> None:
    """``ValueError`` for a bad type or URL; ``DestinationRefused`` for a refused address."""
    if server.server_type not in SERVER_TYPES:
        raise ValueError(
            f"server_type {server.server_type!r} is not one of {', '.join(map(repr, SERVER_TYPES))}"
        )
    _, host, port, _ = net.split_url(server.url)
    if not server.url.strip().lower().startswith(("http://", "https://")):
        raise ValueError(f"url {server.url!r} must start with http:// or https://")
    net.check_destination(host, port, allow)


def list_tools(server: MCPServer, *, deadline: deadlines.Deadline, allow: net.AllowList) -> list[dict]:
    """The server's tools as ``{"name", "description", "input_schema"}``."""

    async def work(session: Any) -> list[dict]:
        result = await session.list_tools()
        return [
            {"name": t.name, "description": t.description or "", "input_schema": dict(t.input_schema or {})}
            for t in result.tools
        ]

    return _run(server, work, deadline, allow)


def call_tool(
    server: MCPServer, name: str, arguments: dict, *, deadline: deadlines.Deadline, allow: net.AllowList
) -> str:
    """The tool's result as text (its text parts; structured content as JSON).

    Raises:
        MCPError: the tool reported an error, or the server failed.
    """

    async def work(session: Any) -> Any:
        return await session.call_tool(name, arguments or {})

    result = _run(server, work, deadline, allow)
    text = result_text(result)
    if getattr(result, "is_error", False):
        raise MCPError(f"MCP tool {name!r} failed: {text or 'no message'}", retryable=False)
    return text


def result_text(result: Any) -> str:
    parts = []
    for item in getattr(result, "content", None) or []:
        if getattr(item, "type", "") == "text":
            parts.append(item.text)
        else:
            parts.append(f"[{getattr(item, 'type', 'content')}]")
    if not parts and getattr(result, "structured_content", None) is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


def _run(server: MCPServer, work: Any, deadline: deadlines.Deadline, allow: net.AllowList) -> Any:
    try:
        check_server(server, allow)
    except net.DestinationRefused as e:
        raise MCPError(str(e), retryable=False) from None
    except ValueError as e:
        raise MCPError(f"MCP server {server.name or server.url!r}: {e}", retryable=False) from None
    except OSError as e:
        raise MCPError(f"MCP server {server.name or server.url!r} could not be reached: {e}") from None
    loop = asyncio.new_event_loop()
    running: dict[str, asyncio.Task] = {}

    async def main() -> Any:
        running["task"] = asyncio.current_task()
        remaining = deadline.remaining()
        return await asyncio.wait_for(
            _session(server, work), None if remaining == float("inf") else remaining + 1
        )

    def blocking() -> Any:
        try:
            return loop.run_until_complete(main())
        finally:
            loop.close()

    def abandon() -> None:
        task = running.get("task")
        if task is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    where = server.name or net.split_url(server.url)[1]
    log.info("MCP %s call to %s", server.server_type, where)
    try:
        return deadlines.call(deadline, blocking, abandon)
    except ComponentError:
        raise
    except (asyncio.TimeoutError, TimeoutError):
        raise MCPError(f"MCP server {where!r} did not answer in time") from None
    except BaseException as e:  # noqa: BLE001 - the SDK raises groups and its own types
        if isinstance(e, (KeyboardInterrupt, SystemExit)) or type(e).__module__ == "agent.errors":
            raise
        raise MCPError(f"MCP server {where!r} failed: {_describe(e)}") from None


async def _session(server: MCPServer, work: Any) -> Any:
    from mcp.client.session import ClientSession

    async with _transport(server) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            return await work(session)


@contextlib.asynccontextmanager
async def _transport(server: MCPServer) -> AsyncIterator[Any]:
    headers = {str(k): str(v) for k, v in (server.headers or {}).items()}
    if server.server_type == "sse":
        from mcp.client.sse import sse_client

        async with sse_client(server.url, headers=headers or None) as streams:
            yield streams
        return
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    # The SDK's own timeouts (30 s, 300 s for a held stream); the deadline bounds the call.
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as client:
        async with streamable_http_client(server.url, http_client=client) as streams:
            yield streams


def _describe(e: BaseException) -> str:
    """The innermost message of an exception group (anyio task groups wrap them)."""
    while getattr(e, "exceptions", None):  # BaseExceptionGroup (Python 3.11+, or anyio's backport)
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"[:500]
