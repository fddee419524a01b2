"""Agent: an LLM node that may call tools, in a bounded loop.

Params: everything :mod:`agent.component.llm` takes, plus ``tools`` — other
components used as tools, in RAGFlow's shape ``[{component_name, name, params}]`` —
and ``max_rounds`` (5): the most rounds of tool calls in one run. After that many
rounds the model is asked once more, with ``tool_choice: none``, for its answer; a
model that still answers with nothing but tool calls fails the node.

Tools are built when the canvas loads (a bad tool is a ``DSLError`` naming the
Agent and the tool). A tool gets the id ``<agent id>--><name>``. What the model
sees of a tool, and how a call runs:

* a component type that defines ``tool_meta() -> {"description", "parameters"}``
  (``parameters`` a JSON schema) describes itself; any other is offered with the
  spec's ``description`` (or its params' ``description``) and free-form arguments;
* the call's arguments are passed as keyword arguments to the tool's ``invoke()``;
* the result sent back to the model is what the tool's ``tool_result()`` gives, if it
  has one and it gives text (Retrieval: its knowledge blocks; a web search: its
  ``formalized_content``), else its ``content`` output, or else all its outputs as
  JSON. A tool that fails sends back ``error: <message>`` so the model can
  recover; every call is listed in the Agent's ``tool_calls`` output.

An Agent is itself usable as a tool (another Agent's): it takes ``user_prompt``,
``reasoning`` and ``context`` and answers with its ``content``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agent import mcp, net
from agent.component import component_class, register
from agent.component.base import ComponentBase, checked_param
from agent.component.llm import LLM, LLMParam
from agent.errors import Cancelled, ComponentError, DSLError, FormPause, LimitError
from agent.llm.client import ToolCall, tool_arguments
from agent.refs import to_text
from agent.settings import load_settings
from agent.stream import LazyText

MAX_ROUNDS_LIMIT = 50
# What a tool result may add to the conversation; longer results are cut.
MAX_TOOL_RESULT_CHARS = 32_000


class AgentParam(LLMParam):
    def __init__(self) -> None:
        super().__init__()
        self.tools: Any = []
        self.max_rounds: Any = 5
        self.mcp: Any = []

    def check(self) -> None:
        super().check()
        self.check_nonnegative_int("max_rounds", maximum=MAX_ROUNDS_LIMIT)
        if self.tools is None:
            self.tools = []
        self.check_list("tools")
        for i, spec in enumerate(self.tools):
            if not isinstance(spec, dict) or not isinstance(spec.get("component_name"), str):
                raise ValueError(f"tools[{i}] must be {{component_name, name, params}}, got {spec!r}")
            if not isinstance(spec.get("params", {}) or {}, dict):
                raise ValueError(f"tools[{i}] ({spec['component_name']!r}): params must be an object")
        self._check_mcp()

    def _check_mcp(self) -> None:
        """``mcp: [{mcp_id, tools}]``; an entry offering no tools is dropped with a warning."""
        if self.mcp in (None, ""):
            self.mcp = []
        self.check_list("mcp")
        kept = []
        for i, entry in enumerate(self.mcp):
            if not isinstance(entry, dict) or not isinstance(entry.get("mcp_id"), str) or not entry["mcp_id"]:
                raise ValueError(f"mcp[{i}] must be {{mcp_id, tools}}, got {entry!r}")
            if not entry.get("tools"):
                self.warn(
                    f"mcp[{i}] (server {entry['mcp_id']!r}) selects no tools; it offers the model nothing"
                )
                continue
            tools = entry["tools"]
            if isinstance(tools, list):
                tools = {str(t): {} for t in tools}
            if not isinstance(tools, dict) or not all(isinstance(m, dict) for m in tools.values()):
                raise ValueError(
                    f"mcp[{i}] tools must be an object of tool name: definition (or a list of names), got {tools!r}"
                )
            kept.append({**entry, "tools": tools})
        self.mcp = kept


@register
class Agent(LLM):
    component_name = "Agent"
    param_class = AgentParam

    def __init__(self, canvas: Any, cpn_id: str, param: AgentParam, entry: dict):
        super().__init__(canvas, cpn_id, param, entry)
        self._tools: dict[str, ComponentBase] = {}
        self._tool_specs: list[dict] = []
        for i, spec in enumerate(param.tools):
            self._add_tool(i, spec)
        # MCP tools: exposed name -> (mcp_id, the server's tool name, its definition).
        self._mcp_tools: dict[str, tuple[str, str, dict]] = {}
        for entry in param.mcp:
            for tool_name, meta in entry["tools"].items():
                name = re.sub(r"[^A-Za-z0-9_-]", "_", str(tool_name))[:60] or "mcp_tool"
                while name in self._tools or name in self._mcp_tools:
                    name = f"{name}_"
                self._mcp_tools[name] = (entry["mcp_id"], str(tool_name), meta)

    def _add_tool(self, i: int, spec: dict) -> None:
        kind = spec["component_name"]
        label = f"{self.id}: tools[{i}] ({spec.get('name') or kind!r})"
        cls = component_class(kind)
        if cls is None:
            raise DSLError(f"{label}: unknown component type {kind!r}")
        if cls.is_form or kind.lower() in ("begin", "message"):
            raise DSLError(f"{label}: a {kind} cannot be a tool; use a component that computes a result")
        params = spec.get("params") or {}
        param = checked_param(cls, params, label, self._canvas.warnings)
        name = re.sub(r"[^A-Za-z0-9_-]", "_", str(spec.get("name") or kind))[:60] or f"tool_{i}"
        if name in self._tools:
            name = f"{name}_{i}"
        tool = cls(
            self._canvas, f"{self.id}-->{name}", param, {"obj": {"component_name": kind, "params": params}}
        )
        meta = tool.tool_meta() if callable(getattr(tool, "tool_meta", None)) else {}
        description = (
            meta.get("description") or spec.get("description") or getattr(param, "description", "") or kind
        )
        parameters = meta.get("parameters") or {
            "type": "object",
            "properties": {},
            "additionalProperties": True,
        }
        self._tools[name] = tool
        self._tool_specs.append(
            {
                "type": "function",
                "function": {"name": name, "description": description, "parameters": parameters},
            }
        )

    # -- LLM hooks --------------------------------------------------------------------
    def cites_knowledge(self) -> bool:
        return super().cites_knowledge() or any(t.component_name == "Retrieval" for t in self._tools.values())

    def tool_specs(self) -> list[dict]:
        specs = list(self._tool_specs)
        for name, (mcp_id, tool_name, meta) in self._mcp_tools.items():
            if not meta.get("description") and not meta.get("inputSchema"):
                # The DSL names the tool only: describe it as the server listed it when saved.
                server = self._mcp_server(mcp_id)
                meta = ((server or {}).get("tools") or {}).get(tool_name) or meta
            schema = (
                meta.get("inputSchema") or meta.get("input_schema") or {"type": "object", "properties": {}}
            )
            specs.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": meta.get("description") or tool_name,
                        "parameters": schema,
                    },
                }
            )
        return specs

    def _mcp_server(self, mcp_id: str) -> dict | None:
        """The tenant's MCP server (``canvas.services["mcp_servers"]``), once per run."""
        cache = self.__dict__.setdefault("_mcp_seen", {})
        if mcp_id not in cache:
            lookup = self._canvas.services.get("mcp_servers")
            cache[mcp_id] = lookup(mcp_id) if callable(lookup) else None
        return cache[mcp_id]

    def _call_mcp(self, name: str, arguments: dict) -> str:
        mcp_id, tool_name, _ = self._mcp_tools[name]
        server = self._mcp_server(mcp_id)
        if server is None:
            raise self.fail(f"MCP server {mcp_id!r} is not one of this tenant's servers (/mcp/servers)")
        settings = self._canvas.services.get("invoke")
        if settings is None:
            settings = load_settings().get("invoke") or {}
        timeout = float(settings.get("timeout_seconds") or 30)
        return mcp.call_tool(
            mcp.MCPServer(
                url=server["url"],
                server_type=server["server_type"],
                # RAGFlow's custom_header of the completion request wins over the server's.
                headers={**server["headers"], **(self._canvas.services.get("custom_header") or {})},
                name=server["name"],
            ),
            tool_name,
            arguments,
            deadline=self._canvas.deadline.within(timeout, "invoke.timeout_seconds"),
            allow=net.AllowList(settings.get("allow_hosts") or [], "invoke.allow_hosts"),
        )

    def max_rounds(self) -> int:
        return int(self._param.max_rounds)

    def prompt_messages(self, kwargs: dict) -> list[dict]:
        if not kwargs.get("user_prompt"):
            return super().prompt_messages(kwargs)
        # Called as another Agent's tool: the caller's request replaces the prompts.
        parts = []
        if kwargs.get("context"):
            parts.append(f"Context:\n{to_text(kwargs['context'])}")
        if kwargs.get("reasoning"):
            parts.append(f"Why you are asked:\n{to_text(kwargs['reasoning'])}")
        task = to_text(kwargs["user_prompt"])
        return [{"role": "user", "content": "\n\n".join([*parts, f"Task:\n{task}"]) if parts else task}]

    def call_tool(self, call: ToolCall) -> str:
        record: dict[str, Any] = {"name": call.name, "arguments": call.arguments}
        self.outputs.setdefault("tool_calls", []).append(record)
        tool = self._tools.get(call.name)
        if tool is None and call.name in self._mcp_tools:
            try:
                result = self._call_mcp(call.name, tool_arguments(call))
            except (Cancelled, FormPause):
                raise
            except ComponentError as e:  # the model is told and may recover
                result = f"error: {e}"
        elif tool is None:
            names = [*self._tools, *self._mcp_tools]
            result = f"error: there is no tool {call.name!r}; the tools are {', '.join(names) or 'none'}"
        else:
            try:
                result = _run_tool(tool, tool_arguments(call))
            except (Cancelled, FormPause, LimitError):
                raise
            except Exception as e:  # noqa: BLE001 - the model is told and may recover
                result = f"error: {e}"
        if len(result) > MAX_TOOL_RESULT_CHARS:
            result = result[:MAX_TOOL_RESULT_CHARS] + " …(cut)"
        record["result"] = result
        return result

    # -- as a tool ----------------------------------------------------------------------
    def tool_meta(self) -> dict:
        return {
            "description": self._param.description or "An agent for a specific task; give it the task to do.",
            "parameters": {
                "type": "object",
                "properties": {
                    "user_prompt": {"type": "string", "description": "The task or question for this agent."},
                    "reasoning": {
                        "type": "string",
                        "description": "Why this agent is asked, what is expected.",
                    },
                    "context": {
                        "type": "string",
                        "description": "Everything it needs to know to do the task.",
                    },
                },
                "required": ["user_prompt"],
            },
        }


def _run_tool(tool: ComponentBase, arguments: dict) -> str:
    chunks = tool.invoke(**arguments)
    if chunks is not None:
        return "".join(chunks)
    outputs = tool.outputs
    if outputs.get("_ERROR"):
        return f"error: {outputs['_ERROR']}"
    own = tool.tool_result() if callable(getattr(tool, "tool_result", None)) else None
    if own is not None:
        return own
    content = outputs.get("content")
    if isinstance(content, LazyText):
        return content.text
    if content is not None:
        return to_text(content)
    shown = {
        k: (v.text if isinstance(v, LazyText) else v) for k, v in outputs.items() if not k.startswith("_")
    }
    return json.dumps(shown, ensure_ascii=False, default=str)
