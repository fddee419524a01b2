"""What RAGFlow's tools (``agent/tools``) share: a component that is also an Agent tool.

A tool type declares its **inputs** (``ToolParam.tool_inputs``: name → JSON-schema
type, description, default, required, enum) — what the model fills in when an Agent
calls it, and what the component reads from its own params when it runs on the
canvas. A param holding a bare reference (``"sys.query"``,
``"YahooFinance:Q@report"``, as RAGFlow's editor writes them) or text with
``{references}`` is resolved first, as RAGFlow's ``get_input`` does.

Settings: ``tools.<name>.<key>`` in ``service_conf.yaml``, or
``AGENTCANVAS_TOOLS_<NAME>_<KEY>`` in the environment (``base_url``, ``api_key``,
``timeout_seconds``, ``max_response_bytes``, ``allow_hosts``; the environment
wins). The host application may hand the whole ``tools`` section in
``canvas.services["tools"]``.

Web tools call their service through :mod:`agent.net` (the guarded client Invoke
uses: address rules, no redirects, a size cap, the turn's deadline and cancel). API
keys go in request headers or parameters only: never in outputs, ``inputs`` of events,
errors or logs.

:func:`formalize` writes search results as RAGFlow's ``formalized_content`` (its
``kb_prompt`` layout), the text an LLM reads.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from typing import Any, ClassVar

from agent import net
from agent.component.base import ComponentBase, ComponentParamBase
from agent.errors import ComponentError
from agent.refs import Ref, find_refs, parse_ref
from agent.settings import load_settings
from agent.stream import LazyText

log = logging.getLogger("agentcanvas.tools")

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
# Key placeholders RAGFlow's templates ship with: not a key.
_PLACEHOLDER = re.compile(r"\s|^your[_ ]", re.IGNORECASE)


def tool_settings(services: dict, name: str) -> dict:
    """``tools.<name>`` merged with the environment's flat ``tools.<name>_<key>``."""
    section = services.get("tools")
    if section is None:
        section = load_settings().get("tools") or {}
    nested = section.get(name) if isinstance(section.get(name), dict) else {}
    flat = {k[len(name) + 1 :]: v for k, v in section.items() if k.startswith(f"{name}_")}
    return {**nested, **flat}


class ToolParam(ComponentParamBase):
    """Params of a tool. Subclasses set :attr:`tool_inputs`; each input is a param too,
    defaulting to its ``default``."""

    tool_inputs: ClassVar[dict[str, dict]] = {}

    def __init__(self) -> None:
        super().__init__()
        for name, spec in self.tool_inputs.items():
            setattr(self, name, copy.deepcopy(spec.get("default")))
        self.api_key: Any = ""

    def check_positive_int(self, name: str, maximum: int | None = None) -> None:
        value = getattr(self, name)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
            setattr(self, name, value)
        self.check_nonnegative_int(name, maximum)
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value!r}")


class ToolComponent(ComponentBase):
    """A component that is also an Agent tool (see the module docstring).

    Class attributes:
        tool_name: the function name RAGFlow gives the model (``tavily_search``).
        tool_description: what the model reads about it.
        settings_name: its section under ``tools`` (``tavily``).
        default_base_url: the service's URL when none is configured.
    """

    tool_name: ClassVar[str] = ""
    tool_description: ClassVar[str] = ""
    settings_name: ClassVar[str] = ""
    default_base_url: ClassVar[str] = ""

    # -- as a tool ----------------------------------------------------------------------
    def tool_meta(self) -> dict:
        properties, required = {}, []
        for name, spec in self._param.tool_inputs.items():
            prop = {k: spec[k] for k in ("type", "description", "enum", "items") if k in spec}
            properties[name] = prop
            if spec.get("required"):
                required.append(name)
        return {
            "description": self._param.description or self.tool_description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        }

    # -- inputs -------------------------------------------------------------------------
    def references(self) -> list[Ref]:
        refs = super().references()
        for name in self._param.tool_inputs:
            ref = self._bare_ref(getattr(self._param, name, None))
            if ref is not None:
                refs.append(ref)
        return refs

    def _bare_ref(self, value: Any) -> Ref | None:
        """``value`` as a bare reference, if it is one. A text like ``me@example.com``
        is a reference only when it names a component of the canvas."""
        if not isinstance(value, str) or find_refs(value):
            return None
        ref = parse_ref(value)
        if ref is None or (ref.scope == "cpn" and ref.name not in self._canvas.components):
            return None
        return ref

    def tool_arguments(self, given: dict) -> dict:
        """The inputs for one run: what the caller (an Agent's model) gave, else the
        params, with references resolved."""
        out = {}
        for name in self._param.tool_inputs:
            if name in given and given[name] is not None:
                out[name] = given[name]
                continue
            value = getattr(self._param, name, None)
            ref = self._bare_ref(value)
            if ref is not None:
                value = self.get_value(ref)
            elif isinstance(value, str) and find_refs(value):
                value = self.render(value)
            if isinstance(value, LazyText):
                value = value.text
            out[name] = value
        return out

    def _invoke(self, **kwargs: Any) -> None:
        arguments = self.tool_arguments(kwargs)
        self.inputs_seen = dict(arguments)
        self.run_tool(**arguments)

    def run_tool(self, **arguments: Any) -> None:
        """Do the work and set the outputs (a subclass's one method)."""
        raise NotImplementedError

    def tool_result(self) -> str | None:
        """What an Agent's model reads back: ``formalized_content`` for a search (as
        RAGFlow returns it), else ``None`` (the Agent sends ``content`` or the outputs)."""
        text = self.outputs.get("formalized_content")
        return text if isinstance(text, str) else None

    # -- settings and calls -------------------------------------------------------------
    def settings(self) -> dict:
        return tool_settings(self._canvas.services, self.settings_name)

    def api_key(self, required: bool = True) -> str:
        """The key from the params (if the author put a real one there), else from the
        settings; a missing one fails naming the settings to set."""
        key = self._param.api_key
        if not isinstance(key, str) or not key.strip() or _PLACEHOLDER.search(key.strip()):
            key = self.settings().get("api_key")
        key = "" if key is None else str(key).strip()
        if not key and required:
            env = f"AGENTCANVAS_TOOLS_{self.settings_name.upper()}_API_KEY"
            raise self.fail(
                f"no API key: set tools.{self.settings_name}.api_key in service_conf.yaml or {env}",
                retryable=False,
            )
        return key

    def base_url(self) -> str:
        return str(self.settings().get("base_url") or self.default_base_url).rstrip("/")

    def call_json(
        self,
        method: str,
        path: str,
        *,
        query: dict | None = None,
        body: Any = None,
        headers: dict | None = None,
        base_url: str | None = None,
    ) -> Any:
        """One call to the service, its JSON answer parsed; an error status, a refused
        destination or a broken answer fails the component with a clear message."""
        settings = self.settings()
        timeout = float(settings.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)
        cap = int(settings.get("max_response_bytes") or DEFAULT_MAX_RESPONSE_BYTES)
        try:
            allow = net.AllowList(
                settings.get("allow_hosts") or [], f"tools.{self.settings_name}.allow_hosts"
            )
        except ValueError as e:
            raise self.fail(str(e), retryable=False) from None
        url = (base_url or self.base_url()) + path
        data = None
        sent = {"Accept": "application/json", "User-Agent": "agentcanvas-tools", **(headers or {})}
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            sent["Content-Type"] = "application/json"
        where = f"{self.component_name} ({net.split_url(url)[1]})"
        log.info("%s: %s %s", self.id, method, where)
        try:
            response = net.request(
                method,
                url,
                query={k: str(v) for k, v in (query or {}).items() if v is not None},
                headers=sent,
                body=data,
                deadline=self._canvas.deadline.within(timeout, f"tools.{self.settings_name}.timeout_seconds"),
                allow=allow,
                max_bytes=cap,
            )
        except (net.DestinationRefused, net.RedirectRefused, net.ResponseTooLarge) as e:
            raise self.fail(str(e), retryable=False) from None
        except OSError as e:
            raise self.fail(f"{where} could not be reached: {e}") from None
        except ValueError as e:
            raise self.fail(f"the URL of {where} is malformed: {e}", retryable=False) from None
        try:
            answer = json.loads(response.text()) if response.body else None
        except ValueError:
            answer = None
            if response.status < 400:
                raise self.fail(
                    f"{where} answered {response.status} with something that is not JSON"
                ) from None
        if response.status >= 400:
            raise self.fail(
                f"{where} answered {response.status} {response.reason}: {_error_text(answer)}",
                retryable=response.status in (408, 429) or response.status >= 500,
            )
        return answer


def _error_text(answer: Any) -> str:
    """The service's own words for an error (the first text under a key such as
    ``error``, ``message`` or ``description``, at any depth), short."""
    found = _error_words(answer)
    if found:
        return found[:300]
    return "(no message)" if answer is None else str(answer)[:300]


def _error_words(value: Any, depth: int = 0) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, dict) or depth > 4:
        return ""
    for key in ("description", "message", "error", "detail", "info", "errors"):
        if key in value:
            found = _error_words(value[key], depth + 1)
            if found:
                return found
    for nested in value.values():
        found = _error_words(nested, depth + 1) if isinstance(nested, dict) else ""
        if found:
            return found
    return ""


def formalize(chunks: list[dict]) -> str:
    """Results as RAGFlow's ``formalized_content``: per result an ``ID``, its title and
    URL, then its content (``kb_prompt``'s layout)."""
    parts = []
    for i, chunk in enumerate(chunks):
        text = f"\nID: {i}"
        for label, key in (("Title", "title"), ("URL", "url")):
            value = chunk.get(key)
            if value:
                text += f"\n├── {label}: " + re.sub(r"\n+", " ", str(value))
        text += "\n└── Content:\n" + str(chunk.get("content") or "")
        parts.append(text)
    return "\n".join(parts)


def results_output(component: ComponentBase, chunks: list[dict], raw: list) -> str:
    """Set ``formalized_content`` and ``json`` (RAGFlow's search tool outputs) and
    return the text the model reads. Results without content are left out, as RAGFlow
    does; content is cut at 10,000 characters."""
    kept = []
    for chunk in chunks:
        content = re.sub(
            r"!?\[[a-z]+\]\(data:image/png;base64,[ 0-9A-Za-z/_=+-]+\)", "", chunk.get("content") or ""
        )
        if content:
            kept.append({**chunk, "content": content[:10000]})
    text = formalize(kept)
    component.set_output("formalized_content", text)
    component.set_output("json", raw)
    return text


def require_text(component: ComponentBase, name: str, value: Any) -> str:
    """An input that must be non-empty text (a model may send a number)."""
    if value is None or value == "":
        return ""
    if isinstance(value, (dict, list)):
        raise ComponentError(
            f"{component.id}: {name} must be text, got {type(value).__name__}", retryable=False
        )
    return str(value)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (the layout of RAGFlow's ``DataFrame.to_markdown``)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join(":---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        text = "; ".join(map(str, value))
    elif isinstance(value, dict):
        text = json.dumps(value, ensure_ascii=False, default=str)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")
