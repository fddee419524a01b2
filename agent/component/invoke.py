"""Invoke: call an HTTP endpoint (RAGFlow's "HTTP request" component).

Params (RAGFlow's):
    url: the endpoint, with ``{references}``; ``http://`` is assumed when no scheme is
        given. Only ``http`` and ``https``.
    method: ``get``, ``post`` or ``put``.
    headers: a JSON object (as text, as RAGFlow's editor writes it, or as an object) whose
        string values may hold ``{references}`` — ``{"Authorization": "Bearer {env.key}"}``.
    variables: ``[{"key", "ref"?, "value"?}]``: the query parameters (GET) or the body
        (POST/PUT). ``ref`` is a bare reference whose raw value is sent; without it
        ``value`` is sent, rendered when it holds references.
    datatype: ``json`` (the body is a JSON object; a value that is JSON text of an object
        or a list is sent as that structure, as RAGFlow does) or ``formdata`` (an
        url-encoded form).
    timeout: seconds; the configured ``timeout_seconds`` caps it.
    clean_html: return the text of an HTML answer without tags, scripts and styles.
    proxy: accepted and ignored: requests never go through a proxy, which would defeat
        the address check below.

Outputs: ``result`` — the answer parsed from JSON when the server says it is JSON
(``application/json`` or ``+json``), else its text — and ``status_code``. An answer
with an error status (4xx, 5xx) is an output like any other, so the flow can branch on
``status_code``; what fails the component is a refused destination, a redirect, a
timeout, an answer over the size cap, or a connection error.

Safety (docs/design.md §11): the call goes through :mod:`agent.net`, which checks the
destination (special-purpose ranges refused unless allow-listed, one lookup, the
checked address is the one called), follows no redirect and caps the answer's size;
connecting, sending and reading together obey the turn's deadline and cancel
narrowed to ``timeout``. Settings come from ``canvas.services["invoke"]`` or else
``agent.settings.load_settings()["invoke"]``: ``allow_hosts`` (host names or
networks in CIDR notation), ``timeout_seconds``, ``max_response_bytes``. Header
values may be secrets: they are never put in outputs, events, errors or logs.
"""

from __future__ import annotations

import json
import logging
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlencode

from agent import net
from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.errors import ComponentTimeout
from agent.refs import Ref, parse_ref, require_ref, to_text
from agent.settings import load_settings
from agent.stream import LazyText

log = logging.getLogger("agentcanvas.invoke")

DEFAULT_SETTINGS = {"allow_hosts": [], "timeout_seconds": 30, "max_response_bytes": 1024 * 1024}


class _TextOfHTML(HTMLParser):
    _SKIP = {"script", "style", "noscript", "template", "head"}
    _BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "table"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self._skipping:
            self._skipping -= 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """The visible text of an HTML page, one block per line."""
    parser = _TextOfHTML()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def _header_templates(headers: Any) -> dict[str, str]:
    """The ``headers`` param as ``{name: template}``; ``ValueError`` naming the problem.

    Values are never quoted in messages: they may be secrets.
    """
    if headers in (None, ""):
        return {}
    if isinstance(headers, str):
        try:
            headers = json.loads(headers)
        except ValueError as e:
            raise ValueError(
                f'headers is not valid JSON ({e.msg}); write a JSON object like {{"Authorization": "Bearer {{env.key}}"}}'
            ) from None
    if not isinstance(headers, dict):
        raise ValueError(f"headers must be a JSON object of name: value, got {type(headers).__name__}")
    out = {}
    for name, value in headers.items():
        if not name or not all(33 <= ord(c) <= 126 and c != ":" for c in name):
            raise ValueError(f"header name {name!r} is not a valid HTTP header name")
        if isinstance(value, (dict, list)) or value is None:
            raise ValueError(f"header {name!r} must have a text value")
        out[name] = value if isinstance(value, str) else to_text(value)
    return out


class InvokeParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.url = ""
        self.method = "get"
        self.headers: Any = ""
        self.variables: list[dict] = []
        self.datatype = "json"
        self.timeout: float = 60
        self.clean_html = False
        self.proxy: Any = None

    def check(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ValueError("url is empty; give the endpoint to call, e.g. 'https://api.example.com/items'")
        if "{" not in self.url:
            net.split_url(self.url)  # a fixed URL can be checked now; a templated one when it runs
        if not isinstance(self.method, str) or self.method.lower() not in ("get", "post", "put"):
            raise ValueError(f"method {self.method!r} is not one of 'get', 'post', 'put'")
        self.method = self.method.lower()
        if not isinstance(self.datatype, str) or self.datatype.lower() not in ("json", "formdata"):
            raise ValueError(f"datatype {self.datatype!r} is not one of 'json', 'formdata'")
        self.datatype = self.datatype.lower()
        self.check_number("timeout", minimum=0)
        if self.timeout <= 0:
            raise ValueError(f"timeout must be more than 0 seconds, got {self.timeout!r}")
        if not isinstance(self.clean_html, bool):
            raise ValueError(f"clean_html must be true or false, got {self.clean_html!r}")
        self.headers = _header_templates(self.headers)
        self.check_list("variables")
        for n, var in enumerate(self.variables, 1):
            if not isinstance(var, dict) or not isinstance(var.get("key"), str) or not var["key"]:
                raise ValueError(
                    f"variables item {n} needs a 'key' (the parameter name) and a 'ref' or 'value'"
                )
            if var.get("ref"):
                require_ref(var["ref"], f"variables item {n} ({var['key']!r}): ref", "'begin@city'")


@register
class Invoke(ComponentBase):
    """See the module docstring."""

    component_name = "Invoke"
    param_class = InvokeParam

    def references(self) -> list[Ref]:
        refs = super().references()
        refs.extend(parse_ref(var["ref"]) for var in self._param.variables if var.get("ref"))
        return refs

    def _settings(self) -> dict:
        configured = self._canvas.services.get("invoke")
        if configured is None:
            configured = load_settings().get("invoke") or {}
        return {**DEFAULT_SETTINGS, **configured}

    def _arguments(self) -> dict[str, Any]:
        args = {}
        for var in self._param.variables:
            if var.get("ref"):
                value = self.get_value(var["ref"])
                value = value.text if isinstance(value, LazyText) else value
            else:
                value = self.render_value(var.get("value"))
            if self._param.datatype == "json" and isinstance(value, str):
                try:
                    parsed = json.loads(value)
                except ValueError:
                    parsed = None
                if isinstance(parsed, (dict, list)):
                    value = parsed
            args[var["key"]] = value
        return args

    def _headers(self, has_body: bool) -> dict[str, str]:
        headers = {"User-Agent": "agentcanvas-invoke", "Accept": "*/*"}
        if has_body:
            kind = (
                "application/json" if self._param.datatype == "json" else "application/x-www-form-urlencoded"
            )
            headers["Content-Type"] = kind
        for name, template in self._param.headers.items():
            value = self.render(template)
            if "\r" in value or "\n" in value:
                raise self.fail(f"header {name!r} holds a line break after rendering; remove it")
            for existing in [k for k in headers if k.lower() == name.lower()]:
                del headers[existing]
            headers[name] = value
        return headers

    def _invoke(self, **kwargs: Any) -> None:
        settings = self._settings()
        try:
            allow = net.AllowList(settings.get("allow_hosts") or [])
        except ValueError as e:
            raise self.fail(str(e), retryable=False) from None
        timeout = min(float(self._param.timeout), float(settings["timeout_seconds"]))
        cap = int(settings["max_response_bytes"])

        url = self.render(self._param.url)
        try:
            scheme, host, port, _ = net.split_url(url)
        except ValueError as e:
            raise self.fail(str(e), retryable=False) from None
        method = self._param.method.upper()
        args = self._arguments()
        self.inputs_seen = {"url": url, "method": method, "variables": args}
        body, query = None, None
        if method == "GET":
            query = {k: to_text(v) for k, v in args.items()}
        elif self._param.datatype == "json":
            body = json.dumps(args, ensure_ascii=False, default=str).encode("utf-8")
        else:
            body = urlencode({k: to_text(v) for k, v in args.items()}).encode("utf-8")
        headers = self._headers(body is not None)

        log.info("%s: %s %s://%s:%s", self.id, method, scheme, host, port)
        try:
            response = net.request(
                method,
                url,
                query=query,
                headers=headers,
                body=body,
                deadline=self._canvas.deadline.within(timeout, "timeout"),
                allow=allow,
                max_bytes=cap,
            )
        except ComponentTimeout:
            raise self.fail(f"{host!r} did not answer within {timeout:g} s (timeout)") from None
        except (net.DestinationRefused, net.RedirectRefused, net.ResponseTooLarge) as e:
            raise self.fail(str(e), retryable=False) from None
        except OSError as e:  # a connection error, or a name that did not resolve: may pass
            raise self.fail(str(e)) from None

        text = response.text()
        result: Any = text
        content_type = response.content_type
        if content_type == "application/json" or content_type.endswith("+json"):
            try:
                result = json.loads(text)
            except ValueError:
                result = text
        elif self._param.clean_html:
            result = html_to_text(text)
        self.set_output("result", result)
        self.set_output("status_code", response.status)
