"""A real MCP server for tests, made with the official ``mcp`` SDK (``MCPServer``),
served by uvicorn on 127.0.0.1 in threads: streamable HTTP at ``<url>/mcp`` and SSE
at ``<sse_url>/sse``.

    with MCPTestServer() as server:
        server.streamable_url, server.sse_url
        server.calls                    # [(tool, arguments)] in order
        server.headers                  # the HTTP headers of each request, in order

Tools: ``add(a, b)``, ``shout(text)``, ``slow(seconds)`` (sleeps), ``broken()`` (fails).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer


class MCPTestServer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        server = MCPServer("agentcanvas-test")
        calls = self.calls

        @server.tool()
        def add(a: int, b: int) -> int:
            """Add two whole numbers."""
            calls.append(("add", {"a": a, "b": b}))
            return a + b

        @server.tool()
        def shout(text: str) -> str:
            """Repeat the text in capitals."""
            calls.append(("shout", {"text": text}))
            return text.upper() + "!"

        @server.tool()
        async def slow(seconds: float) -> str:
            """Wait that many seconds, then answer."""
            calls.append(("slow", {"seconds": seconds}))
            await anyio.sleep(seconds)
            return "finally"

        @server.tool()
        def broken() -> str:
            """Always fails."""
            calls.append(("broken", {}))
            raise RuntimeError("the broken tool broke")

        self.headers: list[dict[str, str]] = []
        self._apps = {
            "streamable": self._recording(server.streamable_http_app()),
            "sse": self._recording(server.sse_app()),
        }
        self._servers: list[uvicorn.Server] = []
        self.streamable_url = ""
        self.sse_url = ""

    def _recording(self, app: Any) -> Any:
        """``app`` noting the headers of every HTTP request in :attr:`headers`."""
        seen = self.headers

        async def recorded(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]})
            await app(scope, receive, send)

        return recorded

    def __enter__(self) -> MCPTestServer:
        ports = {}
        for name, app in self._apps.items():
            config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
            server = uvicorn.Server(config)
            threading.Thread(target=server.run, daemon=True).start()
            deadline = time.monotonic() + 20
            while not server.started:
                if time.monotonic() > deadline:
                    raise RuntimeError("the MCP test server did not start")
                time.sleep(0.02)
            ports[name] = server.servers[0].sockets[0].getsockname()[1]
            self._servers.append(server)
        self.streamable_url = f"http://127.0.0.1:{ports['streamable']}/mcp"
        self.sse_url = f"http://127.0.0.1:{ports['sse']}/sse"
        return self

    def __exit__(self, *exc: Any) -> None:
        for server in self._servers:
            server.should_exit = True
